#include "support/Memory.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringRef.h"

#include <algorithm>
#include <cstdint>
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

/// The process's cgroup path from /proc/self/cgroup's lines: v2's "0::PATH", or under v1 the
/// line whose controllers include memory ("4:memory:PATH", "7:cpu,memory:PATH").
std::optional<std::string> ownCgroup(const std::string &selfCgroup, bool v2) {
  std::ifstream self(selfCgroup);
  for (std::string line; std::getline(self, line);) {
    auto [id, rest] = llvm::StringRef(line).split(':');
    auto [controllers, path] = rest.split(':');
    if (v2 ? id == "0" && controllers.empty() : llvm::is_contained(llvm::split(controllers, ','), "memory"))
      return path.str();
  }
  return std::nullopt;
}

/// The least any limit leaves from `hierarchy`/PATH up to `hierarchy` itself: every ancestor's
/// limit binds the processes under it (systemd slices, batch schedulers put jobs in children).
/// A folder without the files (a path the container does not show) is passed over.
std::optional<int64_t> leastLeft(const std::string &hierarchy, const std::optional<std::string> &path,
                                 const char *limitFile, const char *usedFile) {
  std::vector<std::string> folders;
  for (llvm::StringRef p = path ? llvm::StringRef(*path) : ""; !p.empty() && p != "/"; p = p.rsplit('/').first)
    folders.push_back(hierarchy + p.str());
  folders.push_back(hierarchy);
  std::optional<int64_t> least;
  for (const std::string &folder : folders) {
    auto limit = readNumber(folder + "/" + limitFile), used = readNumber(folder + "/" + usedFile);
    if (limit && used && *limit < (int64_t(1) << 60)) // v1 says "no limit" with a huge number, v2 "max"
      least = std::min(least.value_or(INT64_MAX), std::max<int64_t>(0, *limit - *used));
  }
  return least;
}

} // namespace

std::optional<int64_t> cgroupAvailableMemory(const std::string &root, const std::string &selfCgroup) {
  if (auto v2 = leastLeft(root, ownCgroup(selfCgroup, true), "memory.max", "memory.current"))
    return v2;
  return leastLeft(root + "/memory", ownCgroup(selfCgroup, false), "memory.limit_in_bytes", "memory.usage_in_bytes");
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
