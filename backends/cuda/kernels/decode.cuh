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

// Element d of the heads of Dh that start at x (a qkv row's queries, or its keys), rotated at
// position t by rope's table of T positions where Rope (fuse-cache-rope): element d's pair is
// (d, d + Dh / 2) of its head, turned as ropePair turns it (the rope op's bits); a position
// outside the table (which the CPU reports as an error) leaves it as it is.
template <bool Rope, int64 T, int64 Dh, typename In>
__device__ __forceinline__ float rotatedElement(const In *x, int64 d, int64 t, const double *table) {
  if (!Rope || t < 0 || t >= T)
    return elementValue(x[d]);
  constexpr int64 Half = Dh / 2;
  int64 head = d - d % Dh, i = d % Half;
  float a = elementValue(x[head + i]), b = elementValue(x[head + i + Half]);
  ropePair<T, Half, false>(a, b, table, t, i);
  return d % Dh < Half ? a : b;
}

// Rows first .. first + S - 1 of each sequence's caches ([B, T, D]) from qkv [B, S, Q + 2D]
// (keys are columns [Q, Q + D), values [Q + D, Q + 2D); Q, the queries' width, is D but under
// grouped-query attention); first is positions[b], or 0 for a prompt. A position outside the
// cache (which the CPU reports as an error) writes nothing.
// Under gemm_dtype="bf16" (Bf16) the rows are rounded to BF16, as the CPU writes them; a cache
// stored in BF16 (Out = Bf16Out) holds them in two bytes, as qkv may (In: a prefill's rows, which
// cuDNN's attention reads in place). With Dh (rope_theta: heads of Dh), each key is rotated at
// its row first (rotatedElement, table the op's constants).
template <int64 B, int64 S, int64 T, int64 D, bool Positioned, bool Bf16, int64 Q = D, int64 Dh = 0, typename In,
          typename Out>
__device__ void kvWriteRows(const In *qkv, const int *positions, Out kOut, Out vOut, const double *table = nullptr) {
  FOR_EACH_ELEMENT(i, B * S * D) {
    int64 d = i % D, s = (i / D) % S, b = i / (S * D);
    int64 row = (Positioned ? positions[b] : 0) + s;
    if (row < 0 || row >= T) continue;
    const In *keys = qkv + (b * S + s) * (Q + 2 * D) + Q;
    kOut[(b * T + row) * D + d] = gemmOperand<Bf16>(rotatedElement<(Dh > 0), T, (Dh > 0 ? Dh : 2)>(keys, d, row, table));
    vOut[(b * T + row) * D + d] = gemmOperand<Bf16>(elementValue(keys[D + d]));
  }
}

// Vec consecutive values from p as floats: fp32 (16-byte aligned when Vec is 4), or BF16 (a
// cache stored in BF16; 8-byte aligned).
template <int Vec>
__device__ __forceinline__ void loadFloats(const float *p, float *out) {
  if (Vec == 4) {
    float4 v = *(const float4 *)p;
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  } else {
    for (int i = 0; i < Vec; ++i) out[i] = p[i];
  }
}
template <int Vec>
__device__ __forceinline__ void loadFloats(const unsigned short *p, float *out) {
  if (Vec == 4) {
    uint2 v = *(const uint2 *)p;
    out[0] = __uint_as_float(v.x << 16), out[1] = __uint_as_float(v.x & 0xffff0000u);
    out[2] = __uint_as_float(v.y << 16), out[3] = __uint_as_float(v.y & 0xffff0000u);
  } else {
    for (int i = 0; i < Vec; ++i) out[i] = __uint_as_float((unsigned)p[i] << 16);
  }
}

// The memory a cache output points to, to read it back (decode_attention {write_cache} reads
// the caches it writes).
__device__ __forceinline__ const float *readable(float *p) { return p; }
__device__ __forceinline__ const unsigned short *readable(Bf16Out p) { return p.p; }

