// What a program's runs measure of themselves: TGC_GPU_PROFILE=1 runs the steps eagerly with an
// event pair around each op and prints the time per op kind when the program ends;
// TGC_GPU_PROFILE=launches times each kernel launch of an op on its own ("attention_backward
// #3"); TGC_GPU_PROFILE=graph keeps the steps as graphs and, after each, replays every op alone
// from a graph of its own; TGC_GPU_PROFILE=bandwidth replays them so with the L2 cache flushed
// before each replay and prints the bytes each op moves and their rate against the memory's
// (OpProfile.cpp); TGC_GPU_PROFILE=marginal replays the whole step from a graph before each
// step, and again without each kind of op, and prints what each kind's absence saves: its cost
// in the chain, its overlap with its neighbours taken out; TGC_TRACE=FILE writes the ops of the
// first steps in Chrome's trace event format (support/Trace.h). setProfiling (tgc bench) turns
// the per-op timing on too.
#pragma once

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <cuda_runtime.h>
#include <map>
#include <string>

namespace tgc {

class Profiler {
public:
  /// Reads TGC_GPU_PROFILE and TGC_TRACE for a program called `process` in a trace.
  void configure(const std::string &process);
  Profiler() = default;
  Profiler(const Profiler &) = delete;
  Profiler &operator=(const Profiler &) = delete;
  /// Prints the time per op kind (TGC_GPU_PROFILE) and writes the trace (TGC_TRACE).
  ~Profiler();

  /// Steps run eagerly, each op timed (TGC_GPU_PROFILE=1 or launches, TGC_TRACE, setProfiling).
  bool timesOps() const { return ops_; }
  bool timesLaunches() const { return launches_; }
  /// Each op replayed alone from a graph after each step (TGC_GPU_PROFILE=graph, bandwidth).
  bool replaysOps() const { return graphs_; }
  /// The step replayed whole and without each kind of op before each step (marginal).
  bool replaysSteps() const { return marginal_; }
  /// One replay of the whole step took `ms` (replaysSteps; the kinds' costs go to add).
  void addStep(double ms) { stepMs_ += ms; }
  /// The replays start from a flushed L2 and count bytes (TGC_GPU_PROFILE=bandwidth).
  bool measuresBandwidth() const { return bandwidth_; }
  /// `bytes` moved by one call of `label` (measuresBandwidth), and the memory's peak rate.
  void addBytes(const std::string &label, double bytes) { bytes_[label] += bytes; }
  void setPeakBandwidth(double gbPerSecond) { peakGbPerSecond_ = gbPerSecond; }
  /// A program that updates its parameters cannot replay its ops: timed as TGC_GPU_PROFILE=1.
  void noReplays();
  void setTimingOps(bool on);
  bool printsPlans() const { return print_; }

  /// Milliseconds `enqueue`'s work on `stream` takes (the stream synchronised after it).
  static llvm::Expected<float> time(cudaStream_t stream, llvm::function_ref<llvm::Error()> enqueue);
  void add(const std::string &label, double ms) { ms_[label] += ms; }
  /// An op the step just ran, for the trace: `label` of category `category`, result `result`.
  void trace(const std::string &label, const char *category, const std::string &result, double ms);
  /// Counts `label` as one op of a step (TGC_GPU_PROFILE=graph's calls per step).
  void countCall(const std::string &label) { ++calls_[label]; }
  void endStep() { ++steps_; }
  int64_t steps() const { return steps_; }
  std::map<std::string, double> byOp() const { return ms_; }

private:
  bool ops_ = false, launches_ = false, graphs_ = false, bandwidth_ = false, marginal_ = false, print_ = false;
  bool fromEnvironment_ = false; // ops_ as TGC_GPU_PROFILE set it
  int traceProcess_ = -1;
  std::map<std::string, double> ms_, bytes_;
  double peakGbPerSecond_ = 0, stepMs_ = 0;
  llvm::StringMap<int64_t> calls_;
  int64_t steps_ = 0;
};

} // namespace tgc
