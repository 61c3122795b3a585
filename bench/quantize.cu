// A measurement behind [train-speed] (BENCHMARKS.md, session 20): fp8.cuh's cast-transpose
// (quantize {transpose=true}) at every shape and source gpt-1.3b's FP8 training step quantizes
// (batch 16 x 1024), each timed alone (20 runs after 3), against a copy that moves the same bytes,
// with a checksum of everything it writes (q, qT, the amax, the saturation count, the bias
// gradient) so that two versions of the kernels can be compared bit for bit. Not part of the
// build. Built here against a folder of kernels and run on the GPU machine:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I backends/cuda/kernels -I support -DTHREADS=128 -DRESIDENT=528 \
//     -DMINBLOCKS=4 -o quantize bench/quantize.cu && ./quantize
// THREADS: the kernel's block (HEAD's before session 20: 256); RESIDENT: the most blocks a
// launch has (the lowering's 4 a multiprocessor; HEAD's before session 20 had a block a tile).
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

#include "fp8.cuh"
#include "reduce.cuh"

#ifndef THREADS
#define THREADS 128
#endif
#ifndef MINBLOCKS
#define MINBLOCKS 4
#endif
#ifndef RESIDENT
#define RESIDENT 528
#endif

#define CK(x)                                                                                                   \
  do {                                                                                                          \
    cudaError_t s = (x);                                                                                        \
    if (s != cudaSuccess) {                                                                                     \
      printf("%s at %s:%d\n", cudaGetErrorString(s), __FILE__, __LINE__);                                      \
      return 1;                                                                                                 \
    }                                                                                                           \
  } while (0)

__host__ __device__ constexpr long long blocksFor(long long tiles) {
  long long most = (tiles + RESIDENT - 1) / RESIDENT;
  return (tiles + most - 1) / most;
}

// Deterministic values: normal-ish (a sum of four uniforms) times `spread`, as fp32 or BF16 bits.
__global__ void fillValues(float *x, unsigned short *xh, long long n, unsigned seed, float spread) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float sum = 0;
    for (int k = 0; k < 4; ++k) {
      unsigned h = (unsigned)(i * 4 + k) * 2654435761u ^ seed;
      h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
      sum += (float)(h & 0xffffff) / 16777216.0f - 0.5f;
    }
    float v = sum * spread;
    if (x)
      x[i] = v;
    if (xh)
      xh[i] = bf16Bits(v);
  }
}

// The ceiling: read `in` bytes and write two outputs of `out` bytes each, 16 bytes a thread.
__global__ void copyCeiling(const uint4 *x, long long in, uint4 *a, uint4 *b, long long out) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < in / 16; i += stride) {
    uint4 v = x[i];
    if (i < out / 16) {
      a[i] = v;
      b[i] = make_uint4(v.w, v.z, v.y, v.x);
    }
  }
}

template <typename In, long long Rows, long long Cols, __nv_fp8_interpretation_t Format, int Source>
__global__ void __launch_bounds__(THREADS, MINBLOCKS) castTranspose(const In *x, const unsigned short *h, const float *scale,
                                                         const float *scaleInv, unsigned char *q, unsigned char *qT,
                                                         float *amax, float *saturations, float *partials,
                                                         float *used) {
  constexpr long long Tiles = (Rows / 64 + (Rows % 64 != 0)) * (Cols / 64 + (Cols % 64 != 0));
  constexpr long long TilesC = Cols / 64 + (Cols % 64 != 0);
  float largest = Format == __NV_E4M3 ? 448.0f : 57344.0f;
  if constexpr (Source == 0)
    quantizeTransposeBlocks<Rows, Cols, Tiles, TilesC, blocksFor(Tiles), Format, false, false>(
        quantizeX(x), scale, q, qT, scaleInv, amax, saturations, used, largest);
  else if constexpr (Source == 1)
    quantizeTransposeBlocks<Rows, Cols, Tiles, TilesC, blocksFor(Tiles), Format, false, false>(
        quantizeGelu(x), scale, q, qT, scaleInv, amax, saturations, used, largest);
  else
    quantizeTransposeBlocks<Rows, Cols, Tiles, TilesC, blocksFor(Tiles), Format, false, true>(
        quantizeGeluGradient(x, h), scale, q, qT, scaleInv, amax, saturations, used, largest, 1.0f, partials);
}

template <long long Cols, long long Chunks>
__global__ void totals(float *dbias, const float *partials) {
  columnSumTotals<Cols, Chunks>(dbias, partials);
}

