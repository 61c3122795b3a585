// Pinned host memory between the host and a program's stream: small uploads (a decode step's
// tokens and positions) through a ring of staging slots, so that the copy is queued behind the
// steps launched rather than waiting for them as a copy from pageable memory may; and reads
// queued for later (readLater), each into a pinned buffer of its own with an event after it.
#pragma once

#include "llvm/Support/Error.h"

#include <array>
#include <cuda_runtime.h>
#include <vector>

namespace tgc {

class HostStaging {
public:
  HostStaging() = default;
  HostStaging(const HostStaging &) = delete;
  HostStaging &operator=(const HostStaging &) = delete;
  ~HostStaging();

  static constexpr size_t kSlotBytes = 64 << 10;
  /// Copies `bytes` (at most kSlotBytes) from `host` to `device` on `stream` through the next slot.
  llvm::Error upload(void *device, const void *host, size_t bytes, cudaStream_t stream);
  /// Queues a copy of `bytes` at `device` into pinned memory on `stream`; returns its ticket.
  llvm::Expected<unsigned> readLater(const void *device, size_t bytes, cudaStream_t stream);
  /// Waits for ticket `ticket`'s copy; its bytes stay valid until the next readLater.
  llvm::Expected<const void *> collect(unsigned ticket);

private:
  struct Slot {
    void *host = nullptr;
    cudaEvent_t copied = nullptr;
  };
  std::array<Slot, 8> slots_;
  size_t next_ = 0;
  struct LaterRead {
    void *host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  std::vector<LaterRead> later_;
};

} // namespace tgc
