// The GPU a program runs on, as the compile step and the runtime need it.
#pragma once

#include "llvm/Support/Error.h"

#include <string>

namespace tgc {

struct DeviceInfo {
  int index = 0;
  int major = 0, minor = 0;
  int multiprocessors = 0;
  std::string arch;        // "sm_90"
  std::string name;        // "NVIDIA H200 (sm_90)": what tuning keys name
  std::string description; // "cuda:0 NVIDIA H200 (sm_90)"
};

/// Makes device `index` the current one and reads what it is.
llvm::Expected<DeviceInfo> openDevice(int index);

} // namespace tgc
