#include "backends/cuda/Target.h"

#ifdef TGC_HAVE_CUDA
#include <cuda_runtime.h>
#include <nvrtc.h>
#endif

namespace tgc {

TargetInfo detectTarget() {
  TargetInfo info;
#ifdef TGC_HAVE_CUDA
  info.builtWithCuda = true;
  cudaRuntimeGetVersion(&info.runtimeVersion);
  nvrtcVersion(&info.nvrtcMajor, &info.nvrtcMinor);
  if (cudaDriverGetVersion(&info.driverVersion) != cudaSuccess || info.driverVersion == 0) {
    info.noGpuReason = "no CUDA driver on this machine";
    return info;
  }
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.noGpuReason = std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")";
    return info;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess)
      continue;
    info.gpus.push_back({prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                         prop.totalGlobalMem});
  }
  if (info.gpus.empty())
    info.noGpuReason = "no CUDA device found";
#else
  info.noGpuReason = "tgc was built without CUDA (-DTGC_CUDA=OFF)";
#endif
  return info;
}

} // namespace tgc
