// The CUDA kernel headers (backends/cuda/kernels/*.cuh), embedded into the binary at build
// time (cmake/EmbedKernels.cmake). NVRTC compiles the generated programs against them, which
// include them by name.
#pragma once

#include "llvm/ADT/ArrayRef.h"

namespace tgc {

struct KernelHeader {
  const char *name; // the file name, as the generated source includes it: "norms.cuh"
  const char *text;
};

/// Every kernel header, in file-name order.
llvm::ArrayRef<KernelHeader> kernelHeaders();

} // namespace tgc
