// cuDNN's attention in FP8 against BF16 at a model's shape, forward and gradient apart: what
// [fp8-te]'s FP8 attention target measures (each at least 1.3x BF16's). Each graph's engine
// configurations (up to CudnnAttention::kMaxCandidates) are timed and the fastest reported, as
// tgc's runtime chooses. Built with the CUDA backend (tgc_attention_bench); run on the GPU:
//   build/bench/tgc_attention_bench [--bf16] [B T H DH]...   (default: gpt-1.3b's 16 1024 16 128)
// --bf16: BF16 alone (the FP8 plans take cuDNN a minute a shape to find; the BF16 one seconds).
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/runtime/DeviceMemory.h"
#include "support/Numerics.h"
#include "support/Random.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

using namespace tgc;

namespace {

/// A measurement's buffers (DeviceMemory's, freed together); a failed allocation ends the run.
struct Gpu {
  DeviceMemory memory;
  void *alloc(size_t bytes) { return check(memory.allocate(bytes, /*zero=*/true, "benchmark")); }
  static void *check(llvm::Expected<void *> p) {
    if (!p) {
      fmt::print(stderr, "{}\n", llvm::toString(p.takeError()));
      std::exit(1);
    }
    return *p;
  }
  /// Random values of standard deviation `std`, as FP8 E4M3 or BF16.
  void *values(size_t n, bool fp8, float std, Rng &rng) {
    std::vector<uint8_t> host(n * (fp8 ? 1 : 2));
    for (size_t i = 0; i < n; ++i) {
      float x = float(rng.normal()) * std;
      if (fp8) {
        host[i] = floatToFp8(x, Fp8Format::E4M3);
      } else {
        uint16_t b = floatToBf16(x);
        host[2 * i] = uint8_t(b), host[2 * i + 1] = uint8_t(b >> 8);
      }
    }
    return check(memory.upload(host.data(), host.size(), "benchmark"));
  }
  void *scalar(float x) { return check(memory.upload(&x, 4, "benchmark")); }
};

/// The mean milliseconds of one run of `plan`'s candidate `c`: 5 warm-up runs, then 20 timed.
double timeRun(const CudnnAttention &plan, void *handle, const CudnnAttention::Buffers &b, int c) {
  for (int i = 0; i < 5; ++i)
    if (auto err = plan.run(handle, b, c)) {
      fmt::print(stderr, "{}\n", llvm::toString(std::move(err)));
      return -1;
    }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0), cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 20; ++i)
    llvm::consumeError(plan.run(handle, b, c));
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0), cudaEventDestroy(e1);
  return cudaGetLastError() == cudaSuccess ? ms / 20 : -1;
}

