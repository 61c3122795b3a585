// TGC_TRACE=FILE: the ops of the first steps with their times, in Chrome's trace event format
// (Perfetto and chrome://tracing open it), on the CPU interpreter and on the GPU.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tgc {

struct TraceEvent {
  std::string name;     // what ran: the op kind (GPU: with its GEMM precision, or its launch)
  std::string category; // "op" on the CPU; "kernel" or "gemm" on the GPU
  std::string value;    // the op's first result, "%name"
  double startUs = 0, durationUs = 0;
  int64_t run = 0; // which run (training step) of the program
};

/// The trace of this process: each executor that traces adds its program's events under a
/// process id of its own, and the file is rewritten whole (atomically) when an executor ends.
class TraceLog {
public:
  static TraceLog &instance();

  /// The file TGC_TRACE names (empty: tracing is off) and how many runs of each program are
  /// traced (TGC_TRACE_STEPS, default 3).
  const std::string &path() const { return path_; }
  int64_t runsTraced() const { return runs_; }
  bool enabled() const { return !path_.empty(); }

  /// A process id for one executor's events, named `what` in the viewer.
  int beginProcess(const std::string &what);
  /// Microseconds since the trace began (when the log was first asked for).
  double nowUs();
  void add(int process, TraceEvent event);
  /// Writes every event so far to path() (an error goes to stderr: tracing never stops a run).
  void write();

private:
  TraceLog();
  std::string path_;
  static constexpr int64_t kMostTracedRuns = 100; // TGC_TRACE_STEPS' bound
  int64_t runs_ = 3;
  std::mutex mutex_;
  std::vector<std::string> processes_;
  std::vector<std::pair<int, TraceEvent>> events_;
  bool started_ = false;
  int64_t startNs_ = 0;
};

} // namespace tgc
