// Generation: keys and values into the KV cache, attention of one query per sequence over its
// cache (split across the keys, flash-decoding), and the greedy token.
#pragma once

#include "common.cuh"

// The caches [B, T, D] copied whole: launch 0 of a kv_write that is not written in place.
template <int64 Count>
__device__ void kvCopy(const float *k, const float *v, float *kOut, float *vOut) {
  FOR_EACH_ELEMENT(i, Count) {
    kOut[i] = k[i];
    vOut[i] = v[i];
  }
}

// Rows first .. first + S - 1 of each sequence's caches from qkv [B, S, 3D] (keys are columns
// [D, 2D), values [2D, 3D)); first is positions[b], or 0 for a prompt. A position outside the
// cache (which the CPU reports as an error) writes nothing.
template <int64 B, int64 S, int64 T, int64 D, bool Positioned>
__device__ void kvWriteRows(const float *qkv, const int *positions, float *kOut, float *vOut) {
  FOR_EACH_ELEMENT(i, B * S * D) {
    int64 d = i % D, s = (i / D) % S, b = i / (S * D);
    int64 row = (Positioned ? positions[b] : 0) + s;
    if (row < 0 || row >= T) continue;
    const float *source = qkv + (b * S + s) * 3 * D + D + d;
    kOut[(b * T + row) * D + d] = source[0];
    vOut[(b * T + row) * D + d] = source[D];
  }
}

// Launch 0 of decode_attention, 128 threads a block: block (b, h, split) takes keys
// [split * Keys, (split + 1) * Keys) up to position positions[b] and writes its partial result
// to partial[block]: the largest score m, the sum l of exp(score - m), and the sum over its
// keys of exp(score - m) times the values (Dh floats). Scores are dot products of BF16
// operands under gemm_dtype, as the attention GEMMs; the weights rounded to BF16 likewise.
template <bool Bf16, int64 H, int64 Dh, int64 T, int64 Keys, int64 Splits>
__device__ void decodeAttentionPartial(const float *qkv, const float *k, const float *v, const int *positions,
                                       float *partial, float scale) {
  constexpr int64 D = H * Dh;
  constexpr int Threads = 128, Groups = Dh >= Threads ? 1 : Threads / Dh;
  __shared__ float q[Dh], weights[Keys], sums[Groups][Dh], reduced[Threads / 32];
  int64 block = blockIdx.x, split = block % Splits, h = (block / Splits) % H, b = block / (Splits * H);
  int64 last = positions[b] < T ? positions[b] : T - 1; // outside the cache: read nothing outside it
  int64 first = split * Keys, end = last + 1 < first + Keys ? last + 1 : first + Keys;
  float *mine = partial + block * (Dh + 2);
  if (first >= end) { // past this sequence's position: an empty part
    for (int64 d = threadIdx.x; d < Dh + 2; d += Threads) mine[d] = d == 0 ? __int_as_float(0xff800000) : 0.0f;
    return;
  }
  for (int64 d = threadIdx.x; d < Dh; d += Threads) q[d] = gemmOperand<Bf16>(qkv[b * 3 * D + h * Dh + d]);
  __syncthreads();
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64 j = first + warp; j < end; j += Threads / 32) { // a warp per key
    const float *key = k + (b * T + j) * D + h * Dh;
    float dot = 0.0f;
    for (int64 d = lane; d < Dh; d += 32) dot += q[d] * gemmOperand<Bf16>(key[d]);
    dot = warpSum(dot);
    if (lane == 0) weights[j - first] = dot * scale;
  }
  __syncthreads();
  int64 n = end - first;
  float m = __int_as_float(0xff800000);
  for (int64 j = threadIdx.x; j < n; j += Threads) m = fmaxf(m, weights[j]);
  m = blockMax(m, reduced);
  float l = 0.0f;
  for (int64 j = threadIdx.x; j < n; j += Threads) {
    float e = expf(weights[j] - m);
    l += e;
    weights[j] = gemmOperand<Bf16>(e);
  }
  l = blockReduce(l, reduced, [](float x, float y) { return x + y; }); // also orders the weights' writes
  for (int64 i = threadIdx.x; i < Groups * Dh; i += Threads) { // Groups threads a dimension
    int64 g = i / Dh, d = i % Dh;
    float acc = 0.0f;
    for (int64 j = g; j < n; j += Groups) acc += weights[j] * gemmOperand<Bf16>(v[(b * T + first + j) * D + h * Dh + d]);
    sums[g][d] = acc;
  }
  __syncthreads();
  for (int64 d = threadIdx.x; d < Dh; d += Threads) {
    float acc = 0.0f;
    for (int g = 0; g < Groups; ++g) acc += sums[g][d];
    mine[2 + d] = acc;
  }
  if (threadIdx.x == 0) {
    mine[0] = m;
    mine[1] = l;
  }
}

// Launch 1: a block per (sequence, head) combines its Splits parts, each weighted by
// exp(m_part - m), into out [B, 1, D].
template <int64 H, int64 Dh, int64 Splits>
__device__ void decodeAttentionCombine(const float *partial, float *out) {
  int64 bh = blockIdx.x, h = bh % H, b = bh / H;
  const float *parts = partial + bh * Splits * (Dh + 2);
  float m = __int_as_float(0xff800000);
  for (int64 s = 0; s < Splits; ++s) m = fmaxf(m, parts[s * (Dh + 2)]);
  float l = 0.0f;
  for (int64 s = 0; s < Splits; ++s)
    if (parts[s * (Dh + 2) + 1] > 0.0f) l += expf(parts[s * (Dh + 2)] - m) * parts[s * (Dh + 2) + 1];
  for (int64 d = threadIdx.x; d < Dh; d += blockDim.x) {
    float acc = 0.0f;
    for (int64 s = 0; s < Splits; ++s)
      if (parts[s * (Dh + 2) + 1] > 0.0f) acc += expf(parts[s * (Dh + 2)] - m) * parts[s * (Dh + 2) + 2 + d];
    out[(b * H + h) * Dh + d] = acc / l;
  }
}

// A block per row of x [Rows, N]: the index of the row's largest element, the lowest on ties;
// NaN never wins (a row of NaN gives 0), as the CPU's argmax.
template <int64 N>
__device__ void argmaxRows(const float *x, int *out) {
  __shared__ float bestValues[8];
  __shared__ int bestIndices[8];
  const float *row = x + (int64)blockIdx.x * N;
  float best = __int_as_float(0x7fc00000); // no candidate yet: NaN at no index, which anything beats
  int index = 0x7fffffff;
  auto better = [](float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi) || (bv != bv && (v == v || i < bi));
  };
  for (int64 i = threadIdx.x; i < N; i += blockDim.x)
    if (better(row[i], (int)i, best, index)) {
      best = row[i];
      index = (int)i;
    }
  for (int offset = 16; offset > 0; offset >>= 1) {
    float v = __shfl_xor_sync(0xffffffffu, best, offset);
    int i = __shfl_xor_sync(0xffffffffu, index, offset);
    if (better(v, i, best, index)) {
      best = v;
      index = i;
    }
  }
  if (threadIdx.x % 32 == 0) {
    bestValues[threadIdx.x / 32] = best;
    bestIndices[threadIdx.x / 32] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)blockDim.x / 32; ++w)
      if (better(bestValues[w], bestIndices[w], best, index)) {
        best = bestValues[w];
        index = bestIndices[w];
      }
    out[blockIdx.x] = index;
  }
}
