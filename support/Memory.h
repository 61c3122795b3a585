// What memory this process may still take: the machine's available memory and a container's
// (cgroup) limit. The interpreter checks a program against it before it allocates; the
// checkpoint reader before it copies tensors out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tgc {

/// The memory this process may still take (MemAvailable, and the container's cgroup limit less
/// its usage where one is set), if the machine can say.
std::optional<int64_t> availableHostMemory();

/// What a container's memory limits leave, if one is set: the least over the process's own
/// cgroup (as `selfCgroup` names it under `root`), its ancestors and `root`, of cgroup v2's
/// memory.max less memory.current, else of cgroup v1's memory/memory.limit_in_bytes less
/// memory.usage_in_bytes (its memory controller's line).
std::optional<int64_t> cgroupAvailableMemory(const std::string &root, const std::string &selfCgroup);

} // namespace tgc
