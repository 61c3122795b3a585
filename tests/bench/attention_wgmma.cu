// The causal attention forward on Hopper's warpgroup products (attention_wgmma.cuh) against
// the mma.sync kernel it would replace (attention.cuh's attentionForwardBf16) on the same
// head-major BF16 operands: the largest difference of their outputs and log-sum-exps, then the
// time of each (#40: the attention at gpt-1.3b's shape, B 16 T 1024 and B 4 T 4096, 16 heads
// of 128; gpt2-124m's, 12 heads of 64). Causal FLOPs: 2 products of 2 B H T^2 DH / 2.
// Not part of the build (the CMake check compiles it for sm_90, where the products trap); the
// kernels stay in tests/bench (attention_wgmma.cuh, wgmma.cuh) until measured and lowered:
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ibackends/cuda/kernels -Isupport -o attention_wgmma \
//     tests/bench/attention_wgmma.cu && ./attention_wgmma
#include "attention_wgmma.cuh"
#include "bench_util.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    referenceForward(const unsigned short *heads, float *out, float *lse, float scale) {
  attentionForwardBf16<B, T, H, DH>(heads, out, lse, scale);
}

template <int B, int T, int H, int DH, bool OVERLAPPED>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    wgmmaForward(const unsigned short *heads, float *out, float *lse, float scale) {
  if constexpr (OVERLAPPED)
    attentionForwardWgmmaOverlapped<B, T, H, DH>(heads, out, lse, scale);
  else
    attentionForwardWgmma<B, T, H, DH>(heads, out, lse, scale);
}

template <int B, int T, int H, int DH, int GROUP, typename Out>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    specialisedForward(const unsigned short *tiles, Out out, float *lse, float scale) {
  attentionForwardSpecialised<B, T, H, DH, H, GROUP>(tiles, out, lse, scale);
}

__global__ void widenBf16(const unsigned short *from, float *to, long n) {
  FOR_EACH_ELEMENT(i, n) { to[i] = __uint_as_float((unsigned)from[i] << 16); }
}

template <int T, int DH> __global__ void swizzleHeads(const unsigned short *heads, unsigned short *tiles, long count) {
  toSwizzledTiles<T, DH>(heads, tiles, count);
}

static float largestDifference(const float *a, const float *b, long n, double *scaleOf) {
  std::vector<float> x(n), y(n);
  CK(cudaMemcpy(x.data(), a, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, n * 4, cudaMemcpyDeviceToHost));
  double largest = 0, size = 0;
  for (long i = 0; i < n; ++i) {
    largest = std::max(largest, (double)std::fabs(x[i] - y[i]));
    size = std::max(size, (double)std::fabs(x[i]));
    if (!std::isfinite(y[i]))
      largest = INFINITY;
  }
  *scaleOf = size;
  return (float)largest;
}

