// Target detection: which GPU (if any) this process can use, and the libraries tgc was built
// with. `tgc info` prints it.
#pragma once

#include <string>
#include <vector>

namespace tgc {

struct GpuInfo {
  std::string name;
  int major = 0, minor = 0;
  int smCount = 0;
  size_t memoryBytes = 0;
};

struct TargetInfo {
  bool builtWithCuda = false;
  int driverVersion = 0;  // CUDA driver API version, 0 when no driver
  int runtimeVersion = 0; // cudart the binary carries
  int nvrtcMajor = 0, nvrtcMinor = 0;
  std::vector<GpuInfo> gpus;
  std::string noGpuReason; // why gpus is empty
};

TargetInfo detectTarget();

} // namespace tgc
