// The CUDA backend's compile step: a program (after gpuPipeline's passes) lowered for one GPU
// (lowering/) and its kernels compiled by NVRTC for that GPU's architecture, or taken from the
// kernel cache. The runtime (runtime/) then only loads and runs what this makes.
#pragma once

#include "backends/cuda/CudaProgram.h"

#include "llvm/Support/Error.h"

#include <string>

namespace tgc {

struct CompiledCudaProgram {
  CudaProgram program;
  std::string cubin;
  /// ", N launches of K kernels compiled by NVRTC" (or from the kernel cache).
  std::string description;
};

/// Lowers `graph` with `options` and compiles its kernels for `arch` ("sm_90").
llvm::Expected<CompiledCudaProgram> compileCudaProgram(const Graph &graph, const LoweringOptions &options,
                                                       const std::string &arch);

} // namespace tgc
