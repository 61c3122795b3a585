#include "backends/cuda/runtime/Device.h"

#include "backends/cuda/libraries/Nvrtc.h"
#include "backends/cuda/runtime/CudaCheck.h"

#include <fmt/format.h>

namespace tgc {

llvm::Expected<DeviceInfo> openDevice(int index) {
  CUDA_CHECK(cudaSetDevice(index));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  DeviceInfo device;
  device.index = index;
  device.major = prop.major;
  device.minor = prop.minor;
  device.multiprocessors = prop.multiProcessorCount;
  device.arch = archName(prop.major, prop.minor);
  device.name = fmt::format("{} ({})", prop.name, device.arch);
  device.description = fmt::format("cuda:{} {}", index, device.name);
  return device;
}

} // namespace tgc
