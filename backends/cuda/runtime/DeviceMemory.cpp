#include "backends/cuda/runtime/DeviceMemory.h"

#include "backends/cuda/runtime/CudaCheck.h"

namespace tgc {

DeviceMemory::~DeviceMemory() {
  for (void *p : owned_)
    cudaFree(p);
}

llvm::Expected<void *> DeviceMemory::allocate(size_t bytes, bool zero, int64_t counted) {
  void *p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  owned_.push_back(p);
  bytes_ += counted;
  if (zero)
    CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

llvm::Expected<void *> DeviceMemory::upload(const void *host, size_t bytes) {
  auto p = allocate(bytes, false);
  if (!p)
    return p.takeError();
  CUDA_CHECK(cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice));
  return *p;
}

} // namespace tgc
