// Matrix products of a few rows (a decode step's linear layers) against a weight [N, K] in
// BF16: out [M, N] = x [M, K] @ w^T (+ bias [N]), BF16 operands and fp32 sums, as a
// gemm_dtype="bf16" GEMM computes them. Such a product reads the weight once and does little
// else: cuBLASLt's split-K tiles for one row read it at a seventh of the memory's rate.
//   M <= 8:  a warp per output column reads its weight row in 16-byte loads and the rows of x
//            (cached, every warp reads the same) and meets in shuffles.
//   M <= 64: tensor cores (mma.sync m16n8k16): a block per 8 columns, its 8 warps each a
//            slice of K, their partial tiles summed in shared memory.
#pragma once

#include "attention.cuh"
#include "common.cuh"

// Eight consecutive elements of x at x + i (i a multiple of 8), as the GEMM reads them: fp32
// rounded to BF16, or stored in BF16.
__device__ __forceinline__ void load8(const float *x, int64 i, float (&out)[8]) {
  float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
  out[0] = roundBf16(a.x), out[1] = roundBf16(a.y), out[2] = roundBf16(a.z), out[3] = roundBf16(a.w);
  out[4] = roundBf16(b.x), out[5] = roundBf16(b.y), out[6] = roundBf16(b.z), out[7] = roundBf16(b.w);
}
__device__ __forceinline__ void load8(const unsigned short *x, int64 i, float (&out)[8]) {
  uint4 q = *(const uint4 *)(x + i);
  unsigned words[4] = {q.x, q.y, q.z, q.w};
  for (int e = 0; e < 4; ++e) {
    out[2 * e] = __uint_as_float(words[e] << 16);
    out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
  }
}

// A warp per output column n, 8 a block; K a multiple of 8 (16-byte rows).
template <int64 M, int64 N, int64 K, bool Bias, typename X>
__device__ void gemvBf16(const X *x, const unsigned short *w, const float *bias, float *out) {
  int64 n = blockIdx.x * 8 + threadIdx.x / 32;
  if (n >= N) return;
  const int lane = threadIdx.x % 32;
  float acc[M] = {};
#pragma unroll 4
  for (int64 k = lane * 8; k < K; k += 256) {
    float weights[8], values[8];
    load8(w + n * K, k, weights);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      load8(x + m * K, k, values);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[m] += weights[e] * values[e];
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warpSum(acc[m]);
  if (lane < M) {
    float value = acc[0];
#pragma unroll
    for (int m = 1; m < M; ++m)
      if (lane == m) value = acc[m];
    out[lane * N + n] = Bias ? value + bias[n] : value;
  }
}

// Two consecutive elements of x at x + i (i even) packed as an mma operand: BF16 rounded from
// fp32, or as stored.
__device__ __forceinline__ unsigned pairOf(const float *x, int64 i) {
  float2 v = *(const float2 *)(x + i);
  return packBf16(v.x, v.y);
}
__device__ __forceinline__ unsigned pairOf(const unsigned short *x, int64 i) { return *(const unsigned *)(x + i); }

// M <= 64 rows, K a multiple of 128: block n8 = blockIdx.x takes columns [8 n8, 8 n8 + 8); warp
// w the slice [w K / 8, (w + 1) K / 8) of K, every m16 tile of the rows at once (rows past M
// read as zeros); then the eight partial tiles are summed in warp order.
template <int64 M, int64 N, int64 K, bool Bias, typename X>
__device__ void gemmSkinnyBf16(const X *x, const unsigned short *w, const float *bias, float *out) {
  constexpr int Tiles = (int)((M + 15) / 16), Warps = 8;
  constexpr int64 Slice = K / Warps;
  __shared__ float partial[Warps][Tiles * 16][8];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
  const int64 n0 = blockIdx.x * 8, row = n0 + g;
  const unsigned short *weights = w + (row < N ? row : 0) * K;
  float acc[Tiles][4] = {};
#pragma unroll 4
  for (int64 k = warp * Slice; k < (warp + 1) * Slice; k += 16) {
    unsigned b0 = row < N ? *(const unsigned *)(weights + k + c) : 0u;
    unsigned b1 = row < N ? *(const unsigned *)(weights + k + c + 8) : 0u;
#pragma unroll
    for (int t = 0; t < Tiles; ++t) {
      int64 r0 = t * 16 + g, r1 = r0 + 8;
      unsigned a[4] = {r0 < M ? pairOf(x, r0 * K + k + c) : 0u, r1 < M ? pairOf(x, r1 * K + k + c) : 0u,
                       r0 < M ? pairOf(x, r0 * K + k + c + 8) : 0u, r1 < M ? pairOf(x, r1 * K + k + c + 8) : 0u};
      mmaBf16(acc[t], a, b0, b1);
    }
  }
#pragma unroll
  for (int t = 0; t < Tiles; ++t) {
    partial[warp][t * 16 + g][c] = acc[t][0];
    partial[warp][t * 16 + g][c + 1] = acc[t][1];
    partial[warp][t * 16 + g + 8][c] = acc[t][2];
    partial[warp][t * 16 + g + 8][c + 1] = acc[t][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * 8; i += blockDim.x) {
    int r = i / 8, col = i % 8;
    int64 n = n0 + col;
    if (n >= N) continue;
    float sum = 0.0f;
    for (int v = 0; v < Warps; ++v) sum += partial[v][r][col];
    out[r * N + n] = Bias ? sum + bias[n] : sum;
  }
}
