#include "support/Memory.h"

#include "llvm/ADT/StringRef.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <vector>

namespace tgc {

namespace {

/// A number read from a one-line file (a cgroup's memory.max, ...), if it holds one ("max" does
/// not).
std::optional<int64_t> readNumber(const std::string &path) {
  std::ifstream file(path);
  int64_t value = 0;
  if (file >> value && value >= 0)
    return value;
  return std::nullopt;
}

} // namespace

std::optional<int64_t> cgroupAvailableMemory(const std::string &root, const std::string &selfCgroup) {
  std::vector<std::string> folders;
  std::ifstream self(selfCgroup);
  for (std::string line; std::getline(self, line);)
    if (llvm::StringRef(line).starts_with("0::"))
      folders.push_back(root + line.substr(3));
  folders.push_back(root);
  for (const std::string &folder : folders) {
    auto limit = readNumber(folder + "/memory.max"), used = readNumber(folder + "/memory.current");
    if (limit && used)
      return std::max<int64_t>(0, *limit - *used);
  }
  auto limit = readNumber(root + "/memory/memory.limit_in_bytes");
  auto used = readNumber(root + "/memory/memory.usage_in_bytes");
  if (limit && used && *limit < (int64_t(1) << 60)) // v1 says "no limit" with a huge number
    return std::max<int64_t>(0, *limit - *used);
  return std::nullopt;
}

std::optional<int64_t> availableHostMemory() {
  std::optional<int64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") {
      available = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (std::optional<int64_t> container = cgroupAvailableMemory("/sys/fs/cgroup", "/proc/self/cgroup"))
    available = available ? std::min(*available, *container) : *container;
  return available;
}

} // namespace tgc