// decode_attention, one launch of 128-thread blocks over the parts of every (query, head), S
// queries a sequence (query s of sequence b at position positions[b] + s; S = 1 in a decode
// step): part (query, h, split) takes keys [split * Keys, (split + 1) * Keys) up to its position
// and writes to partial: the largest score m, the sum l of exp(score - m), and the sum over its
// keys of exp(score - m) times the values (Dh floats). The parts past a sequence's position are
// skipped; the last of the others to finish (counted in `done`, a zeroed buffer of its own that
// it zeroes again) combines them in split order, each weighted by exp(m_part - m), into out
// [B, S, D]. Scores are dot products of BF16 operands under gemm_dtype, as the attention GEMMs;
// the weights rounded to BF16 likewise. Four threads a key for the scores (a quarter of the head
// each); for the values, Dh / Vec threads a key row (Vec floats each), Groups rows at a time.
// With Write (fuse-kv-write), k and v are the caches kOut and vOut, and the part whose keys
// include the position first writes that position's key and value from qkv into them (as
// kv_write: rounded under gemm_dtype; nothing where the position is outside the cache); no other
// part reads that row.
// With Tiles (the attention writing its caches), the part's keys and values are loaded into
// shared memory first, together (one trip to memory where the values otherwise waited for the
// softmax), and this step's row is put into the tiles as it is written. With Early as well (a
// step under programmatic launch, writing its caches in place, its positions an input), they are
// loaded before the kernel awaits the one before it (awaitPreviousKernel): the caches' rows
// before this step's are written by earlier steps, and only qkv comes from the kernel before.
// `waited` says whether the kernel has awaited it.
template <typename Cache>
__device__ __forceinline__ Cache toCache(float x);
template <>
__device__ __forceinline__ float toCache<float>(float x) { return x; }
template <>
__device__ __forceinline__ unsigned short toCache<unsigned short>(float x) { return bf16Bits(x); }

// The parts of one (sequence, head) combined by the last of its blocks to finish: each part's
// sums rescaled to the largest maximum, divided by the total weight. `parts`, `reduced` and
// `last` are the block's shared memory.
template <int Threads, int64 Dh, int64 Splits, typename Out>
__device__ __forceinline__ void combineDecodeParts(int64 bh, int64 counted, float *partial, unsigned *done, Out out,
                                                   float *parts, float *reduced, bool &last) {
  // The parts are visible once counted.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done + bh, 1u) == counted - 1;
    if (last) done[bh] = 0; // for the next step
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The other blocks' parts, read from L2 (__ldcg: never a stale L1 line), eight loads in flight
  // a thread (one at a time, a long context's 128 parts took ~40 us of latency a layer). Part
  // s's maximum and sum go to thread s, and the first Early parts' values of column d to
  // thread d, all loaded at once before the reductions: one trip to L2 where a short context's
  // few parts waited for three (the same sums in the same order).
  constexpr int Early = Splits < 8 ? (int)Splits : 8;
  const float *all = partial + bh * Splits * (Dh + 2);
  const int64 t = threadIdx.x;
  float early[Early];
#pragma unroll
  for (int s = 0; s < Early; ++s) early[s] = t < Dh && s < counted ? __ldcg(all + s * (Dh + 2) + 2 + t) : 0.0f;
  float mineM = t < counted ? __ldcg(all + t * (Dh + 2)) : __int_as_float(0xff800000);
  float mineSum = t < counted ? __ldcg(all + t * (Dh + 2) + 1) : 0.0f;
  float m = mineM;
  for (int64 s = t + Threads; s < counted; s += Threads) m = fmaxf(m, __ldcg(all + s * (Dh + 2)));
  m = blockMax(m, reduced);
  float l = 0.0f;
  for (int64 s = t; s < counted; s += Threads) {
    float sum = s == t ? mineSum : __ldcg(all + s * (Dh + 2) + 1);
    float w = sum > 0.0f ? expf((s == t ? mineM : __ldcg(all + s * (Dh + 2))) - m) : 0.0f;
    parts[s] = w;
    l += w * sum;
  }
  l = blockReduce(l, reduced, [](float x, float y) { return x + y; }); // also orders the parts' writes
  for (int64 d = t; d < Dh; d += Threads) {
    float acc = 0.0f;
    int64 s = 0;
    if (d == t)
#pragma unroll
      for (; s < Early; ++s)
        if (s < counted) acc += parts[s] * early[s];
    s = d == t ? (Early < counted ? Early : counted) : 0;
#pragma unroll 8
    for (; s < counted; ++s) acc += parts[s] * __ldcg(all + s * (Dh + 2) + 2 + d);
    out[bh * Dh + d] = acc / l;
  }
  tgcStamp(kPhaseAttentionCombined);
}

