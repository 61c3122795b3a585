// tgc report's page, apart from the command: the readers of a training log (tgc train --log)
// and of a bench file (tgc bench --json), and the HTML page drawn from them. No file is read or
// written here (the fuzz target feeds it bytes).
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tgc::report {

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points; // (step, value)
  bool dashed = false;
};

/// What a training log holds: its (last) run record and its series by step.
struct RunLog {
  llvm::json::Object run;
  Series loss{"loss", {}}, lr{"learning rate", {}}, norm{"gradient norm", {}}, speed{"tokens/s", {}},
      stepMs{"step ms", {}};
  std::map<std::string, Series> amax, scale;
  /// Block scaling's: each tensor's largest block scale, and its values flushed to zero so far.
  std::map<std::string, Series> largestBlockScale, flushed;

  /// A resumed run continuing this log: the steps past where it resumed are its own now
  /// (the first run's were not saved, or are done again).
  void dropStepsAfter(double resumed) {
    auto after = [&](const std::pair<double, double> &point) { return point.first > resumed; };
    for (Series *series : {&loss, &lr, &norm, &speed, &stepMs})
      llvm::erase_if(series->points, after);
    for (auto *byTensor : {&amax, &scale, &largestBlockScale, &flushed})
      for (auto &[name, series] : *byTensor)
        llvm::erase_if(series.points, after);
  }

  void addFp8(const llvm::json::Object &fp8) {
    double step = fp8.getNumber("step").value_or(0);
    if (const llvm::json::Array *tensors = fp8.getArray("tensors"))
      for (const llvm::json::Value &t : *tensors)
        if (const llvm::json::Object *o = t.getAsObject()) {
          std::string name = o->getString("tensor").value_or("?").str();
          amax[name].name = name;
          amax[name].points.emplace_back(step, o->getNumber("amax").value_or(NAN));
          if (auto largest = o->getNumber("block_scale_max")) { // block scaling: no one scale a tensor
            largestBlockScale[name].name = flushed[name].name = name;
            largestBlockScale[name].points.emplace_back(step, *largest);
            flushed[name].points.emplace_back(step, o->getNumber("flushed").value_or(NAN));
            continue;
          }
          scale[name].name = name;
          scale[name].points.emplace_back(step, o->getNumber("scale").value_or(NAN));
        }
  }

  void addStep(double step, const llvm::json::Object &record) {
    loss.points.emplace_back(step, record.getNumber("loss").value_or(NAN));
    lr.points.emplace_back(step, record.getNumber("lr").value_or(NAN));
    norm.points.emplace_back(step, record.getNumber("grad_norm").value_or(NAN));
    speed.points.emplace_back(step, record.getNumber("tokens_per_s").value_or(NAN));
    stepMs.points.emplace_back(step, record.getNumber("step_ms").value_or(NAN));
  }
};

/// The records of a log, one JSON object a line: an error naming `path` and the line for one
/// that is not JSON, nests too deep or is neither a run, a step nor an FP8 record.
llvm::Expected<RunLog> parseRunLog(llvm::StringRef text, llvm::StringRef path);
/// A bench file's precisions side by side, as HTML bar charts.
llvm::Expected<std::string> parseBenchSection(llvm::StringRef text, llvm::StringRef path);
/// The page: the run's settings, its series as line charts, `benchSection` after them.
std::string renderReportPage(const RunLog &log, llvm::StringRef benchSection);

} // namespace tgc::report
