// tgc report's page: a training log and a bench file parsed, and drawn as one self-contained
// HTML page (inline SVG, no script, nothing fetched). Every string from the input is escaped.
#include "tools/tgc/ReportPage.h"

#include "support/Error.h"
#include "support/Limits.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace tgc::report {

namespace {

std::string escapeHtml(llvm::StringRef text) {
  std::string out;
  for (char c : escapeForMessage(text)) {
    switch (c) {
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '&': out += "&amp;"; break;
    case '"': out += "&quot;"; break;
    default: out += c;
    }
  }
  return out;
}

const char *const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};


/// A line chart of `series` against the step, 5 ticks an axis; log-scaled values when `logY`
/// (points at or below 0 are left out there).
std::string lineChart(const std::string &title, const std::string &unit, std::vector<Series> series, bool logY) {
  // The legend goes under the plot, three names a row (up to 12 rows).
  constexpr size_t kLegendColumns = 3, kLegendRows = 12;
  size_t legendRows = series.size() > 1 ? std::min(kLegendRows, (series.size() + 2) / kLegendColumns) : 0;
  constexpr double W = 640, L = 64, R = 16, T = 12, B = 36;
  const double plotBottom = 232, H = plotBottom + 13 * double(legendRows) + (legendRows ? 6 : 0);
  if (logY)
    for (Series &s : series)
      s.points.erase(std::remove_if(s.points.begin(), s.points.end(), [](auto &p) { return !(p.second > 0); }),
                     s.points.end());
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series &s : series)
    for (auto [x, y] : s.points) {
      if (!std::isfinite(y))
        continue;
      double v = logY ? std::log10(y) : y;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, v), y1 = std::max(y1, v);
    }
  std::string svg = fmt::format("<figure><figcaption>{}</figcaption><svg viewBox=\"0 0 {} {}\" width=\"{}\" "
                                "height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
                                escapeHtml(title), W, H, W, H);
  if (!(x0 <= x1 && y0 <= y1))
    return svg + "<text x=\"20\" y=\"40\">no data</text></svg></figure>\n";
  if (x1 == x0)
    x1 = x0 + 1;
  if (y1 - y0 < 1e-12)
    y0 -= 0.5, y1 += 0.5;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double v) { return T + (1 - (v - y0) / (y1 - y0)) * (plotBottom - T - B); };
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#fafafa\" stroke=\"#ccc\"/>", L, T,
                     W - L - R, plotBottom - T - B);
  for (int i = 0; i <= 4; ++i) {
    double v = y0 + (y1 - y0) * i / 4, x = x0 + (x1 - x0) * i / 4;
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>", L, W - R, py(v),
                       py(v));
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{:.4g}</text>", L - 4,
                       py(v) + 4, logY ? std::pow(10, v) : v);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">{:.0f}</text>", px(x),
                       plotBottom - B + 14, x);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">step</text>", (L + W - R) / 2,
                     plotBottom - 8);
  svg += fmt::format("<text x=\"12\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 12 {})\" "
                     "text-anchor=\"middle\">{}</text>",
                     (T + plotBottom - B) / 2, (T + plotBottom - B) / 2, escapeHtml(unit));
  for (size_t k = 0; k < series.size(); ++k) {
    const Series &s = series[k];
    std::string path;
    for (auto [x, y] : s.points)
      if (std::isfinite(y))
        path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "" : " ", px(x), py(logY ? std::log10(y) : y));
    const char *color = kColors[k % std::size(kColors)];
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} points=\"{}\"/>", color,
                       s.dashed ? " stroke-dasharray=\"5,4\"" : "", path);
    if (legendRows && k < kLegendColumns * legendRows)
      svg += fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{}\">{}{}</text>",
                         L + 190 * double(k % kLegendColumns), plotBottom + 10 + 13 * double(k / kLegendColumns), color,
                         s.dashed ? "- - " : "&#8212; ", escapeHtml(s.name));
  }
  return svg + "</svg></figure>\n";
}

/// Bars of one measure per recipe.
std::string barChart(const std::string &title, const std::vector<std::pair<std::string, double>> &bars) {
  constexpr double W = 420, H = 40 + 28.0, Bar = 22;
  double most = 0;
  for (auto &[name, v] : bars)
    most = std::max(most, v);
  double height = H + Bar * bars.size();
  std::string svg = fmt::format("<figure><figcaption>{}</figcaption><svg viewBox=\"0 0 {} {}\" width=\"{}\" "
                                "height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\">",
                                escapeHtml(title), W, height, W, height);
  for (size_t k = 0; k < bars.size(); ++k) {
    double width = most > 0 ? bars[k].second / most * (W - 180) : 0, y = 16 + Bar * k;
    svg += fmt::format("<text x=\"4\" y=\"{:.0f}\" font-size=\"12\">{}</text><rect x=\"60\" y=\"{:.0f}\" "
                       "width=\"{:.1f}\" height=\"{}\" fill=\"{}\"/><text x=\"{:.1f}\" y=\"{:.0f}\" "
                       "font-size=\"12\">{:.4g}</text>",
                       y + 14, escapeHtml(bars[k].first), y, width, Bar - 6, kColors[k % std::size(kColors)],
                       66 + width, y + 14, bars[k].second);
  }
  return svg + "</svg></figure>\n";
}

llvm::Expected<llvm::json::Value> parseJson(llvm::StringRef text, llvm::StringRef path, size_t line) {
  if (findDeepNesting(text, kMaxJsonDepth))
    return fileError(path, "line {}: nested deeper than {} levels", line, kMaxJsonDepth);
  auto value = llvm::json::parse(text);
  if (!value)
    return fileError(path, "line {}: not JSON: {}", line, llvm::toString(value.takeError()));
  return value;
}

} // namespace

