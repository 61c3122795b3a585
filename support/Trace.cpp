#include "support/Trace.h"

#include "support/Environment.h"
#include "support/Error.h"
#include "support/Files.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cstdlib>

namespace tgc {

TraceLog &TraceLog::instance() {
  static TraceLog log;
  return log;
}

TraceLog::TraceLog() {
  nowUs(); // time 0: before any executor exists, so that no event starts before it
  if (const char *path = std::getenv("TGC_TRACE"))
    path_ = path;
  // Each traced event is held in memory until the trace is written: a bound on the steps.
  runs_ = environmentCount("TGC_TRACE_STEPS", runs_, kMostTracedRuns, "the steps a trace holds");
}

int TraceLog::beginProcess(const std::string &what) {
  std::lock_guard<std::mutex> lock(mutex_);
  processes_.push_back(what);
  return int(processes_.size()) - 1;
}

double TraceLog::nowUs() {
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
                   .count();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) {
    started_ = true;
    startNs_ = ns;
  }
  return double(ns - startNs_) / 1000.0;
}

void TraceLog::add(int process, TraceEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.emplace_back(process, std::move(event));
}

void TraceLog::write() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_.empty() || events_.empty())
    return;
  llvm::json::Array events;
  for (size_t p = 0; p < processes_.size(); ++p)
    events.push_back(llvm::json::Object{{"name", "process_name"},
                                        {"ph", "M"},
                                        {"pid", int64_t(p)},
                                        {"args", llvm::json::Object{{"name", processes_[p]}}}});
  for (const auto &[process, e] : events_)
    events.push_back(llvm::json::Object{{"name", e.name},
                                        {"cat", e.category},
                                        {"ph", "X"},
                                        {"ts", e.startUs},
                                        {"dur", e.durationUs},
                                        {"pid", process},
                                        {"tid", 0},
                                        {"args", llvm::json::Object{{"value", e.value}, {"step", e.run + 1}}}});
  std::string text;
  llvm::raw_string_ostream(text) << llvm::json::Value(
      llvm::json::Object{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}});
  if (auto err = writeFileAtomically(path_, text))
    llvm::errs() << "tgc: warning: TGC_TRACE: " << escapeForMessage(llvm::toString(std::move(err))) << "\n";
}

} // namespace tgc
