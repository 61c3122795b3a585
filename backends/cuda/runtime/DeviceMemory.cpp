#include "backends/cuda/runtime/DeviceMemory.h"

#include "backends/cuda/runtime/CudaCheck.h"

#include "llvm/ADT/STLExtras.h"

namespace tgc {

DeviceMemory::~DeviceMemory() {
  for (void *p : owned_)
    cudaFree(p);
}

llvm::Expected<void *> DeviceMemory::allocate(size_t bytes, bool zero, const char *use, int64_t counted) {
  void *p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes));
  owned_.push_back(p);
  if (counted < 0)
    counted = int64_t(bytes);
  bytes_ += counted;
  auto entry = llvm::find_if(byUse_, [&](const auto &e) { return e.first == use; });
  if (entry == byUse_.end())
    byUse_.push_back({use, counted});
  else
    entry->second += counted;
  if (zero)
    CUDA_CHECK(cudaMemset(p, 0, bytes));
  return p;
}

llvm::Expected<void *> DeviceMemory::upload(const void *host, size_t bytes, const char *use) {
  auto p = allocate(bytes, false, use);
  if (!p)
    return p.takeError();
  CUDA_CHECK(cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice));
  return *p;
}

} // namespace tgc
