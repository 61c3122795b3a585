// Matrix products of a few rows (a decode step's linear layers, M <= 8) against a weight
// [N, K] in BF16: out [M, N] = x [M, K] @ w^T (+ bias [N]), BF16 operands and fp32 sums, as
// a gemm_dtype="bf16" GEMM computes them. Such a product reads the weight once and does little
// else, so a warp per output column reads its weight row in 16-byte loads and the rows of x
// (cached, every warp reads the same) and meets in shuffles: the weight streams at close to
// the memory's rate, where cuBLASLt's split-K tiles for one row ran at a seventh of it.
#pragma once

#include "common.cuh"
#include "elementwise.cuh"
#include "norms.cuh"

// Eight consecutive elements of x at x + i (i a multiple of 8), as the GEMM reads them: fp32
// rounded to BF16, or stored in BF16 (unpack8 widens eight BF16 values loaded as 16 bytes).
__device__ __forceinline__ void load8(const float *x, int64 i, float (&out)[8]) {
  float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
  out[0] = roundBf16(a.x), out[1] = roundBf16(a.y), out[2] = roundBf16(a.z), out[3] = roundBf16(a.w);
  out[4] = roundBf16(b.x), out[5] = roundBf16(b.y), out[6] = roundBf16(b.z), out[7] = roundBf16(b.w);
}
__device__ __forceinline__ void unpack8(uint4 q, float (&out)[8]) {
  unsigned words[4] = {q.x, q.y, q.z, q.w};
  for (int e = 0; e < 4; ++e) {
    out[2 * e] = __uint_as_float(words[e] << 16);
    out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
  }
}
__device__ __forceinline__ void load8(const unsigned short *x, int64 i, float (&out)[8]) {
  unpack8(*(const uint4 *)(x + i), out);
}

// A warp per output column n, 8 a block; K a multiple of 8 (16-byte rows). The warp's weight row
// is loaded into registers first, then the kernel awaits the one before it (awaitPreviousKernel:
// the weights are parameters, which no kernel of the step writes before it), so the weight's
// reading overlaps the previous kernel's end; Prologue (the fused norm) runs after that wait.
// Gelu: the GELU of each output (an elementwise gelu after the product, fused: the same
// arithmetic).
template <int64 M, int64 N, int64 K, bool Bias, bool Gelu, typename X, typename Out, typename Prologue>
__device__ void gemvBf16Rows(const unsigned short *w, const float *bias, Out out, Prologue prologue, const X *x) {
  constexpr int Loads = (int)((K + 255) / 256); // 16-byte loads a lane
  int64 n = blockIdx.x * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  uint4 row[Loads];
#pragma unroll
  for (int i = 0; i < Loads; ++i) {
    int64 k = lane * 8 + 256 * i;
    row[i] = n < N && k < K ? *(const uint4 *)(w + n * K + k) : make_uint4(0, 0, 0, 0);
  }
  awaitPreviousKernel();
  prologue();
  if (n >= N) return;
  float acc[M] = {};
#pragma unroll
  for (int i = 0; i < Loads; ++i) {
    int64 k = lane * 8 + 256 * i;
    if (k >= K) break;
    float weights[8], values[8];
    unpack8(row[i], weights);
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
    float y = Bias ? value + bias[n] : value;
    out[lane * N + n] = Gelu ? geluTanh(y) : y;
  }
}

template <int64 M, int64 N, int64 K, bool Bias, typename X, typename Out>
__device__ void gemvBf16(const X *x, const unsigned short *w, const float *bias, Out out) {
  gemvBf16Rows<M, N, K, Bias, false>(w, bias, out, [] {}, x);
}

// residual_norm_linear: out = act(norm(a + b) @ w^T (+ bias)) over M <= 8 rows of K <= 1024
// features, and sum = a + b. Each block takes the sum and the norm of every row (warp m, row m,
// residualNorm's residualNormHeld) into shared memory in BF16, the operand the product reads, and
// block 0 writes the sums (the residual stream); then the product as gemvBf16. The same values
// as residual_norm, the product and the gelu one after the other: a decode step's norm costs no
// launch of its own.
template <bool Layer, int64 M, int64 N, int64 K, bool Bias, bool Gelu, typename SumOut, typename Out>
__device__ void residualNormGemvBf16(const float *a, const float *b, const float *gamma, const float *beta,
                                     const unsigned short *w, const float *bias, SumOut sum, Out out, double eps) {
  static_assert(M <= 8 && RowInRegisters<K>::kHeld && K % 8 == 0, "a few rows of at most 1024 features");
  __shared__ __align__(16) unsigned short normed[M * K];
  auto normalise = [&] {
    const int64 warp = threadIdx.x / 32;
    if (warp < M)
      residualNormHeld<Layer, K>(a + warp * K, b + warp * K, gamma, beta, sum + warp * K, blockIdx.x == 0,
                                 Bf16Out{normed + warp * K}, eps);
    __syncthreads();
  };
  gemvBf16Rows<M, N, K, Bias, Gelu>(w, bias, out, normalise, (const unsigned short *)normed);
}