unsigned long long fnv(const void *p, size_t bytes) {
  const unsigned char *b = (const unsigned char *)p;
  unsigned long long h = 1469598103934665603ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

struct Buffers {
  float *x, *scale, *scaleInv, *amax, *saturations, *partials, *used, *dbias;
  unsigned short *xh, *hh;
  unsigned char *q, *qT;
};

template <typename In, long long Rows, long long Cols, __nv_fp8_interpretation_t Format, int Source>
int measure(const char *name, int perStep, Buffers &b, double *stepMs, double *ceilingMs) {
  constexpr long long Tiles = (Rows / 64 + (Rows % 64 != 0)) * (Cols / 64 + (Cols % 64 != 0));
  const long long n = Rows * Cols;
  const In *x = std::is_same<In, float>::value ? (const In *)b.x : (const In *)b.xh;
  float scale = (Format == __NV_E4M3 ? 448.0f : 57344.0f) / 3.0f; // values beyond 3 saturate
  float scaleInv = 1 / scale;
  CK(cudaMemcpy(b.scale, &scale, 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b.scaleInv, &scaleInv, 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(b.used, 0, 5 * 4));
  auto run = [&] {
    castTranspose<In, Rows, Cols, Format, Source><<<blocksFor(Tiles), THREADS>>>(
        x, b.hh, b.scale, b.scaleInv, b.q, b.qT, b.amax, b.saturations, b.partials, b.used);
    if (Source == 2)
      totals<Cols, Rows / 64><<<(Cols + 31) / 32, 256>>>(b.dbias, b.partials);
  };
  run();
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
  std::vector<unsigned char> q(n), qT(n);
  std::vector<float> dbias(Cols), small(2);
  CK(cudaMemcpy(q.data(), b.q, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(qT.data(), b.qT, n, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&small[0], b.amax, 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&small[1], b.saturations, 4, cudaMemcpyDeviceToHost));
  if (Source == 2)
    CK(cudaMemcpy(dbias.data(), b.dbias, Cols * 4, cudaMemcpyDeviceToHost));
  unsigned long long sum = fnv(q.data(), n) ^ (fnv(qT.data(), n) * 31) ^ (fnv(small.data(), 8) * 131) ^
                           (Source == 2 ? fnv(dbias.data(), Cols * 4) * 7 : 0);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w) run();
  CK(cudaEventRecord(e0));
  for (int it = 0; it < 20; ++it) run();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  ms /= 20;
  long long inBytes = n * (long long)sizeof(In) * (Source == 2 ? 2 : 1), bytes = inBytes + 2 * n;
  CK(cudaEventRecord(e0));
  for (int it = 0; it < 20; ++it)
    copyCeiling<<<132 * 8, 256>>>((const uint4 *)b.x, inBytes, (uint4 *)b.q, (uint4 *)b.qT, n);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float copyMs;
  CK(cudaEventElapsedTime(&copyMs, e0, e1));
  copyMs /= 20;
  printf("%-34s %3lld blocks %4d thr  %8.1f us  %6.0f GB/s  (copy %6.1f us, %4.0f GB/s)  amax %.6g sat %.0f  "
         "sum %016llx\n",
         name, blocksFor(Tiles), THREADS, ms * 1e3, bytes / (ms * 1e6), copyMs * 1e3, bytes / (copyMs * 1e6),
         small[0], small[1], sum);
  *stepMs += perStep * ms;
  *ceilingMs += perStep * copyMs;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}

int main() {
  Buffers b;
  const long long most = 16384LL * 8192;
  CK(cudaMalloc(&b.x, most * 4));
  CK(cudaMalloc(&b.xh, most * 2 * 2)); // (the copy ceiling reads x's bytes; xh's twice the BF16 values)
  CK(cudaMalloc(&b.hh, most * 2));
  CK(cudaMalloc(&b.q, most));
  CK(cudaMalloc(&b.qT, most));
  CK(cudaMalloc(&b.partials, 256 * 8192 * 8));
  CK(cudaMalloc(&b.dbias, 8192 * 4));
  CK(cudaMalloc(&b.scale, 4));
  CK(cudaMalloc(&b.scaleInv, 4));
  CK(cudaMalloc(&b.amax, 4));
  CK(cudaMalloc(&b.saturations, 4));
  CK(cudaMalloc(&b.used, 8 * 4));
  fillValues<<<4096, 256>>>(b.x, b.xh, most, 17u, 1.0f);
  fillValues<<<4096, 256>>>(nullptr, b.hh, most, 91u, 2.0f);
  CK(cudaDeviceSynchronize());
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s, %d multiprocessors; THREADS %d, RESIDENT %d\n", prop.name, prop.multiProcessorCount, THREADS, RESIDENT);
  double step = 0, ceiling = 0; // a layer's quantizes (the count each: perStep)
  typedef unsigned short bf16;
  int failed = 0;
  failed |= measure<bf16, 16384, 2048, __NV_E4M3, 0>("norm out bf16 16384x2048 e4m3", 2, b, &step, &ceiling);
  failed |= measure<bf16, 16384, 2048, __NV_E4M3, 0>("attn out bf16 16384x2048 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 16384, 2048, __NV_E4M3, 0>("attn out f32 16384x2048 e4m3", 0, b, &step, &ceiling);
  failed |= measure<bf16, 16384, 8192, __NV_E4M3, 1>("gelu bf16 16384x8192 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 6144, 2048, __NV_E4M3, 0>("w qkv f32 6144x2048 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 2048, 2048, __NV_E4M3, 0>("w proj f32 2048x2048 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 8192, 2048, __NV_E4M3, 0>("w fc1 f32 8192x2048 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 2048, 8192, __NV_E4M3, 0>("w fc2 f32 2048x8192 e4m3", 1, b, &step, &ceiling);
  failed |= measure<float, 16384, 2048, __NV_E5M2, 0>("dres f32 16384x2048 e5m2", 2, b, &step, &ceiling);
  failed |= measure<bf16, 16384, 8192, __NV_E5M2, 2>("dgelu bf16 16384x8192 e5m2 +bias", 1, b, &step, &ceiling);
  failed |= measure<bf16, 16384, 6144, __NV_E5M2, 0>("dqkv bf16 16384x6144 e5m2", 1, b, &step, &ceiling);
  failed |= measure<float, 16384, 6144, __NV_E5M2, 0>("dqkv f32 16384x6144 e5m2", 0, b, &step, &ceiling);
  printf("a step of gpt-1.3b (24 layers, cuDNN's out and dqkv in BF16): %.2f ms (the copy ceiling %.2f ms)\n",
         24 * step, 24 * ceiling);
  return failed;
}
