// The Hopper attention kernels that wait in tests/bench for their lowering (wgmma.cuh,
// attention_wgmma*.cuh) compile under NVRTC for sm_90a as tgc would compile them: the options
// Nvrtc.cpp passes, the headers from the source tree, the kernel templates instantiated by name.
// nvcc's check for sm_90 (tgc_kernel_check) leaves their warpgroup instructions out (they exist
// on sm_90a alone); here ptxas sees them, and its warnings (a product serialised, registers
// spilled into local memory past a few bytes) fail the test. No GPU needed.
#ifdef TGC_HAVE_CUDA
#include "backends/cuda/libraries/Nvrtc.h"

#include <iterator>
#include <nvrtc.h>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

// The headers' kernel templates (attention_wgmma_fused_grad.cuh's fusedGradMapped,
// attention_wgmma.cuh's mappedForward), instantiated by NVRTC's name expressions: the fused
// gradient (FlashAttention-3's order, operands by tensor maps, BF16 gradients) at gpt-1.3b's
// shape at T 4096 and gpt2-124m's (head dim 64, where each warpgroup's dq is its own), its lagged
// flavour, and the forward by tensor maps.
const char *kSource = "#include \"attention_wgmma_fused_grad.cuh\"\n";
const char *kKernels[] = {
    "fusedGradMapped<4, 4096, 16, 128, kOverlapped, Bf16Out>",
    "fusedGradMapped<16, 1024, 12, 64, kOverlapped, Bf16Out>",
    "fusedGradMapped<4, 4096, 16, 128, kLagged, Bf16Out>",
    "mappedForward<4, 4096, 16, 128, 16, 12, Bf16Out>",
};

TEST(WgmmaNvrtc, FusedGradientsAndForwardCompileForSm90a) {
  const std::string root = TGC_SOURCE_DIR;
  std::vector<std::string> options = {"--gpu-architecture=sm_90a",
                                      "-std=c++17",
                                      "-default-device",
                                      "-Xptxas=-v",
                                      "--include-path=" + root + "/tests/bench",
                                      "--include-path=" + root + "/backends/cuda/kernels",
                                      "--include-path=" + root + "/support"};
  if (std::string cuda = tgc::cudaIncludeDir(); !cuda.empty())
    options.push_back("--include-path=" + cuda);
  std::vector<const char *> argv;
  for (const std::string &o : options)
    argv.push_back(o.c_str());
  nvrtcProgram program;
  ASSERT_EQ(nvrtcCreateProgram(&program, kSource, "wgmma_check.cu", 0, nullptr, nullptr), NVRTC_SUCCESS);
  for (const char *kernel : kKernels)
    ASSERT_EQ(nvrtcAddNameExpression(program, kernel), NVRTC_SUCCESS) << kernel;
  const nvrtcResult result = nvrtcCompileProgram(program, int(argv.size()), argv.data());
  size_t size = 0;
  nvrtcGetProgramLogSize(program, &size);
  std::string log(size, '\0');
  if (size)
    nvrtcGetProgramLog(program, log.data());
  size_t cubin = 0;
  std::vector<std::string> lowered; // the kernels' mangled names, as ptxas reports them
  if (result == NVRTC_SUCCESS) {
    nvrtcGetCUBINSize(program, &cubin);
    for (const char *kernel : kKernels)
      if (const char *name = nullptr; nvrtcGetLoweredName(program, kernel, &name) == NVRTC_SUCCESS)
        lowered.push_back(name);
  }
  nvrtcDestroyProgram(&program);
  ASSERT_EQ(result, NVRTC_SUCCESS) << log;
  EXPECT_GT(cubin, 0u);
  EXPECT_EQ(log.find("warning"), std::string::npos) << log;
  // ptxas's -v report for each kernel: the consumers spill nothing; the producer warpgroup's
  // lanes (24 registers after setmaxnreg) a few bytes at most.
  ASSERT_EQ(lowered.size(), std::size(kKernels));
  for (const std::string &kernel : lowered) {
    std::smatch spill;
    const std::regex report("Function properties for " + kernel + R"(\n[^\n]*?(\d+) bytes spill stores)");
    ASSERT_TRUE(std::regex_search(log, spill, report)) << kernel << " has no ptxas report:\n" << log;
    EXPECT_LE(std::stoi(spill[1]), 32) << kernel << "\n" << log;
  }
}

} // namespace
#endif
