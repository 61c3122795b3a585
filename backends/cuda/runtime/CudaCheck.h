// How the runtime turns a failed CUDA or cuBLASLt call into an llvm::Error that names the call,
// the place and the library's reason.
#pragma once

#include "support/Error.h"

#include <cuda_runtime.h>
#include <string>

namespace tgc {

inline llvm::Error cudaFailure(const char *call, const char *file, int line, const std::string &what) {
  return makeError("error: {} failed at {}:{}: {}", call, file, line, what);
}

} // namespace tgc

#define CUDA_CHECK(call)                                                                           \
  do {                                                                                             \
    cudaError_t status_ = (call);                                                                  \
    if (status_ != cudaSuccess)                                                                    \
      return ::tgc::cudaFailure(#call, __FILE__, __LINE__, cudaGetErrorString(status_));           \
  } while (0)

#define CUBLAS_CHECK(call)                                                                         \
  do {                                                                                             \
    cublasStatus_t status_ = (call);                                                               \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                          \
      return ::tgc::cudaFailure(#call, __FILE__, __LINE__, "cuBLAS status " + std::to_string(int(status_))); \
  } while (0)
