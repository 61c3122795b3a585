// NVRTC: generated CUDA source to CUBIN for one sm_XY, with a disk cache keyed by
// hash(source, options, NVRTC version, arch) so that a second run compiles nothing.
#pragma once

#include "llvm/Support/Error.h"

#include <string>

namespace tgc {

struct CompiledModule {
  std::string cubin;
  std::string log;      // NVRTC's messages (empty when clean)
  bool fromCache = false;
  std::string cachePath;
};

/// "sm_90" and the like; compute capability 9.0 -> "sm_90".
std::string archName(int major, int minor);
/// $TGC_CACHE_DIR, else $XDG_CACHE_HOME/tgc/kernels, else ~/.cache/tgc/kernels.
std::string kernelCacheDir();
/// The CUDA toolkit's include folder (CUDA_HOME, CUDA_PATH, /usr/local/cuda, or the one tgc was
/// built with), the first that has cuda_fp8.h; empty if none has.
std::string cudaIncludeDir();
/// Compiles (or loads from the cache) `source` for `arch`.
llvm::Expected<CompiledModule> compileCuda(llvm::StringRef source, llvm::StringRef arch);

} // namespace tgc
