// The device memory a program owns: every buffer it allocates (the arena, the parameter,
// gradient and state regions, inputs, ops' persistent buffers and constants, the BF16 weight
// copy, library workspaces), freed together when the owner goes, and the bytes counted.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Error.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tgc {

/// Where each value of a program is on the device.
using BufferMap = llvm::DenseMap<const Value *, void *>;

class DeviceMemory {
public:
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory &) = delete;
  DeviceMemory &operator=(const DeviceMemory &) = delete;
  ~DeviceMemory();

  /// `bytes` of device memory for `use` (what `byUse` lists it as), zeroed when `zero`; counted
  /// as `counted` bytes where given (the arena and the regions count what the plan asked for,
  /// not the 256-byte minimum allocated).
  llvm::Expected<void *> allocate(size_t bytes, bool zero, const char *use, int64_t counted = -1);
  /// A buffer holding a copy of `bytes` host bytes.
  llvm::Expected<void *> upload(const void *host, size_t bytes, const char *use);
  int64_t bytes() const { return bytes_; }
  /// The bytes counted, by use, in the order first allocated.
  const std::vector<std::pair<std::string, int64_t>> &byUse() const { return byUse_; }

private:
  std::vector<void *> owned_;
  int64_t bytes_ = 0;
  std::vector<std::pair<std::string, int64_t>> byUse_;
};

} // namespace tgc
