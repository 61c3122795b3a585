// tgc report: one self-contained HTML page drawing a training log (tgc train --log) and
// optionally a benchmark (tgc bench --json); the page itself is ReportPage's.
#include "support/Files.h"
#include "support/Limits.h"
#include "tools/tgc/Options.h"
#include "tools/tgc/ReportPage.h"

#include <fmt/format.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> ReportLog(cl::Positional, cl::desc("<run.jsonl>"), cl::Required, cl::sub(reportCommand()),
                                      cl::cat(category()));
static cl::opt<std::string> ReportBench("bench", cl::desc("A tgc bench --json file to draw next to the run"),
                                        cl::value_desc("bench.json"), cl::sub(reportCommand()), cl::cat(category()));
static cl::opt<std::string> ReportOut("o", cl::desc("The HTML file to write"), cl::value_desc("report.html"),
                                      cl::Required, cl::sub(reportCommand()), cl::cat(category()));

} // namespace

int runReport() {
  if (auto err = checkNotEmpty({&ReportBench, &ReportOut}))
    return report(std::move(err));
  if (auto err = checkDistinctFiles({{"the log", ReportLog}, {"--bench", ReportBench}, {"-o", ReportOut}}))
    return report(std::move(err));
  auto text = readFileAtMost(ReportLog, uint64_t(1) << 30, "a log");
  if (!text)
    return report(text.takeError());
  auto log = tgc::report::parseRunLog((*text)->getBuffer(), ReportLog);
  if (!log)
    return report(log.takeError());
  std::string bench;
  if (!ReportBench.empty()) {
    auto benchText = readFileAtMost(ReportBench, uint64_t(64) << 20, "a bench file");
    if (!benchText)
      return report(benchText.takeError());
    auto section = tgc::report::parseBenchSection((*benchText)->getBuffer(), ReportBench);
    if (!section)
      return report(section.takeError());
    bench = std::move(*section);
  }
  if (auto err = writeFileAtomically(ReportOut, tgc::report::renderReportPage(*log, bench)))
    return report(std::move(err));
  llvm::outs() << fmt::format("wrote {} ({} steps{}{})\n", ReportOut.getValue(), log->loss.points.size(),
                              log->amax.empty() ? "" : fmt::format(", {} FP8 tensors", log->amax.size()),
                              ReportBench.empty() ? "" : ", the bench");
  return 0;
}

} // namespace tgc::cli
