// The GPU executor of a build without the CUDA Toolkit (-DTGC_CUDA=OFF, or no toolkit found):
// CMake compiles this file instead of CudaExecutor.cpp and the runtime, so every GPU request
// gets one clear error.
#include "backends/cuda/CudaExecutor.h"

#include "support/Error.h"

namespace tgc {

llvm::Expected<std::unique_ptr<Executor>> createCudaExecutor(const Graph &, CudaOptions) {
  return makeError("error: tgc was built without CUDA (-DTGC_CUDA=OFF)");
}

} // namespace tgc
