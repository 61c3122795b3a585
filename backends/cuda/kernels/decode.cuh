// One generated token: the new keys and values into the KV cache, and the query's attention
// over the cache up to its position.
#pragma once

#include "common.cuh"

// The cache [B, T, D] with row pos of every sequence replaced by x [B, D]. Written in place
// (out is the cache, assigned to it): only that row changes.
template <int64 Count, int64 T, int64 D>
__device__ void kvWrite(const float *cache, const float *x, const int *pos, float *out) {
  FOR_EACH_ELEMENT(i, Count) {
    int64 t = (i / D) % T, b = i / (T * D);
    if (t == pos[0]) out[i] = x[b * D + i % D];
    else if (out != cache) out[i] = cache[i];
  }
}

// A warp per (sequence, head), 8 warps a block: the query against cached keys 0..pos, as the
// CPU computes it (BF16 operands under gemm_dtype; max in float, sum in double). Each lane
// holds Per elements of the head dimension Dh for the dot products and the weighted values.
template <bool Bf16, int64 Heads, int64 Dh, int64 Per, int64 D, int64 T, int64 Warps>
__device__ void decodeAttention(const float *query, const float *k, const float *v, const int *pos, float *out,
                                float scale) {
  int lane = threadIdx.x % 32;
  int64 w = (int64)blockIdx.x * 8 + threadIdx.x / 32;
  if (w >= Warps) return;
  // A pos outside the cache (which the CPU reports as an error) reads no memory outside it.
  int64 h = w % Heads, b = w / Heads, last = pos[0] < T ? pos[0] : T - 1;
  float q[Per], acc[Per];
  for (int c = 0; c < Per; ++c) {
    q[c] = lane + 32 * c < Dh ? gemmOperand<Bf16>(query[b * D + h * Dh + lane + 32 * c]) : 0.0f;
    acc[c] = 0.0f;
  }
  auto score = [&](int64 j) {
    float partial = 0.0f;
    for (int c = 0; c < Per; ++c)
      if (lane + 32 * c < Dh) partial += q[c] * gemmOperand<Bf16>(k[(b * T + j) * D + h * Dh + lane + 32 * c]);
    return warpSum(partial) * scale;
  };
  float mx = __int_as_float(0xff800000);
  for (int64 j = 0; j <= last; ++j) {
    float s = score(j);
    mx = fmaxf(mx, s);
  }
  double sum = 0;
  for (int64 j = 0; j <= last; ++j) {
    float s = score(j);
    sum += exp((double)s - mx);
  }
  for (int64 j = 0; j <= last; ++j) {
    float s = score(j);
    float p = gemmOperand<Bf16>((float)(exp((double)s - mx) / sum));
    for (int c = 0; c < Per; ++c)
      if (lane + 32 * c < Dh) acc[c] += p * gemmOperand<Bf16>(v[(b * T + j) * D + h * Dh + lane + 32 * c]);
  }
  for (int c = 0; c < Per; ++c)
    if (lane + 32 * c < Dh) out[b * D + h * Dh + lane + 32 * c] = acc[c];
}
