// decode_attention over long caches read from memory: each part's keys and values streamed
// together, a running softmax in each group of lanes, so that no block waits between its keys
// and its values (decode.cuh's part reads the keys, reduces, then reads the values: at a long
// context every block of the one wave is in the same phase, and the memory idles through the
// softmax between them).
#pragma once

#include "decode.cuh"

// 16 bytes of a cache row as floats: 8 BF16 values, or 4 fp32.
__device__ __forceinline__ void chunkFloats(uint4 c, float (&out)[8]) { unpack8(c, out); }
__device__ __forceinline__ void chunkFloats(uint4 c, float (&out)[4]) {
  out[0] = __uint_as_float(c.x), out[1] = __uint_as_float(c.y);
  out[2] = __uint_as_float(c.z), out[3] = __uint_as_float(c.w);
}

// The keys a part of a query at `position` takes (streamed parts): the context split over
// Splits parts, at least a block's turn of keys each, so that short contexts use fewer parts.
template <int64 Splits, int64 Turn>
__device__ __forceinline__ int64 streamPartKeys(int64 position) {
  int64 keys = (position + Splits) / Splits; // position + 1 keys over Splits parts, rounded up
  return keys < Turn ? Turn : keys;
}

// Whether a cache of heads of Dh elements of Cache streams: rows of whole 16-byte chunks, a
// power of two of them at most a warp.
template <int64 Dh, typename Cache>
__host__ __device__ constexpr bool streamable() {
  constexpr int64 chunks = Dh * (int64)sizeof(Cache) / 16;
  return Dh * (int64)sizeof(Cache) % 16 == 0 && chunks <= 32 && (chunks & (chunks - 1)) == 0;
}

// One part of one (query, head), as decodeAttentionPart's without Tiles (the same arguments,
// Write included; the part's keys from streamPartKeys instead of a fixed Keys). A group of Lanes
// lanes takes a key at a time, 16 bytes of its key and value row each, Unroll keys a group in
// flight; each group keeps its maximum, its sum and its Dh / Lanes columns of the weighted
// values, rescaled as the maximum grows; the groups are combined at the end. The weights
// multiplying the values are rounded to BF16 under gemm_dtype, as decode.cuh's, each before
// later rescalings; the sums are of the unrounded weights.
template <bool Bf16, int64 H, int64 Dh, int64 T, int64 Splits, bool Write, int64 KV, bool Rope, int64 S, typename Cache,
          typename Out, typename CacheOut>
