// A measurement for [gen-speed]: would FP8 weights pay in a batch-1 decode step? The step's
// products, 12 layers of gpt2-124m (qkv 2304 x 768, proj 768 x 768, fc1 3072 x 768, fc2
// 768 x 3072) and the head (50304 x 768), one row each, back to back in one CUDA graph under
// programmatic dependent launch as the executor runs them: gemv.cuh's BF16 GEMV, against the same
// kernel reading E4M3 weights (one byte each, a per-tensor scale_inv applied to the sum). What the
// chain saves bounds what FP8 weights could save a step. Not part of the build:
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -cudart static -I backends/cuda/kernels \
//       tests/bench/decode_gemv_fp8.cu -o decode_gemv_fp8 && ./decode_gemv_fp8
#include "gemv.cuh"

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                                \
  do {                                                                                             \
    cudaError_t e = (call);                                                                        \
    if (e != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e));              \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

// gemvBf16Rows's scheme (C = KS = 1) with one-byte weights: a warp per output column, its row loaded 16 bytes
// (16 weights) a lane before the kernel awaits the one before it, the sum times scale_inv.
template <int64 N, int64 K>
__global__ void gemvFp8(const float *x, const unsigned char *w, float scaleInv, const float *bias, float *out) {
  constexpr int Loads = (int)((K + 511) / 512);
  int64 n = blockIdx.x * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint4 row[Loads];
#pragma unroll
  for (int i = 0; i < Loads; ++i) {
    int64 k = lane * 16 + 512 * i;
    row[i] = n < N && k < K ? *(const uint4 *)(w + n * K + k) : make_uint4(0, 0, 0, 0);
  }
  awaitPreviousKernel();
  if (n >= N)
    return;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < Loads; ++i) {
    int64 k = lane * 16 + 512 * i;
    if (k >= K)
      break;
    const unsigned words[4] = {row[i].x, row[i].y, row[i].z, row[i].w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float4 v = *(const float4 *)(x + k + 4 * q);
      __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[q] & 0xffff), __NV_E4M3);
      __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(words[q] >> 16), __NV_E4M3);
      float2 a = __half22float2(*(const __half2 *)&lo), b = __half22float2(*(const __half2 *)&hi);
      acc += a.x * roundBf16(v.x) + a.y * roundBf16(v.y) + b.x * roundBf16(v.z) + b.y * roundBf16(v.w);
    }
  }
  acc = warpSum(acc);
  if (lane == 0)
    out[n] = acc * scaleInv + bias[n];
}

template <int64 N, int64 K>
__global__ void gemvBf16Kernel(const float *x, const unsigned short *w, const float *bias, float *out) {
  gemvBf16<1, N, K, 1, 1, true, false>(x, w, bias, out, nullptr);
}

struct Product {
  int64_t n, k;
  unsigned short *bf16 = nullptr;
  unsigned char *fp8 = nullptr;
  float *bias = nullptr, *out = nullptr, *x = nullptr;
};

template <int64 N, int64 K>
void launch(const Product &p, bool fp8, cudaStream_t stream, bool programmatic) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned((N + 7) / 8));
  config.blockDim = dim3(256);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  if (fp8)
    CHECK(cudaLaunchKernelEx(&config, gemvFp8<N, K>, (const float *)p.x, (const unsigned char *)p.fp8, 0.01f,
                             (const float *)p.bias, p.out));
  else
    CHECK(cudaLaunchKernelEx(&config, gemvBf16Kernel<N, K>, (const float *)p.x, (const unsigned short *)p.bf16,
                             (const float *)p.bias, p.out));
}

void launchAny(const Product &p, bool fp8, cudaStream_t stream, bool programmatic) {
  if (p.n == 2304)
    launch<2304, 768>(p, fp8, stream, programmatic);
  else if (p.n == 768 && p.k == 768)
    launch<768, 768>(p, fp8, stream, programmatic);
  else if (p.n == 3072)
    launch<3072, 768>(p, fp8, stream, programmatic);
  else if (p.n == 768)
    launch<768, 3072>(p, fp8, stream, programmatic);
  else
    launch<50304, 768>(p, fp8, stream, programmatic);
}

int main() {
  std::vector<Product> products;
  for (int layer = 0; layer < 12; ++layer)
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}})
      products.push_back({n, k});
  products.push_back({50304, 768});
  size_t weightBytes = 0;
  for (Product &p : products) {
    std::vector<unsigned short> host(p.n * p.k);
    std::vector<unsigned char> host8(p.n * p.k);
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = (unsigned short)(0x3c00 + (i * 2654435761u >> 20) % 256); // BF16 values in [2^-7, 2^-6)
      host8[i] = (unsigned char)(0x20 + (i * 2654435761u >> 20) % 64);      // E4M3 values of that order
    }
    CHECK(cudaMalloc(&p.bf16, host.size() * 2));
    CHECK(cudaMalloc(&p.fp8, host8.size()));
    CHECK(cudaMemcpy(p.bf16, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(p.fp8, host8.data(), host8.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&p.bias, p.n * 4));
    CHECK(cudaMemset(p.bias, 0, p.n * 4));
    CHECK(cudaMalloc(&p.out, p.n * 4));
    CHECK(cudaMalloc(&p.x, p.k * 4));
    CHECK(cudaMemset(p.x, 0, p.k * 4));
    weightBytes += host.size() * 2;
  }
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  std::printf("gpt2-124m's batch-1 products: %zu launches, %.1f MB of BF16 weights (%.1f MB in FP8)\n",
              products.size(), weightBytes / 1e6, weightBytes / 2e6);
  for (bool programmatic : {true, false})
    for (bool fp8 : {false, true}) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      for (size_t i = 0; i < products.size(); ++i)
        launchAny(products[i], fp8, stream, programmatic && i > 0);
      CHECK(cudaStreamEndCapture(stream, &graph));
      CHECK(cudaGraphInstantiate(&exec, graph, 0));
      cudaEvent_t start, stop;
      CHECK(cudaEventCreate(&start));
      CHECK(cudaEventCreate(&stop));
      std::vector<float> times;
      for (int run = 0; run < 220; ++run) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (run >= 20)
          times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      std::printf("%s weights, %s: %.1f us a chain (median of 200; min %.1f)\n", fp8 ? "FP8 " : "BF16",
                  programmatic ? "programmatic launch" : "serialised launches", 1000 * times[times.size() / 2],
                  1000 * times[0]);
      CHECK(cudaGraphExecDestroy(exec));
      CHECK(cudaGraphDestroy(graph));
    }
  return 0;
}
