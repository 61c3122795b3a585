#include "backends/cuda/runtime/Profiler.h"

#include "backends/cuda/runtime/CudaCheck.h"
#include "support/Environment.h"
#include "support/Trace.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <fmt/format.h>
#include <vector>

namespace tgc {

void Profiler::configure(const std::string &process) {
  std::string mode =
      environmentChoice("TGC_GPU_PROFILE", {"0", "1", "launches", "graph", "bandwidth", "marginal"}, "no profile");
  launches_ = mode == "launches";
  bandwidth_ = mode == "bandwidth";
  graphs_ = mode == "graph" || bandwidth_;
  marginal_ = mode == "marginal";
  ops_ = mode == "1" || launches_;
  print_ = ops_ || graphs_ || marginal_;
  fromEnvironment_ = ops_;
  if (TraceLog::instance().enabled() && !launches_) {
    traceProcess_ = TraceLog::instance().beginProcess(process);
    ops_ = true; // eager, an event pair around each op
  }
}

Profiler::~Profiler() {
  if (traceProcess_ >= 0)
    TraceLog::instance().write();
  if (!print_ || !steps_)
    return;
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (auto &[name, ms] : ms_) {
    rows.emplace_back(ms / steps_, name);
    total += ms / steps_;
  }
  std::sort(rows.rbegin(), rows.rend());
  if (marginal_) {
    total = stepMs_ / steps_; // the shares: of the step, not of the sum
    llvm::errs() << fmt::format("GPU time per step by op ({} steps; the step replayed from a CUDA graph: {:.3f} ms; "
                                "each kind: what the step saves without it):\n",
                                steps_, total);
  } else {
    llvm::errs() << fmt::format("GPU time per step by op ({} steps, {:.2f} ms in ops{}):\n", steps_, total,
                                bandwidth_ ? ", each op replayed alone from a CUDA graph after an L2 flush"
                                : graphs_  ? ", each op replayed alone from a CUDA graph"
                                           : "");
  }
  if (bandwidth_)
    llvm::errs() << fmt::format("  (bytes: the operands read and results written as stored; a KV cache by the "
                                "rows read and written; % of the memory's {:.0f} GB/s)\n",
                                peakGbPerSecond_);
  double totalBytes = 0;
  for (auto &[ms, name] : rows) {
    llvm::errs() << fmt::format("  {:<26}{:>9.3f} ms {:>6.1f}%", name, ms, 100 * ms / total);
    if (int64_t calls = calls_.lookup(name))
      llvm::errs() << fmt::format("  {:>4} a step, {:8.2f} us each", calls, 1000 * ms / calls);
    if (auto bytes = bytes_.find(name); bytes != bytes_.end() && ms > 0) {
      double perStep = bytes->second / steps_, gbPerSecond = perStep / (ms * 1e6);
      totalBytes += perStep;
      llvm::errs() << fmt::format("  {:9.3f} MB {:7.0f} GB/s", perStep / 1e6, gbPerSecond);
      if (peakGbPerSecond_ > 0)
        llvm::errs() << fmt::format(" {:5.1f}%", 100 * gbPerSecond / peakGbPerSecond_);
    }
    llvm::errs() << "\n";
  }
  if (bandwidth_ && total > 0)
    llvm::errs() << fmt::format("  all ops: {:.3f} MB a step in {:.3f} ms: {:.0f} GB/s ({:.3f} ms at the peak)\n",
                                totalBytes / 1e6, total, totalBytes / (total * 1e6),
                                peakGbPerSecond_ > 0 ? totalBytes / (peakGbPerSecond_ * 1e6) : 0.0);
}

void Profiler::noReplays() {
  llvm::errs() << fmt::format("tgc: TGC_GPU_PROFILE={} replays the step's ops outside the step, which would "
                              "update this program's parameters again: it is profiled as TGC_GPU_PROFILE=1 profiles\n",
                              marginal_    ? "marginal"
                              : bandwidth_ ? "bandwidth"
                                           : "graph");
  graphs_ = bandwidth_ = marginal_ = false;
  ops_ = true;
}

void Profiler::setTimingOps(bool on) {
  if (on && !ops_)
    ms_.clear();
  ops_ = on || fromEnvironment_; // (TGC_GPU_PROFILE's profile goes on)
}

llvm::Expected<float> Profiler::time(cudaStream_t stream, llvm::function_ref<llvm::Error()> enqueue) {
  cudaEvent_t events[2] = {nullptr, nullptr};
  auto destroy = llvm::make_scope_exit([&] {
    for (cudaEvent_t event : events)
      if (event)
        cudaEventDestroy(event);
  });
  for (cudaEvent_t &event : events)
    CUDA_CHECK(cudaEventCreate(&event));
  CUDA_CHECK(cudaEventRecord(events[0], stream));
  if (auto err = enqueue())
    return std::move(err);
  CUDA_CHECK(cudaEventRecord(events[1], stream));
  CUDA_CHECK(cudaEventSynchronize(events[1]));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[1]));
  return ms;
}

void Profiler::trace(const std::string &label, const char *category, const std::string &result, double ms) {
  if (traceProcess_ < 0 || steps_ >= TraceLog::instance().runsTraced())
    return;
  double endUs = TraceLog::instance().nowUs(); // the op just ended: the stream was synchronised
  TraceLog::instance().add(traceProcess_, {label, category, result, endUs - 1000.0 * ms, 1000.0 * ms, steps_});
}

} // namespace tgc
