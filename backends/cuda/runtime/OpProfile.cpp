// TGC_GPU_PROFILE=graph and bandwidth (Profiler.h): after a step, each op's launches replayed
// alone from a CUDA graph of their own and timed. With bandwidth, each replay starts from a
// flushed L2 cache (a buffer twice the L2's size written before it; the flushes timed alone and
// taken out), so that an op reads its weights from the device's memory as in a step that streams
// them all, and the bytes each op moves are counted: its operands read and its results written
// as they are stored (a weight a BF16 product reads by its BF16 copy; an embedding by the rows
// it takes; a KV cache by the rows the step's attention reads and writes: lowering/Traffic.h).
// Bytes over time against the memory's peak rate (clock x bus) say which kernels stream at the
// memory's rate, and the sum of the ops' times against the step's (tgc bench) what the gaps
// between them cost. TGC_GPU_PROFILE=marginal times the whole step without each kind of op.
#include "backends/cuda/runtime/ProgramRunner.h"

#include "backends/cuda/lowering/Traffic.h"
#include "backends/cuda/runtime/CudaCheck.h"
#include "models/ProgramInterface.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>

namespace tgc {

namespace {
constexpr int kRepeats = 10; // replays in one graph: the launch's cost spread over them

/// `exec` replayed once, untimed (the first replay uploads it), then passed on.
llvm::Expected<cudaGraphExec_t> uploaded(llvm::Expected<cudaGraphExec_t> exec, cudaStream_t stream) {
  if (exec)
    CUDA_CHECK(cudaGraphLaunch(*exec, stream));
  return exec;
}

/// Milliseconds one replay of `exec` takes on `stream`.
llvm::Expected<float> timeGraph(cudaGraphExec_t exec, cudaStream_t stream) {
  return Profiler::time(stream, [&]() -> llvm::Error {
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    return llvm::Error::success();
  });
}
} // namespace

llvm::Expected<cudaGraphExec_t> ProgramRunner::captureOpGraph(size_t i, int repeats) {
  return uploaded(captureGraph([&]() -> llvm::Error {
                    for (int r = 0; r < repeats; ++r) {
                      if (flushL2_) {
                        CUDA_CHECK(cudaMemsetAsync(flushL2_, r & 0xff, flushBytes_, stream_));
                        afterGeneratedKernel_ = false;
                      }
                      if (i < ops_.size())
                        if (auto err = launchOp(i))
                          return err;
                    }
                    return llvm::Error::success();
                  }),
                  stream_);
}

/// After a step: each op's launches captured once as a graph of kRepeats copies of them, each
/// replay timed: what the op costs inside the step's CUDA graph, launch gaps included.
/// Inference programs only: repeating an op must not change what the step computed.
llvm::Error ProgramRunner::profileOpGraphs() {
  if (opGraphs_.empty())
    opGraphs_.resize(ops_.size(), nullptr);
  const bool bandwidth = profiler_->measuresBandwidth();
  if (bandwidth && !flushL2_) {
    int l2 = 0, clockKHz = 0, busBits = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device_.index));
    CUDA_CHECK(cudaDeviceGetAttribute(&clockKHz, cudaDevAttrMemoryClockRate, device_.index));
    CUDA_CHECK(cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, device_.index));
    profiler_->setPeakBandwidth(2.0 * clockKHz * 1e3 * (busBits / 8) / 1e9); // double data rate
    flushBytes_ = 2 * size_t(std::max(l2, 1 << 20));
    auto flush = memory_.allocate(flushBytes_, false, "profiler's L2 flush");
    if (!flush)
      return flush.takeError();
    flushL2_ = *flush;
  }
  int64_t cacheRows = 0;
  if (bandwidth) {
    auto rows = cacheRowsRead();
    if (!rows)
      return rows.takeError();
    cacheRows = *rows;
  }
  float flushMs = 0;
  if (bandwidth) { // the flushes alone (no op: index past the ops)
    if (!flushGraph_) {
      auto exec = captureOpGraph(ops_.size(), kRepeats);
      if (!exec)
        return exec.takeError();
      flushGraph_ = *exec;
    }
    auto ms = timeGraph(flushGraph_, stream_);
    if (!ms)
      return ms.takeError();
    flushMs = *ms;
  }
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (!program_.lowering[i].launchesWork())
      continue;
    if (!opGraphs_[i]) {
      auto exec = captureOpGraph(i, kRepeats);
      if (!exec)
        return exec.takeError();
      opGraphs_[i] = *exec;
    }
    auto ms = timeGraph(opGraphs_[i], stream_);
    if (!ms)
      return ms.takeError();
    std::string label = profileLabel(i);
    profiler_->add(label, std::max(0.0f, *ms - flushMs) / kRepeats);
    if (bandwidth)
      profiler_->addBytes(label, double(opTraffic(program_, *ops_[i], cacheRows)));
    if (profiler_->steps() == 0)
      profiler_->countCall(label);
  }
  profiler_->endStep();
  return llvm::Error::success();
}

/// TGC_GPU_PROFILE=marginal, before each step: the step's launches captured kRepeats times as one
/// graph, and again without each kind of op (the ops of one profile label); each replay timed.
/// What a kind's absence saves is its cost in the chain of the step, what its neighbours hide of
/// it under programmatic launch taken out, where graph's replays time an op alone, its neighbours'
/// overlap missing. The replays run before the step, which then writes again all they wrote (a
/// decode step: its cache rows at its position), so that the program goes on as without them.
llvm::Error ProgramRunner::profileMarginal() {
  if (stepGraphs_.empty()) {
    std::vector<std::string> labels = {""}; // the whole step first
    for (size_t i = 0; i < ops_.size(); ++i)
      if (program_.lowering[i].launchesWork()) {
        std::string label = profileLabel(i);
        if (!llvm::is_contained(labels, label))
          labels.push_back(label);
        profiler_->countCall(label);
      }
    for (const std::string &label : labels) {
      auto exec = uploaded(captureGraph([&]() -> llvm::Error {
                             for (int r = 0; r < kRepeats; ++r)
                               if (auto err = launchStep(label))
                                 return err;
                             return llvm::Error::success();
                           }),
                           stream_);
      if (!exec)
        return exec.takeError();
      stepGraphs_.emplace_back(label, *exec);
    }
  }
  float whole = 0;
  for (auto &[label, exec] : stepGraphs_) {
    auto ms = timeGraph(exec, stream_);
    if (!ms)
      return ms.takeError();
    if (label.empty())
      profiler_->addStep(whole = *ms / kRepeats);
    else
      profiler_->add(label, whole - *ms / kRepeats);
  }
  profiler_->endStep();
  return llvm::Error::success();
}

llvm::Expected<int64_t> ProgramRunner::cacheRowsRead() const {
  const Value *positions = graph_.lookup(program::kPositions);
  if (!positions || positions->def()->kind() != OpKind::Input || positions->type().shape.empty())
    return 0;
  auto t = read(positions->name());
  if (!t)
    return t.takeError();
  // Each sequence reads its rows up to its last position (a verify step's several tokens too).
  const int64_t sequences = positions->type().shape[0], each = t->size() / std::max<int64_t>(sequences, 1);
  int64_t rows = 0;
  for (int64_t b = 0; b < sequences; ++b) {
    int32_t last = 0;
    for (int64_t j = 0; j < each; ++j)
      last = std::max(last, t->ints[size_t(b * each + j)]);
    rows += int64_t(last) + 1;
  }
  return rows;
}

} // namespace tgc
