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

/// What a container's memory limit leaves, if one is set: cgroup v2 (memory.max less
/// memory.current, in the process's own cgroup as `selfCgroup` names it under `root`, or at
/// `root`), else cgroup v1 (memory/memory.limit_in_bytes less memory/memory.usage_in_bytes).
std::optional<int64_t> cgroupAvailableMemory(const std::string &root, const std::string &selfCgroup);

} // namespace tgc