__device__ void decodeStreamPart(int64 split, int64 bh, const float *qkv, const Cache *k, const Cache *v,
                                 const int *positions, Out out, float *partial, unsigned *done, float scale,
                                 CacheOut kOut, CacheOut vOut, const double *table) {
  static_assert(streamable<Dh, Cache>(), "rows of a power of two of 16-byte chunks");
  static_assert(!Write || (S == 1 && KV == H), "the row written by its own head's block alone");
  constexpr int64 D = KV * Dh, W = H * Dh + 2 * D, G = H / KV;
  constexpr int Threads = 128, E = 16 / (int)sizeof(Cache), Lanes = (int)(Dh / E), Groups = Threads / Lanes;
  constexpr int Unroll = 4;
  constexpr int64 Turn = (int64)Groups * Unroll; // the keys a block takes at once
  __shared__ float q[Dh], groupM[Groups], groupL[Groups], groupAcc[Groups][Dh], reduced[Threads / 32], parts[Splits];
  __shared__ bool last;
  int64 h = bh % H, row = bh / H, b = row / S, kh = h / G;
  int64 at = positions[b] + row % S;
  int64 position = at < T ? at : T - 1;
  int64 keys = streamPartKeys<Splits, Turn>(position < 0 ? 0 : position);
  int64 counted = position < 0 ? 1 : position / keys + 1;
  if (split >= counted)
    return;
  int64 first = split * keys, end = position + 1 < first + keys ? position + 1 : first + keys;
  float *mine = partial + (bh * Splits + split) * (Dh + 2);
  if (Write && at >= 0 && at < T && first <= at && at < end) {
    const float *fresh = qkv + row * W + H * Dh + kh * Dh;
    for (int64 d = threadIdx.x; d < Dh; d += Threads) {
      int64 cell = (b * T + at) * D + kh * Dh + d;
      kOut[cell] = gemmOperand<Bf16>(rotatedElement<Rope, T, Dh>(fresh, d, at, table));
      vOut[cell] = gemmOperand<Bf16>(fresh[D + d]);
    }
    __syncthreads(); // the block's own writes, visible to its reads below
  }
  if (first >= end) { // a position before the cache: an empty part
    for (int64 d = threadIdx.x; d < Dh + 2; d += Threads) mine[d] = d == 0 ? __int_as_float(0xff800000) : 0.0f;
    combineDecodeParts<Threads, Dh, Splits>(bh, counted, partial, done, out, parts, reduced, last);
    return;
  }
  for (int64 d = threadIdx.x; d < Dh; d += Threads)
    q[d] = gemmOperand<Bf16>(rotatedElement<Rope, T, Dh>(qkv + row * W + h * Dh, d, at, table));
  __syncthreads();
  tgcStamp(kPhaseAttentionQuery);
  const int group = threadIdx.x / Lanes, d0 = threadIdx.x % Lanes * E;
  float mq[E], acc[E];
#pragma unroll
  for (int i = 0; i < E; ++i) mq[i] = q[d0 + i], acc[i] = 0.0f;
  float m = __int_as_float(0xff800000), l = 0.0f;
  const int64 base = (b * T) * D + kh * Dh + d0;
  for (int64 j0 = first; j0 < end; j0 += Turn) { // the same turns for every lane: the shuffles
    uint4 kc[Unroll], vc[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) { // every load of the turn in flight before any is used
      int64 j = j0 + u * Groups + group;
      kc[u] = vc[u] = make_uint4(0, 0, 0, 0); // past the end: zeros, weighted by 0
      if (j < end) {
        kc[u] = *(const uint4 *)(k + base + j * D);
        vc[u] = *(const uint4 *)(v + base + j * D);
      }
    }
    float s[Unroll], top = m;
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      float kf[E], dot = 0.0f;
      chunkFloats(kc[u], kf);
#pragma unroll
      for (int i = 0; i < E; ++i) dot += mq[i] * gemmOperand<Bf16>(kf[i]);
#pragma unroll
      for (int offset = 1; offset < Lanes; offset <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      s[u] = j0 + u * Groups + group < end ? dot * scale : __int_as_float(0xff800000);
      top = fmaxf(top, s[u]);
    }
    if (top == __int_as_float(0xff800000))
      continue; // no key of this group's yet
    float rescale = expf(m - top); // 0 where m is still -inf
    l *= rescale;
#pragma unroll
    for (int i = 0; i < E; ++i) acc[i] *= rescale;
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      float e = expf(s[u] - top), vf[E]; // 0 past the end
      l += e;
      float w = gemmOperand<Bf16>(e);
      chunkFloats(vc[u], vf);
#pragma unroll
      for (int i = 0; i < E; ++i) acc[i] += w * gemmOperand<Bf16>(vf[i]);
    }
    m = top;
  }
  tgcStamp(kPhaseAttentionKeys);
  // The groups combined, in group order: each rescaled to the block's maximum.
  if (d0 == 0)
    groupM[group] = m, groupL[group] = l;
#pragma unroll
  for (int i = 0; i < E; ++i) groupAcc[group][d0 + i] = acc[i];
  __syncthreads();
  float top = __int_as_float(0xff800000);
  for (int g = 0; g < Groups; ++g) top = fmaxf(top, groupM[g]);
  float total = 0.0f;
  for (int g = 0; g < Groups; ++g) total += groupL[g] > 0.0f ? groupL[g] * expf(groupM[g] - top) : 0.0f;
  for (int64 d = threadIdx.x; d < Dh; d += Threads) {
    float sum = 0.0f;
    for (int g = 0; g < Groups; ++g)
      if (groupL[g] > 0.0f)
        sum += groupAcc[g][d] * expf(groupM[g] - top);
    if (counted == 1)
      out[bh * Dh + d] = sum / total;
    else
      mine[2 + d] = sum;
  }
  tgcStamp(kPhaseAttentionPart);
  if (counted == 1)
    return;
  if (threadIdx.x == 0) {
    mine[0] = top;
    mine[1] = total;
  }
  combineDecodeParts<Threads, Dh, Splits>(bh, counted, partial, done, out, parts, reduced, last);
}

// A block a part, numbered split first; B * S queries of H heads, Splits parts each (those past
// a query's context return at once).
template <bool Bf16, int64 B, int64 H, int64 Dh, int64 T, int64 Splits, bool Write = false, int64 KV = H,
          bool Rope = false, int64 S = 1, typename Cache, typename Out, typename CacheOut = float *>
__device__ void decodeAttentionStream(const float *qkv, const Cache *k, const Cache *v, const int *positions, Out out,
                                      float *partial, unsigned *done, float scale, CacheOut kOut = nullptr,
                                      CacheOut vOut = nullptr, const double *table = nullptr) {
  decodeStreamPart<Bf16, H, Dh, T, Splits, Write, KV, Rope, S>(blockIdx.x / (B * S * H), blockIdx.x % (B * S * H), qkv,
                                                               k, v, positions, out, partial, done, scale, kOut, vOut,
                                                               table);
}
