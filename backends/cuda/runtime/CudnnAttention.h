// cuDNN's fused attention in a program (OpLowering::cudnnAttention): which attention ops it
// takes, one plan per distinct shape with its engine configuration chosen by timing (kept as the
// GEMMs' algorithms are, GemmTuning.h), each op's variant pack, and the calls. Where cuDNN is
// absent, too old for the GPU, or refuses a shape, tgc's attention kernels run those ops, and
// the program's description says so.
#pragma once

#include "backends/cuda/CudaProgram.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/runtime/Device.h"

#include <cuda_runtime.h>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tgc {

class GemmTuner;

class CudnnAttentionRunner {
public:
  CudnnAttentionRunner() = default;
  CudnnAttentionRunner(const CudnnAttentionRunner &) = delete;
  CudnnAttentionRunner &operator=(const CudnnAttentionRunner &) = delete;
  ~CudnnAttentionRunner();

  /// Plans the attention ops of `graph` cuDNN runs (none unless `enabled` and TGC_CUDNN is not
  /// 0), into `lowering` with the workspace each needs; says what it chose in `description`,
  /// each plan's configuration on stderr when `print`.
  void plan(const Graph &graph, bool enabled, const DeviceInfo &device, bool print, LoweringOptions &lowering,
            std::string &description);
  /// cuDNN's work goes on `stream`.
  llvm::Error setStream(cudaStream_t stream);
  /// Enqueues op `i`'s attention with the buffers among its launches' `pointers` (`lowering`'s
  /// libraryBuffers, then the workspace).
  llvm::Error run(size_t i, const OpLowering &lowering, const std::vector<void *> &pointers);

private:
  /// Times `plan`'s candidates on buffers of its own and chooses the fastest (`tuner`, `key`).
  llvm::Error choose(CudnnAttention &plan, GemmTuner &tuner, const std::string &key);

  const CudnnApi *cudnn_ = nullptr;
  void *handle_ = nullptr;
  std::map<std::string, std::unique_ptr<CudnnAttention>> plans_; // by shape
  std::vector<const CudnnAttention *> ops_;                      // per op
  std::vector<std::unique_ptr<CudnnAttention::Buffers>> buffers_; // per op, made at its first call
};

} // namespace tgc