/// Builds `s`'s plans, runs each on fresh buffers and returns the fastest's milliseconds (or a
/// negative number, having said why).
double measure(const CudnnApi &api, void *handle, const CudnnAttentionShape &s, Rng &rng) {
  auto plan = CudnnAttention::create(api, handle, s);
  if (!plan) {
    fmt::print("  {}: {}\n", s.key(), llvm::toString(plan.takeError()));
    return -1;
  }
  Gpu gpu;
  const size_t n = size_t(s.B * s.T * s.H * s.DH), stats = size_t(s.B * s.H * s.T) * 4;
  const bool fp8 = s.fp8.enabled;
  auto bytes = [&](CudnnType t) { return n * (t == CudnnType::Bf16 ? 2 : 1); };
  std::vector<void *> p;
  void *q = gpu.values(n, fp8, 1, rng), *k = gpu.values(n, fp8, 1, rng), *v = gpu.values(n, fp8, 1, rng);
  CudnnType outType = fp8 ? s.fp8.out : CudnnType::Bf16;
  void *out = gpu.values(n, outType != CudnnType::Bf16, 0.1f, rng);
  if (!s.backward) {
    p = {q, k, v, out, gpu.alloc(stats)};
    if (fp8)
      for (float x : {1.f, 1.f, 1.f, 1 / 448.f, 448.f, 1.f, 0.f, 0.f})
        p.push_back(gpu.scalar(x));
  } else {
    CudnnType dqkv = fp8 ? s.fp8.dqkv : CudnnType::Bf16;
    uint8_t *grads = static_cast<uint8_t *>(gpu.alloc(3 * bytes(dqkv)));
    size_t D = size_t(s.H * s.DH) * (dqkv == CudnnType::Bf16 ? 2 : 1);
    p = {q, k, v, out, gpu.values(n, fp8, fp8 ? 16 : 0.01f, rng), gpu.alloc(stats), grads, grads + D, grads + 2 * D};
    if (fp8)
      for (float x : {1.f, 1.f, 1.f, 1.f, 1 / 4096.f, 1 / 448.f, 1 / 4096.f, 448.f, 4096.f, 1.f, 1.f, 1.f, 0.f, 0.f,
                      0.f, 0.f})
        p.push_back(gpu.scalar(x));
    else
      p.push_back(gpu.alloc(stats)); // the softmax sums
  }
  void *workspace = gpu.alloc(size_t((*plan)->largestWorkspaceBytes()));
  auto buffers = (*plan)->buffers(p, workspace);
  if (!buffers) {
    fmt::print("  {}: {}\n", s.key(), llvm::toString(buffers.takeError()));
    return -1;
  }
  double best = -1;
  std::string each;
  for (size_t c = 0; c < (*plan)->candidates(); ++c) {
    double ms = timeRun(**plan, handle, **buffers, int(c));
    each += fmt::format(" {}:{:.3f}", (*plan)->engineConfig(c), ms);
    if (ms > 0 && (best < 0 || ms < best))
      best = ms;
  }
  fmt::print("  {}: {:.3f} ms (configurations{})\n", s.key(), best, each);
  return best;
}

} // namespace

int main(int argc, char **argv) {
  std::vector<std::array<int64_t, 4>> shapes;
  const bool bf16Only = argc > 1 && std::string(argv[1]) == "--bf16";
  for (int i = bf16Only ? 2 : 1; i + 3 < argc; i += 4)
    shapes.push_back({std::atoll(argv[i]), std::atoll(argv[i + 1]), std::atoll(argv[i + 2]), std::atoll(argv[i + 3])});
  if (shapes.empty())
    shapes.push_back({16, 1024, 16, 128});
  auto api = loadCudnn();
  if (!api) {
    fmt::print(stderr, "{}\n", llvm::toString(api.takeError()));
    return 1;
  }
  void *handle = nullptr;
  if ((*api)->create(&handle) != 0) {
    fmt::print(stderr, "error: cudnnCreate failed (no GPU?)\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  fmt::print("cuDNN {} on {}\n", (*api)->versionText(), prop.name);
  Rng rng(1);
  for (auto [B, T, H, DH] : shapes) {
    CudnnAttentionShape s;
    s.B = B, s.T = T, s.H = H, s.DH = DH, s.scale = 1 / std::sqrt(double(DH));
    // Causal: half the scores. Forward 2 products, the gradient 5 (P recomputed, dv, dP, dq, dk).
    double forwardFlops = 2.0 * 2 * B * H * T * T * DH / 2, backwardFlops = forwardFlops * 2.5;
    for (bool backward : {false, true}) {
      s.backward = backward;
      double flops = backward ? backwardFlops : forwardFlops;
      fmt::print("B {} T {} H {} DH {} {}:\n", B, T, H, DH, backward ? "gradient" : "forward");
      s.fp8 = {};
      double bf16 = measure(**api, handle, s, rng);
      std::vector<CudnnFp8> variants;
      if (bf16Only)
        continue;
      if (!backward)
        variants = {{true, CudnnType::Bf16}, {true, CudnnType::E4M3}};
      else
        variants = {{true, CudnnType::Bf16, CudnnType::E4M3, CudnnType::Bf16}, // tgc's
                    {true, CudnnType::Bf16, CudnnType::E4M3, CudnnType::E4M3}};
      for (const CudnnFp8 &f : variants) {
        s.fp8 = f;
        double ms = measure(**api, handle, s, rng);
        if (ms > 0 && bf16 > 0)
          fmt::print("    fp8 {:.1f} TFLOP/s, bf16 {:.1f} TFLOP/s: {:.2f}x\n", flops / ms / 1e9, flops / bf16 / 1e9,
                     bf16 / ms);
      }
    }
  }
  (*api)->destroy(handle);
  return 0;
}
