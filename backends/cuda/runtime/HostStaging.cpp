#include "backends/cuda/runtime/HostStaging.h"

#include "backends/cuda/runtime/CudaCheck.h"

#include <cstring>

namespace tgc {

HostStaging::~HostStaging() {
  for (Slot &slot : slots_) {
    if (slot.host)
      cudaFreeHost(slot.host);
    if (slot.copied)
      cudaEventDestroy(slot.copied);
  }
  for (LaterRead &r : later_) {
    if (r.host)
      cudaFreeHost(r.host);
    if (r.done)
      cudaEventDestroy(r.done);
  }
}

llvm::Error HostStaging::upload(void *device, const void *host, size_t bytes, cudaStream_t stream) {
  Slot &slot = slots_[next_++ % slots_.size()];
  if (!slot.host) {
    CUDA_CHECK(cudaMallocHost(&slot.host, kSlotBytes));
    CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  } else {
    CUDA_CHECK(cudaEventSynchronize(slot.copied)); // its last copy has left it
  }
  std::memcpy(slot.host, host, bytes);
  CUDA_CHECK(cudaMemcpyAsync(device, slot.host, bytes, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaEventRecord(slot.copied, stream));
  return llvm::Error::success();
}

llvm::Expected<unsigned> HostStaging::readLater(const void *device, size_t bytes, cudaStream_t stream) {
  unsigned ticket = 0;
  while (ticket < later_.size() && later_[ticket].pending)
    ++ticket;
  if (ticket == later_.size())
    later_.emplace_back();
  LaterRead &r = later_[ticket];
  if (r.bytes < bytes) {
    if (r.host)
      CUDA_CHECK(cudaFreeHost(r.host));
    CUDA_CHECK(cudaMallocHost(&r.host, bytes));
    r.bytes = bytes;
  }
  if (!r.done)
    CUDA_CHECK(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming));
  CUDA_CHECK(cudaMemcpyAsync(r.host, device, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaEventRecord(r.done, stream));
  r.pending = true;
  return ticket;
}

llvm::Expected<const void *> HostStaging::collect(unsigned ticket) {
  if (ticket >= later_.size() || !later_[ticket].pending)
    return makeError("no read queued as ticket {}", ticket);
  LaterRead &r = later_[ticket];
  CUDA_CHECK(cudaEventSynchronize(r.done));
  r.pending = false;
  return r.host;
}

} // namespace tgc