llvm::Expected<RunLog> parseRunLog(llvm::StringRef text, llvm::StringRef path) {
  RunLog out;
  llvm::SmallVector<llvm::StringRef, 0> lines;
  text.split(lines, '\n', -1, false);
  for (size_t i = 0; i < lines.size(); ++i) {
    auto value = parseJson(lines[i], path, i + 1);
    if (!value)
      return value.takeError();
    const llvm::json::Object *record = value->getAsObject();
    if (!record)
      return fileError(path, "line {}: not a JSON object", i + 1);
    if (const llvm::json::Object *r = record->getObject("run")) {
      if (std::optional<double> resumed = r->getNumber("resumed_at"))
        out.dropStepsAfter(*resumed);
      out.run = *r;
    } else if (const llvm::json::Object *fp8 = record->getObject("fp8")) {
      out.addFp8(*fp8);
    } else if (auto step = record->getNumber("step")) {
      out.addStep(*step, *record);
    } else {
      return fileError(path, "line {}: neither a run, a step nor an FP8 record", i + 1);
    }
  }
  if (out.loss.points.empty())
    return fileError(path, "no step records: not a tgc train --log file");
  return out;
}

llvm::Expected<std::string> parseBenchSection(llvm::StringRef text, llvm::StringRef path) {
  auto value = parseJson(text, path, 1);
  if (!value)
    return value.takeError();
  const llvm::json::Object *bench = value->getAsObject();
  const llvm::json::Array *results = bench ? bench->getArray("results") : nullptr;
  if (!results)
    return fileError(path, "no 'results': not a tgc bench --json file");
  std::vector<std::pair<std::string, double>> ms, tokens, memory;
  for (const llvm::json::Value &r : *results)
    if (const llvm::json::Object *o = r.getAsObject()) {
      std::string recipe = o->getString("recipe").value_or("?").str();
      ms.emplace_back(recipe, o->getNumber("median_ms").value_or(0));
      tokens.emplace_back(recipe, o->getNumber("tokens_per_s").value_or(0));
      memory.emplace_back(recipe, o->getNumber("memory_mib").value_or(0));
    }
  return "<h2>Precisions side by side (tgc bench)</h2>\n" + barChart("median step time, ms", ms) +
         barChart("tokens/s", tokens) + barChart("device memory, MiB", memory);
}

std::string renderReportPage(const RunLog &log, llvm::StringRef benchSection) {
  const auto &[run, loss, lr, norm, speed, stepMs, amax, scale, largestBlockScale, flushed] = log;
  std::string model = run.getString("model").value_or("a model").str();
  std::string html = fmt::format("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>tgc report: {}</title>"
                                 "<style>body{{font-family:sans-serif;margin:24px;color:#222}}figure{{display:inline-"
                                 "block;margin:8px}}figcaption{{font-weight:bold;margin-bottom:4px}}td{{padding:2px "
                                 "10px}}</style></head><body>\n<h1>tgc report: {}</h1>\n<table>\n",
                                 escapeHtml(model), escapeHtml(model));
  for (const char *key : {"commit", "device", "recipe", "parameters", "batch", "seq_len", "steps", "seed", "data"})
    if (const llvm::json::Value *v = run.get(key)) {
      std::string text;
      llvm::raw_string_ostream(text) << *v;
      if (auto s = v->getAsString())
        text = s->str();
      html += fmt::format("<tr><td>{}</td><td>{}</td></tr>\n", key, escapeHtml(text));
    }
  html += "</table>\n";
  std::vector<Series> lossSeries{loss};
  double last = loss.points.back().first, first = loss.points.front().first;
  if (auto vocab = run.getNumber("vocab"))
    lossSeries.push_back({"random guess ln(V)", {{first, std::log(*vocab)}, {last, std::log(*vocab)}}, true});
  if (auto floor = run.getNumber("loss_floor"); floor && *floor > 0)
    lossSeries.push_back({"task floor", {{first, *floor}, {last, *floor}}, true});
  html += lineChart("Loss", "loss (log scale)", lossSeries, /*logY=*/true);
  html += lineChart("Learning rate", "lr", {lr}, false);
  html += lineChart("Gradient norm", "norm (log scale)", {norm}, true);
  html += lineChart("Throughput", "tokens/s", {speed}, false);
  html += lineChart("Step time", "ms", {stepMs}, false);
  if (!amax.empty()) {
    auto all = [](const std::map<std::string, Series> &byTensor) {
      std::vector<Series> out;
      for (auto &[name, series] : byTensor)
        out.push_back(series);
      return out;
    };
    html += "<h2>FP8 scaling state</h2>\n";
    if (amax.size() > 36)
      html += fmt::format("<p>{} quantized tensors: the legends name the first 36.</p>\n", amax.size());
    html += lineChart("amax of each quantized tensor (newest of its history)", "amax (log scale)", all(amax), true);
    if (!scale.empty())
      html += lineChart("scale of each quantized tensor", "scale (log scale)", all(scale), true);
    // Block scaling: the smallest block scale is the block of the amax's; the largest, and what
    // the recipe loses (values flushed to zero: nothing saturates).
    if (!largestBlockScale.empty()) {
      html += lineChart("largest block scale of each quantized tensor", "scale (log scale)", all(largestBlockScale),
                        true);
      html += lineChart("values flushed to zero, all steps so far", "values", all(flushed), false);
    }
  }
  html += benchSection;
  html += "</body></html>\n";
  return html;
}

} // namespace tgc::report
