// The causal attention's gradient on Hopper's warpgroup products (attention_wgmma_grad.cuh: dk
// and dv by key tiles, dq by query tiles) against the mma.sync kernels they would replace
// (attention.cuh's attentionKeyValueGradBf16 and attentionQueryGradBf16) on the same operands:
// head-major BF16 q, k, v and dout, the forward's lse (attentionForwardBf16's), delta drawn. The
// largest difference of dq, dk and dv (the warp-specialised dk dv kernel: dk and dv, its
// operands in SwizzledTiles' layout), then the time of each kernel (#40: gpt-1.3b's shape at T
// 1024 and 4096, gpt2-124m's). FLOPs: 4 causal products of 2 B H T^2 DH / 2 for dk dv (s^T,
// dp^T, dv, dk), 3 for dq (s, dp, dq); the sum against cuDNN's gradient is counted as 5.
// Not part of the build (the CMake check compiles it for sm_90, where the products trap):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ibackends/cuda/kernels -Isupport -o attention_wgmma_grad \
//     tests/bench/attention_wgmma_grad.cu && ./attention_wgmma_grad
#include "attention_wgmma_fused_grad.cuh"
#include "bench_util.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    forward(const unsigned short *heads, float *out, float *lse, float scale) {
  attentionForwardBf16<B, T, H, DH>(heads, out, lse, scale);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    referenceGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
                  const float *delta) {
  attentionKeyValueGradBf16<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    referenceQueryGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale,
                       const float *lse, const float *delta) {
  attentionQueryGradBf16<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    wgmmaQueryGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
                   const float *delta) {
  attentionQueryGradWgmma<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    wgmmaGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
              const float *delta) {
  attentionKeyValueGradWgmma<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    specialisedGrad(const unsigned short *tiles, float *dqkv, float scale, const float *lse, const float *delta) {
  attentionKeyValueGradSpecialised<B, T, H, DH>(tiles, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH, bool ORDERED = true, bool REVERSED = false, bool PACKED = true>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    fusedGrad(const unsigned short *tiles, float *dqkv, float scale, const float *lse, const float *delta,
              FusedGradBuffers buffers) {
  attentionGradFused<B, T, H, DH, ORDERED, REVERSED, PACKED>(tiles, dqkv, scale, lse, delta, buffers);
}

template <int B, int T, int H, int DH, bool PACKED = true>
__global__ void fusedQueryGrads(const float *dq, float *dqkv) {
  attentionFusedQueryGrads<B, T, H, DH, PACKED>(dq, dqkv);
}

template <int T, int DH> __global__ void swizzleHeads(const unsigned short *heads, unsigned short *tiles, long count) {
  toSwizzledTiles<T, DH>(heads, tiles, count);
}

// delta: n values of +-[0.5, 1) from the hashed bits.
__global__ void fillDelta(float *x, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u;
    h ^= h >> 13;
    x[i] = ((h & 1) ? -1.0f : 1.0f) * (0.5f + (h >> 9) * 0x1p-24f);
  }
}

template <int B, int T, int H, int DH> void compare(bool timed) {
  constexpr long PART = (long)B * H * T * DH, ROWS = (long)B * H * T;
  unsigned short *heads, *dout;
  CK(cudaMalloc(&heads, 3 * PART * 2));
  CK(cudaMalloc(&dout, PART * 2));
  fillBits<<<1024, 256>>>(heads, 3 * PART, 1234u + T + DH, 0x3f00); // +-[0.5, 1)
  fillBits<<<1024, 256>>>(dout, PART, 99u + T, 0x3f00);
  constexpr int VARIANTS = 6;
  float *out, *lse, *delta, *dqkv[VARIANTS] = {};
  CK(cudaMalloc(&out, PART * 4));
  CK(cudaMalloc(&lse, ROWS * 4));
  CK(cudaMalloc(&delta, ROWS * 4));
  fillDelta<<<256, 256>>>(delta, ROWS);
  const float scale = 1.0f / std::sqrt((float)DH);
  forward<B, T, H, DH><<<B * H *((T + 63) / 64), kAttentionThreads>>>(heads, out, lse, scale);
  unsigned short *tiles; // q, k, v, dout in the products' layout, for the warp-specialised kernel
  const long TILED = (long)B * H * SwizzledTiles<T, DH>::HEAD;
  CK(cudaMalloc(&tiles, 4 * TILED * 2));
  swizzleHeads<T, DH><<<1024, 256>>>(heads, tiles, 3L * B * H);
  swizzleHeads<T, DH><<<1024, 256>>>(dout, tiles + 3 * TILED, (long)B * H);
  FusedGradBuffers buffers{};
  constexpr long QTILES = (T + kGradQueries - 1) / kGradQueries;
  CK(cudaMalloc(&buffers.dq, PART * 4));
  CK(cudaMalloc(&buffers.added, B * H * QTILES * 4));
  for (int i = 0; i < VARIANTS; ++i) {
    CK(cudaMalloc(&dqkv[i], 3 * PART * 4));
    CK(cudaMemset(dqkv[i], 0, 3 * PART * 4));
  }
  const int shared = attentionGradWgmmaShared<DH>(), queryShared = attentionQueryGradWgmmaShared<DH>();
  CK(cudaFuncSetAttribute(wgmmaGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
  CK(cudaFuncSetAttribute(wgmmaQueryGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, queryShared));
  const int specialisedShared = attentionGradSpecialisedShared<DH>();
  CK(cudaFuncSetAttribute(specialisedGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  const int fusedShared = attentionFusedGradShared<DH>();
  CK(cudaFuncSetAttribute(fusedGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, fusedShared));
  CK(cudaFuncSetAttribute(fusedGrad<B, T, H, DH, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, fusedShared));
  CK(cudaFuncSetAttribute(fusedGrad<B, T, H, DH, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          fusedShared));
  const int paddedShared = attentionFusedGradShared<DH, false>();
  CK(cudaFuncSetAttribute(fusedGrad<B, T, H, DH, true, false, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          paddedShared));
  const long tiles64 = B * H * ((T + 63) / 64), tiles128 = B * H * ((T + kWgmmaRows - 1) / kWgmmaRows);
  // 0, 1: mma.sync's dk dv and dq (into dqkv[0]); 2, 3: wgmma's (into dqkv[1]); 4: the
  // warp-specialised dk dv (into dqkv[2]: dk and dv alone); 5: the fused gradient (into dqkv[3],
  // its buffers zeroed first and dq converted after); 6: the same unordered (timed alone); 7:
  // the zeroing and conversion alone; 8: the fused gradient reversed (into dqkv[4]); 9: with
  // padded staging rows, a bulk reduction a row (into dqkv[5])
  auto run = [&](int i, cudaStream_t st) {
    if (i == 0)
      referenceGrad<B, T, H, DH><<<tiles64, kAttentionThreads, 0, st>>>(dout, heads, dqkv[0], scale, lse, delta);
    else if (i == 1)
      referenceQueryGrad<B, T, H, DH><<<tiles64, kAttentionThreads, 0, st>>>(dout, heads, dqkv[0], scale, lse, delta);
    else if (i == 2)
      wgmmaGrad<B, T, H, DH><<<tiles128, kWgmmaThreads, shared, st>>>(dout, heads, dqkv[1], scale, lse, delta);
    else if (i == 3)
      wgmmaQueryGrad<B, T, H, DH>
          <<<tiles128, kWgmmaThreads, queryShared, st>>>(dout, heads, dqkv[1], scale, lse, delta);
    else if (i == 4)
      specialisedGrad<B, T, H, DH>
          <<<tiles128, kSpecialisedThreads, specialisedShared, st>>>(tiles, dqkv[2], scale, lse, delta);
    else {
      CK(cudaMemsetAsync(buffers.dq, 0, PART * 4, st));
      CK(cudaMemsetAsync(buffers.added, 0, B * H * QTILES * 4, st));
      if (i == 5)
        fusedGrad<B, T, H, DH>
            <<<tiles128, kSpecialisedThreads, fusedShared, st>>>(tiles, dqkv[3], scale, lse, delta, buffers);
      else if (i == 6)
        fusedGrad<B, T, H, DH, false>
            <<<tiles128, kSpecialisedThreads, fusedShared, st>>>(tiles, dqkv[3], scale, lse, delta, buffers);
      else if (i == 8)
        fusedGrad<B, T, H, DH, true, true>
            <<<tiles128, kSpecialisedThreads, fusedShared, st>>>(tiles, dqkv[4], scale, lse, delta, buffers);
      else if (i == 9)
        fusedGrad<B, T, H, DH, true, false, false>
            <<<tiles128, kSpecialisedThreads, paddedShared, st>>>(tiles, dqkv[5], scale, lse, delta, buffers);
      if (i == 9)
        fusedQueryGrads<B, T, H, DH, false><<<1024, 256, 0, st>>>(buffers.dq, dqkv[5]);
      else
        fusedQueryGrads<B, T, H, DH><<<1024, 256, 0, st>>>(buffers.dq, dqkv[i == 8 ? 4 : 3]);
    }
  };
  for (int i : {0, 1, 2, 3, 4, 5, 8, 9}) {
    run(i, 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
  }
  std::vector<float> x(3 * PART), y(3 * PART);
  CK(cudaMemcpy(x.data(), dqkv[0], 3 * PART * 4, cudaMemcpyDeviceToHost));
  printf("B %d T %d H %d DH %d:\n", B, T, H, DH);
  for (int variant = 1; variant < VARIANTS; ++variant) {
    CK(cudaMemcpy(y.data(), dqkv[variant], 3 * PART * 4, cudaMemcpyDeviceToHost));
    double largest[3] = {}, size[3] = {};
    for (long i = 0; i < 3 * PART; ++i) {
      int part = (int)(i % (3L * H * DH) / (H * DH)); // q, k, v
      if (variant == 2 && part == 0)
        continue; // the warp-specialised kernel writes dk and dv alone
      largest[part] = std::max(largest[part], std::isfinite(y[i]) ? (double)std::fabs(x[i] - y[i]) : INFINITY);
      size[part] = std::max(size[part], (double)std::fabs(x[i]));
    }
    const char *names[VARIANTS] = {
        "", "wgmma", "wgmma warp-specialised", "wgmma fused", "wgmma fused reversed", "wgmma fused padded"};
    printf("  %s:", names[variant]);
    const char *parts[3] = {"dq", "dk", "dv"};
    for (int part = variant == 2 ? 1 : 0; part < 3; ++part)
      printf(" %s differs by %.3g (of %.3g)%s", parts[part], largest[part], size[part],
             largest[part] < 2e-2 * size[part] ? "" : " ** MISMATCH **");
    printf("\n");
  }
  if (timed) {
    const double product = 2.0 * B * H * (double)T * T * DH / 2; // FLOPs of one causal product
    float us[5];
    const char *names[5] = {"mma.sync dk dv", "mma.sync dq", "wgmma dk dv", "wgmma dq", "wgmma dk dv warp-specialised"};
    for (int i = 0; i < 5; ++i) {
      us[i] = timeGraph(10, [&](int, cudaStream_t st) { run(i, st); });
      printf("  %s %.1f us (%.0f TFLOP/s)\n", names[i], us[i], (i % 2 ? 3 : 4) * product / us[i] / 1e6);
    }
    printf("  the gradient (5 products' FLOPs, as cuDNN's is counted): mma.sync %.1f us (%.0f TFLOP/s), wgmma %.1f us "
           "(%.0f TFLOP/s)\n",
           us[0] + us[1], 5 * product / (us[0] + us[1]) / 1e6, us[2] + us[3], 5 * product / (us[2] + us[3]) / 1e6);
    printf("  with the warp-specialised dk dv: %.1f us (%.0f TFLOP/s)\n", us[4] + us[3],
           5 * product / (us[4] + us[3]) / 1e6);
    float fused = timeGraph(10, [&](int, cudaStream_t st) { run(5, st); });
    printf("  fused (dq added in order; its zeroing and conversion included): %.1f us (%.0f TFLOP/s)\n", fused,
           5 * product / fused / 1e6);
    float unordered = timeGraph(10, [&](int, cudaStream_t st) { run(6, st); });
    float around = timeGraph(10, [&](int, cudaStream_t st) { run(7, st); });
    printf("  fused unordered (not deterministic): %.1f us (%.0f TFLOP/s); the zeroing and conversion alone %.1f us\n",
           unordered, 5 * product / unordered / 1e6, around);
    float reversed = timeGraph(10, [&](int, cudaStream_t st) { run(8, st); });
    printf("  fused reversed (the longest blocks first; in order): %.1f us (%.0f TFLOP/s)\n", reversed,
           5 * product / reversed / 1e6);
    float padded = timeGraph(10, [&](int, cudaStream_t st) { run(9, st); });
    printf("  fused padded (a bulk reduction a row; in order): %.1f us (%.0f TFLOP/s)\n", padded,
           5 * product / padded / 1e6);
  }
  for (float *p : {out, lse, delta, dqkv[0], dqkv[1], dqkv[2], dqkv[3], dqkv[4], dqkv[5], buffers.dq})
    CK(cudaFree(p));
  CK(cudaFree(buffers.added));
  CK(cudaFree(tiles));
  CK(cudaFree(heads));
  CK(cudaFree(dout));
}

// With an argument ("profile"): the T 4096 shape alone, untimed, each kernel launched once (for
// ncu: `ncu -k regex:fusedGrad ./attention_wgmma_grad profile`).
int main(int argc, char **argv) {
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