// Query head h of KV heads reads cache head h / (H / KV) (grouped-query attention; the caches
// [B, T, KV Dh], qkv's rows [H Dh | KV Dh | KV Dh]). Writing the caches (Write) under grouped
// heads needs Tiles: the first query head of each group writes the row, and every block of the
// group puts the row it computes into its own tiles, so none reads the row another writes (the
// stale copy a block may load there is replaced).
// With Rope (rope_theta), the query, and under Write the key it writes, are rotated at the
// position first (rotatedElement; table: the op's constants).
template <bool Bf16, int64 H, int64 Dh, int64 T, int64 Keys, int64 Splits, bool Write, bool Tiles, int64 KV, bool Rope,
          int64 S, typename Cache, typename Out, typename CacheOut>
__device__ void decodeAttentionPart(int64 split, int64 bh, const float *qkv, const Cache *k, const Cache *v,
                                    const int *positions, Out out, float *partial, unsigned *done, float scale,
                                    CacheOut kOut, CacheOut vOut, bool &waited, const double *table) {
  static_assert(!Write || KV == H || Tiles, "the cache row written by a grouped head's block, read by the others");
  static_assert(!Write || S == 1, "a query's block writes its row, which no other query's block may need");
  constexpr int64 D = KV * Dh, W = H * Dh + 2 * D, G = H / KV; // D: a cache row's width
  constexpr int Threads = 128, Vec = Dh % 4 == 0 ? 4 : 1, PerRow = Dh / Vec;
  constexpr int Groups = PerRow >= Threads ? 1 : Threads / PerRow, PerKey = PerRow % 4 == 0 ? 4 : 1;
  constexpr int64 Chunk = 16 / sizeof(Cache); // elements of a 16-byte load
  static_assert(!Tiles || (Write && Dh % Chunk == 0), "tiles: rows of whole 16-byte chunks");
  __shared__ float q[Dh], weights[Keys], sums[Groups][Dh], reduced[Threads / 32], parts[Splits];
  __shared__ __align__(16) Cache tileK[Tiles ? Keys : 1][Dh], tileV[Tiles ? Keys : 1][Dh];
  __shared__ bool last;
  int64 block = bh * Splits + split, h = bh % H, row = bh / H, b = row / S, kh = h / G;
  int64 at = positions[b] + row % S; // this query's position
  int64 position = at < T ? at : T - 1; // outside the cache: read nothing outside it
  // The parts that hold keys: up to the position's (one at least, empty before the cache).
  int64 counted = position < 0 ? 1 : position / Keys + 1;
  if (split >= counted)
    return;
  int64 first = split * Keys, end = position + 1 < first + Keys ? position + 1 : first + Keys;
  float *mine = partial + block * (Dh + 2);
  if constexpr (Tiles) { // (constexpr: heads narrower than a chunk have no tiles to load)
    for (int64 i = threadIdx.x; i < (end - first) * (Dh / Chunk); i += Threads) {
      int64 j = i / (Dh / Chunk), d = i % (Dh / Chunk) * Chunk, at = (b * T + first + j) * D + kh * Dh + d;
      *(uint4 *)&tileK[j][d] = *(const uint4 *)(k + at);
      *(uint4 *)&tileV[j][d] = *(const uint4 *)(v + at);
    }
    if (!waited) {
      awaitPreviousKernel();
      waited = true;
    }
    __syncthreads(); // the tiles are whole before this step's row replaces its stale copy in them
  }
  if (Write && at >= 0 && at < T && first <= at && at < end) {
    const float *fresh = qkv + row * W + H * Dh + kh * Dh;
    bool writer = h % G == 0; // the group's first head
    for (int64 d = threadIdx.x; d < Dh; d += Threads) {
      int64 cell = (b * T + at) * D + kh * Dh + d;
      float key = gemmOperand<Bf16>(rotatedElement<Rope, T, Dh>(fresh, d, at, table));
      float value = gemmOperand<Bf16>(fresh[D + d]);
      if (writer) {
        kOut[cell] = key;
        vOut[cell] = value;
      }
      if constexpr (Tiles) {
        tileK[at - first][d] = toCache<Cache>(key);
        tileV[at - first][d] = toCache<Cache>(value);
      }
    }
    __syncthreads(); // the block's own writes, visible to its reads below
  }
  if (first >= end) { // a position before the cache: an empty part
    for (int64 d = threadIdx.x; d < Dh + 2; d += Threads) mine[d] = d == 0 ? __int_as_float(0xff800000) : 0.0f;
  } else {
    for (int64 d = threadIdx.x; d < Dh; d += Threads)
      q[d] = gemmOperand<Bf16>(rotatedElement<Rope, T, Dh>(qkv + row * W + h * Dh, d, at, table));
    __syncthreads();
    tgcStamp(kPhaseAttentionQuery);
    int64 n = end - first;
    for (int64 from = 0; from < n * PerKey; from += Threads) { // every lane takes each turn: the shuffles
      int64 t = from + threadIdx.x, j = t / PerKey, d0 = (t % PerKey) * (Dh / PerKey);
      float dot = 0.0f;
      if (j < n) {
        const Cache *key = Tiles ? &tileK[j][0] : k + (b * T + first + j) * D + kh * Dh;
#pragma unroll 4
        for (int64 d = d0; d < d0 + Dh / PerKey; d += Vec) {
          float part[Vec];
          loadFloats<Vec>(key + d, part);
          for (int i = 0; i < Vec; ++i) dot += q[d + i] * gemmOperand<Bf16>(part[i]);
        }
      }
      for (int offset = 1; offset < PerKey; offset <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
      if (j < n && t % PerKey == 0) weights[j] = dot * scale;
    }
    __syncthreads();
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
    for (int64 i = threadIdx.x; i < Groups * PerRow; i += Threads) {
      int64 g = i / PerRow, d = (i % PerRow) * Vec;
      float acc[Vec] = {};
#pragma unroll 4
      for (int64 j = g; j < n; j += Groups) {
        float part[Vec];
        loadFloats<Vec>(Tiles ? &tileV[j][d] : v + (b * T + first + j) * D + kh * Dh + d, part);
        for (int e = 0; e < Vec; ++e) acc[e] += weights[j] * gemmOperand<Bf16>(part[e]);
      }
      for (int e = 0; e < Vec; ++e) sums[g][d + e] = acc[e];
    }
    __syncthreads();
    tgcStamp(kPhaseAttentionKeys);
    // The only part (at most Keys tokens) writes the result (the combine would weigh it by 1).
    for (int64 d = threadIdx.x; d < Dh; d += Threads) {
      float acc = 0.0f;
      for (int g = 0; g < Groups; ++g) acc += sums[g][d];
      if (counted == 1)
        out[bh * Dh + d] = acc / l;
      else
        mine[2 + d] = acc;
    }
    tgcStamp(kPhaseAttentionPart);
    if (counted == 1)
      return;
    if (threadIdx.x == 0) {
      mine[0] = m;
      mine[1] = l;
    }
  }
  combineDecodeParts<Threads, Dh, Splits>(bh, counted, partial, done, out, parts, reduced, last);
}

// A block a part, numbered split first; B * S queries of H heads. (A grid of at most 2048 blocks, each going on to further
// parts, made the step 19% slower with 1000-token prompts at batch 32: 0.948 -> 1.132 ms.)
template <bool Bf16, int64 B, int64 H, int64 Dh, int64 T, int64 Keys, int64 Splits, bool Write = false,
          bool Tiles = false, bool Early = false, int64 KV = H, bool Rope = false, int64 S = 1, typename Cache,
          typename Out, typename CacheOut = float *>
__device__ void decodeAttention(const float *qkv, const Cache *k, const Cache *v, const int *positions, Out out,
                                float *partial, unsigned *done, float scale, CacheOut kOut = nullptr,
                                CacheOut vOut = nullptr, const double *table = nullptr) {
  static_assert(Tiles || !Early, "only tiles load early");
  bool waited = !Early; // otherwise the kernel awaited the one before it first
  decodeAttentionPart<Bf16, H, Dh, T, Keys, Splits, Write, Tiles, KV, Rope, S>(
      blockIdx.x / (B * S * H), blockIdx.x % (B * S * H), qkv, k, v, positions, out, partial, done, scale, kOut, vOut,
      waited, table);
}

// Whether (v, i) beats (best, index) for argmax: larger, or equal at a lower index; NaN never
// beats a number, and (NaN, no index) loses to everything.
__device__ __forceinline__ bool argmaxBetter(float v, int i, float best, int index) {
  return v > best || (v == best && i < index) || (best != best && (v == v || i < index));
}

// The best (value, index) of each thread combined over the block, into lane 0 of warp 0.
__device__ void argmaxBlock(float &best, int &index) {
  __shared__ float values[32];
  __shared__ int indices[32];
  for (int offset = 16; offset > 0; offset >>= 1) {
    float v = __shfl_xor_sync(0xffffffffu, best, offset);
    int i = __shfl_xor_sync(0xffffffffu, index, offset);
    if (argmaxBetter(v, i, best, index)) {
      best = v;
      index = i;
    }
  }
  if (threadIdx.x % 32 == 0) {
    values[threadIdx.x / 32] = best;
    indices[threadIdx.x / 32] = index;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < (int)blockDim.x / 32; ++w)
      if (argmaxBetter(values[w], indices[w], best, index)) {
        best = values[w];
        index = indices[w];
      }
}

// argmax over the last axis of x [Rows, N], the lowest index on ties, NaN never winning (a
// row of NaN gives 0), as the CPU's. Launch 0: a block per Chunk elements of a row writes its
// best value and index into scratch; launch 1: a block per row combines its Chunks parts.
template <int64 N, int64 Chunk>
__device__ void argmaxParts(const float *x, float *scratch) {
  constexpr int64 Chunks = (N + Chunk - 1) / Chunk;
  int64 row = blockIdx.x / Chunks, first = (blockIdx.x % Chunks) * Chunk;
  const float *values = x + row * N;
  float best = __int_as_float(0x7fc00000); // no candidate yet: NaN at no index
  int index = 0x7fffffff;
  for (int64 i = first + threadIdx.x; i < N && i < first + Chunk; i += blockDim.x)
    if (argmaxBetter(values[i], (int)i, best, index)) {
      best = values[i];
      index = (int)i;
    }
  argmaxBlock(best, index);
  if (threadIdx.x == 0) {
    scratch[2 * blockIdx.x] = best;
    scratch[2 * blockIdx.x + 1] = __int_as_float(index);
  }
}

// Row `row`'s largest value and its index from argmaxParts' parts, into lane 0 of warp 0.
template <int64 N, int64 Chunk>
__device__ void argmaxOfParts(const float *scratch, int64 row, float &best, int &index) {
  constexpr int64 Chunks = (N + Chunk - 1) / Chunk;
  const float *parts = scratch + 2 * row * Chunks;
  best = __int_as_float(0x7fc00000);
  index = 0x7fffffff;
  for (int64 c = threadIdx.x; c < Chunks; c += blockDim.x)
    if (argmaxBetter(parts[2 * c], __float_as_int(parts[2 * c + 1]), best, index)) {
      best = parts[2 * c];
      index = __float_as_int(parts[2 * c + 1]);
    }
  argmaxBlock(best, index);
}

template <int64 N, int64 Chunk>
__device__ void argmaxCombine(const float *scratch, int *out) {
  float best;
  int index;
  argmaxOfParts<N, Chunk>(scratch, blockIdx.x, best, index);
  if (threadIdx.x == 0) out[blockIdx.x] = index;
}