// One shape: the five kernels once, the wgmma ones compared with mma.sync's; then each timed
// (TIMED: the larger shapes).
template <int B, int T, int H, int DH> void compare(bool timed) {
  constexpr long PART = (long)B * H * T * DH, ROWS = (long)B * H * T;
  unsigned short *heads;
  CK(cudaMalloc(&heads, 3 * PART * 2));
  fillBits<<<1024, 256>>>(heads, 3 * PART, 1234u + T + DH, 0x3f00); // +-[0.5, 1): scores of a few units
  constexpr int KERNELS = 11;
  constexpr int ALL = B * H, L2 = attentionHeadsInL2<B, T, H, DH>(); // heads a group of the work order
  unsigned short *tiles; // q, k, v in the products' layout, for the warp-specialised kernel
  CK(cudaMalloc(&tiles, 3L * B * H * SwizzledTiles<T, DH>::HEAD * 2));
  swizzleHeads<T, DH><<<1024, 256>>>(heads, tiles, 3L * B * H);
  AttentionMaps maps{}; // (no dout)
  encodeHeads(&maps.heads, heads, 3L * B * H, T, DH);
  float *out[KERNELS], *lse[KERNELS];
  for (int i = 0; i < KERNELS; ++i) {
    CK(cudaMalloc(&out[i], PART * 4));
    CK(cudaMalloc(&lse[i], ROWS * 4));
    CK(cudaMemset(out[i], 0xff, PART * 4)); // NaN where a kernel leaves a value unwritten
  }
  const float scale = 1.0f / std::sqrt((float)DH);
  const int shared[2] = {attentionWgmmaShared<DH, 2>(), attentionWgmmaShared<DH, 3>()};
  CK(cudaFuncSetAttribute(wgmmaForward<B, T, H, DH, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared[0]));
  CK(cudaFuncSetAttribute(wgmmaForward<B, T, H, DH, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared[1]));
  const int specialisedShared = attentionSpecialisedShared<DH>();
  CK(cudaFuncSetAttribute(specialisedForward<B, T, H, DH, ALL, float *>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  CK(cudaFuncSetAttribute(specialisedForward<B, T, H, DH, ALL, Bf16Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  CK(cudaFuncSetAttribute(specialisedForward<B, T, H, DH, L2, Bf16Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  CK(cudaFuncSetAttribute(mappedForward<B, T, H, DH, H, L2, Bf16Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  unsigned short *outBf16; // the output as tgc would take it to the projection's GEMM (and cuDNN gives it)
  CK(cudaMalloc(&outBf16, PART * 2));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long refBlocks = (long)B * H * ((T + 63) / 64), blocks = (long)B * H * ((T + kWgmmaRows - 1) / kWgmmaRows);
  auto run = [&](int i, cudaStream_t st) {
    if (i == 0)
      referenceForward<B, T, H, DH><<<refBlocks, kAttentionThreads, 0, st>>>(heads, out[0], lse[0], scale);
    else if (i == 1)
      wgmmaForward<B, T, H, DH, false><<<blocks, kWgmmaThreads, shared[0], st>>>(heads, out[1], lse[1], scale);
    else if (i == 2)
      wgmmaForward<B, T, H, DH, true><<<blocks, kWgmmaThreads, shared[1], st>>>(heads, out[2], lse[2], scale);
    else if (i <= 4) // a block an item, or (4) persistent: a block an SM
      specialisedForward<B, T, H, DH, ALL>
          <<<i == 3 ? blocks : std::min(blocks, (long)sms), kSpecialisedThreads, specialisedShared, st>>>(
              tiles, out[i], lse[i], scale);
    else if (i <= 6) // the same with BF16 outputs
      specialisedForward<B, T, H, DH, ALL>
          <<<i == 5 ? blocks : std::min(blocks, (long)sms), kSpecialisedThreads, specialisedShared, st>>>(
              tiles, Bf16Out{outBf16}, lse[i], scale);
    else if (i <= 8) // and the heads in groups that fit L2
      specialisedForward<B, T, H, DH, L2>
          <<<i == 7 ? blocks : std::min(blocks, (long)sms), kSpecialisedThreads, specialisedShared, st>>>(
              tiles, Bf16Out{outBf16}, lse[i], scale);
    else // and the operands by tensor maps
      mappedForward<B, T, H, DH, H, L2, Bf16Out>
          <<<i == 9 ? blocks : std::min(blocks, (long)sms), kSpecialisedThreads, specialisedShared, st>>>(
              maps, Bf16Out{outBf16}, lse[i], scale);
  };
  const char *names[KERNELS] = {"mma.sync",
                                "wgmma",
                                "wgmma overlapped",
                                "wgmma warp-specialised",
                                "wgmma warp-specialised, persistent",
                                "wgmma warp-specialised, BF16 out",
                                "wgmma warp-specialised, persistent, BF16 out",
                                "wgmma warp-specialised, BF16 out, heads grouped for L2",
                                "wgmma warp-specialised, persistent, BF16 out, heads grouped for L2",
                                "wgmma warp-specialised, BF16 out, grouped, operands by tensor maps",
                                "wgmma warp-specialised, persistent, BF16 out, grouped, by tensor maps"};
  for (int i = 0; i < KERNELS; ++i) {
    run(i, 0);
    if (i >= 5)
      widenBf16<<<1024, 256>>>(outBf16, out[i], PART);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  }
  printf("B %d T %d H %d DH %d (%d heads a group for L2):\n", B, T, H, DH, L2);
  for (int i = 1; i < KERNELS; ++i) {
    double outSize, lseSize;
    float outDiff = largestDifference(out[0], out[i], PART, &outSize);
    float lseDiff = largestDifference(lse[0], lse[i], ROWS, &lseSize);
    printf("  %s: out differs by %.3g (of %.3g), lse by %.3g (of %.3g)%s\n", names[i], outDiff, outSize, lseDiff,
           lseSize, outDiff < 2e-2 * outSize && lseDiff < 1e-3 * lseSize ? "" : "  ** MISMATCH **");
  }
  if (timed) {
    double flops = 4.0 * B * H * (double)T * T * DH / 2;
    for (int i = 0; i < KERNELS; ++i) {
      float us = timeGraph(10, [&](int, cudaStream_t st) { run(i, st); });
      printf("  %s %.1f us (%.0f TFLOP/s)\n", names[i], us, flops / us / 1e6);
    }
  }
  for (int i = 0; i < KERNELS; ++i) {
    CK(cudaFree(out[i]));
    CK(cudaFree(lse[i]));
  }
  CK(cudaFree(outBf16));
  CK(cudaFree(tiles));
  CK(cudaFree(heads));
}

// With an argument ("profile"): the T 4096 shape alone, untimed, each kernel launched once (for
// ncu: `ncu -k regex:specialised ./attention_wgmma profile`).
int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0); // each line to the log as it comes: a kernel that hangs loses none
  if (argc > 1) {
    compare<4, 4096, 16, 128>(false);
    return 0;
  }
  memoryBandwidth();
  compare<1, 200, 2, 64>(false); // T past a tile, not a multiple of one
  compare<1, 200, 2, 128>(false);
  compare<2, 1024, 4, 128>(false);
  compare<16, 1024, 12, 64>(true);  // gpt2-124m
  compare<16, 1024, 16, 128>(true); // gpt-1.3b
  compare<4, 4096, 16, 128>(true);  // gpt-1.3b at T 4096
  return 0;
}
