// Causal attention without a [T, T] tensor, FlashAttention-2's scheme: the forward writes the
// output and each query's log-sum-exp; the gradient takes sum(dout * out) per query, then dk and
// dv by key tiles and dq by query tiles (no atomics: the same bits every run). BF16 on tensor
// cores (inline mma.sync) where the head dimension is a multiple of 16 up to 256, else a thread
// per row (fp32, or BF16 rounding where the BF16 GEMMs round). The shapes are template
// arguments; each op's kernel is a one-line wrapper.
#pragma once

#include "common.cuh"
#include "tensorcore.cuh"

// qkv is [B, T, 3 * H * DH] (q | k | v, heads side by side), the output and dout [B, T, H * DH].
// A block takes 64 rows (queries, or keys in the key/value gradient) of one (sequence, head)
// and walks the other side a tile at a time; the softmax is taken online, so scores and
// probabilities never leave the block. lse and delta ([B * H, T]) carry, per query, the
// log-sum-exp of its scaled scores (from the forward) and sum_d dout * out (attentionDelta) to
// the two gradient kernels. Tiles of 64 rows: (T + 63) / 64 per (sequence, head).
enum { kAttentionRows = 64 }; // (an enumerator: no unused-variable warning)

// 2^x by the special-function unit alone (ex2.approx.ftz: relative error about 2^-22, subnormal
// results flushed to 0): exp2f adds the handling of subnormal results around it, which the
// softmax's probabilities (rounded to BF16 next) do not need.
__device__ __forceinline__ float exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// delta[b, h, t] = sum_d dout * out over one head of one row (ROUND: dout rounded to BF16, as
// the dp products read it): the softmax gradient's term of each query, from the forward's
// output. Eight lanes a row, their sums added in a fixed order.
template <bool ROUND, int B, int T, int H, int DH>
__device__ void attentionDelta(const float *dout, const float *out, float *delta) {
  const int64 row = (blockIdx.x * (int64)blockDim.x + threadIdx.x) / 8; // (b * T + t) * H + h
  const int lane = threadIdx.x % 8;
  const bool inside = row < (int64)B * T * H;
  float sum = 0.0f;
  if (inside)
    for (int d = lane; d < DH; d += 8)
      sum += gemmOperand<ROUND>(dout[row * DH + d]) * out[row * DH + d];
  for (int offset = 4; offset > 0; offset >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (inside && lane == 0) {
    int64 bt = row / H, b = bt / T, t = bt % T;
    delta[(b * H + row % H) * T + t] = sum;
  }
}

// ---- BF16 on tensor cores (gemm_dtype = "bf16": operands rounded to BF16, fp32 sums) ----
// Each op first writes its operands rounded to BF16 in head-major order ([part][B][H][T][DH],
// toHeadsBf16), so that a tile of rows of one head is contiguous: the tiles then travel to
// shared memory by cp.async, two stages deep (the next tile loads while this one is used), and
// into mma.sync fragments by ldmatrix.
// In mma.sync m16n8k16's fragments (tensorcore.cuh) the C fragments of two neighbouring 8-column
// tiles are the A fragment of their 16 columns: probabilities go from one product to the next
// without leaving registers. Rows of the shared
// tiles are padded by 8 elements, which spreads ldmatrix's eight row reads over all 32 banks.
// The softmax runs in base 2 (scores times scale * log2(e), exp2); lse is stored in the natural
// log, as the op defines it.

enum { kAttentionThreads = 128 }; // (an enumerator: no warning where only the other kernels are used)

// Rows of the packed qkv, [B, T, (H + 2 KV) DH] (q: H heads | k: KV | v: KV), and their
// head-major copy: q [B][H][T][DH], then k and v [B][KV][T][DH] (ir/Attributes.h's
// attentionHeadsType). Query head h reads KV head h / (H / KV) (grouped-query attention; KV = H
// is multi-head attention, the copy [3][B][H][T][DH]).
template <int B, int T, int H, int KV, int DH>
struct AttentionHeads {
  static constexpr int G = H / KV, D = H * DH, W = (H + 2 * KV) * DH, HALF = DH / 2;
  static constexpr int64 QPART = (int64)B * H * T * DH, KPART = (int64)B * KV * T * DH;
  // The copy's head `hh` of sequence b: q heads 0 .. H - 1, k heads H .. H + KV - 1, then v.
  static __device__ __forceinline__ int64 copyAt(int64 b, int hh) {
    return hh < H ? (b * H + hh) * T * DH
                  : hh < H + KV ? QPART + (b * KV + hh - H) * T * DH : QPART + KPART + (b * KV + hh - H - KV) * T * DH;
  }
  // The copy's k of query head h (v follows at + KPART).
  static __device__ __forceinline__ int64 keysOf(int64 b, int h) { return QPART + (b * KV + h / G) * T * DH; }
};

// src ([B, T, PARTS * H * DH] floats, or qkv's (H + 2 KV) heads) rounded to BF16 into dst
// head-major: qkv's three parts (AttentionHeads' copy; under ROPE q and k rotated first, by
// table: ir/Rope.h's cos and sin of positions 0 .. T - 1), or dout's one. Four elements a
// thread (under ROPE, a rotated head's four pairs a thread).
template <int B, int T, int PARTS, int H, int DH, int KV = H, bool ROPE = false>
__device__ void toHeadsBf16(const float *src, unsigned short *dst, const double *table = nullptr) {
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int HEADS = PARTS == 1 ? H : H + 2 * KV;
  FOR_EACH_ELEMENT(i, (int64)B * T * HEADS * DH / 4) {
    int64 r = i / (DH / 4);
    int d = 4 * (int)(i % (DH / 4)), hh = (int)(r % HEADS);
    int64 bt = r / HEADS, b = bt / T;
    int t = (int)(bt % T);
    int64 at = A::copyAt(b, hh) + (int64)t * DH + d;
    float4 x = *(const float4 *)(src + 4 * i);
    if constexpr (ROPE && PARTS == 3) {
      if (hh < H + KV) {
        if (d >= A::HALF)
          continue; // its pairs' thread writes these
        float4 y = *(const float4 *)(src + 4 * i + A::HALF);
        ropePair<T, A::HALF, false>(x.x, y.x, table, t, d);
        ropePair<T, A::HALF, false>(x.y, y.y, table, t, d + 1);
        ropePair<T, A::HALF, false>(x.z, y.z, table, t, d + 2);
        ropePair<T, A::HALF, false>(x.w, y.w, table, t, d + 3);
        *(uint2 *)(dst + at + A::HALF) = make_uint2(packBf16(y.x, y.y), packBf16(y.z, y.w));
      }
    }
    *(uint2 *)(dst + at) = make_uint2(packBf16(x.x, x.y), packBf16(x.z, x.w));
  }
}

// The packed rows src ([B, T, (H + 2 KV) DH]: fp32, or BF16 bits) into out with q and k rotated
// (INVERSE: back, the gradient's), v as it is: the thread-per-row kernels' rotated operand, and
// the gradients of the rotated q and k turned back. A pair a thread; src may be out.
template <int B, int T, int H, int KV, int DH, bool INVERSE, typename In, typename Out>
__device__ void ropeRows(const In *src, Out out, const double *table) {
  using A = AttentionHeads<B, T, H, KV, DH>;
  FOR_EACH_ELEMENT(p, (int64)B * T * (H + 2 * KV) * A::HALF) {
    int64 r = p / A::HALF, bt = r / (H + 2 * KV);
    int i = (int)(p % A::HALF), hh = (int)(r % (H + 2 * KV)), t = (int)(bt % T);
    int64 at = r * DH + i;
    float x = elementValue(src[at]), y = elementValue(src[at + A::HALF]);
    if (hh < H + KV)
      ropePair<T, A::HALF, INVERSE>(x, y, table, t, i);
    out[at] = x;
    out[at + A::HALF] = y;
  }
}

// A result cuDNN's attention wrote in BF16 (Cudnn.h): its fp32 form into `out` (for an
// F32Bf16Out with `src` its own BF16 copy, the fp32 half alone). Four elements a thread.
template <int64 N, typename Out>
__device__ void widenBf16(const unsigned short *src, Out out) {
  FOR_EACH_ELEMENT(i, N / 4) {
    uint2 bits = *(const uint2 *)(src + 4 * i);
    store4(out, 4 * i,
           make_float4(__uint_as_float(bits.x << 16), __uint_as_float(bits.x & 0xffff0000u),
                       __uint_as_float(bits.y << 16), __uint_as_float(bits.y & 0xffff0000u)));
  }
}

// The rows of the other side (keys, or queries in the key/value gradient) a shared tile holds:
// two stages of two tiles stay within 48 KB of static shared memory.
template <int DH>
__host__ __device__ constexpr int attentionTileRows() {
  return DH <= 64 ? 64 : DH <= 128 ? 32 : 16;
}

template <int R, int DH>
struct TilePair {
  unsigned short first[R][DH + 8], second[R][DH + 8];
};

// Rows [row0, row0 + R) of two head-major BF16 tensors into a stage (rows at or past T zero),
// by asynchronous copies; the caller commits them as a group.
template <int T, int DH, int R, int THREADS>
__device__ void copyTilesAsync(TilePair<R, DH> &stage, const unsigned short *first, const unsigned short *second,
                               int row0) {
  constexpr int CHUNKS = R * DH / 8; // 16 bytes each
#pragma unroll
  for (int i = threadIdx.x; i < CHUNKS; i += THREADS) {
    int r = i / (DH / 8), d = 8 * (i % (DH / 8)), row = row0 + r;
    bool valid = row < T;
    int64 at = (int64)(valid ? row : 0) * DH + d;
    copyAsync16(&stage.first[r][d], first + at, valid);
    copyAsync16(&stage.second[r][d], second + at, valid);
  }
}

// The A fragments of 16 rows of a head-major BF16 tensor (this lane's two: row0 and row0 + 8),
// straight from global memory; rows at or past T are 0.
template <int T, int DH>
__device__ void loadRowFragments(unsigned (*a)[4], const unsigned short *src, int row0) {
  int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int row = row0 + 8 * half;
      const unsigned short *p = src + (int64)row * DH + kk * 16 + c;
      a[kk][half] = row < T ? *(const unsigned *)p : 0u;
      a[kk][2 + half] = row < T ? *(const unsigned *)(p + 8) : 0u;
    }
}

// s = (16 rows of a) x (rows [0, 8 NJ) of tile)^T: NJ C fragments over the tile's rows.
template <int DH, int NJ>
__device__ __forceinline__ void scoresBf16(float (*s)[4], const unsigned (*a)[4], const unsigned short (*tile)[DH + 8]) {
  static_assert(NJ % 2 == 0, "ldmatrix takes two 8-row tiles at once");
  int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int j = 0; j < NJ; ++j)
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk)
#pragma unroll
    for (int j = 0; j < NJ; j += 2) {
      unsigned b[4]; // rows 8j.. and 8(j+1).., columns 16kk.. and 16kk + 8..
      loadMatrices<false>(b, &tile[(j + m / 2) * 8 + lane % 8][kk * 16 + (m % 2) * 8]);
      mmaBf16(s[j], a[kk], b[0], b[1]);
      mmaBf16(s[j + 1], a[kk], b[2], b[3]);
    }
}

// acc += p x tile: p 16 x (8 NJ) (NJ C fragments, rounded to BF16 here), tile (8 NJ) x DH.
template <int DH, int NJ>
__device__ __forceinline__ void accumulateBf16(float (*acc)[4], const float (*p)[4], const unsigned short (*tile)[DH + 8]) {
  int lane = threadIdx.x % 32, m = lane / 8;
#pragma unroll
  for (int kk = 0; kk < NJ / 2; ++kk) {
    unsigned a[4] = {packBf16(p[2 * kk][0], p[2 * kk][1]), packBf16(p[2 * kk][2], p[2 * kk][3]),
                     packBf16(p[2 * kk + 1][0], p[2 * kk + 1][1]), packBf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < DH / 8; n += 2) {
      unsigned b[4]; // rows 16kk.. and 16kk + 8.., columns 8n.. and 8(n+1).., transposed
      loadMatrices<true>(b, &tile[kk * 16 + (m % 2) * 8 + lane % 8][(n + m / 2) * 8]);
      mmaBf16(acc[n], a, b[0], b[1]);
      mmaBf16(acc[n + 1], a, b[2], b[3]);
    }
  }
}

// The forward for 64 queries (a block: four warps of 16): out = softmax(mask(scale q k^T)) v,
// over key tiles of R rows, and each query's log-sum-exp for the gradient. heads is
// toHeadsBf16's q | k | v.
template <int B, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionForwardBf16(const unsigned short *heads, Out out, float *lse, float scale) {
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows, R = attentionTileRows<DH>();
  __shared__ __align__(16) TilePair<R, DH> stages[2]; // keys, values
  const int tile = TILES - 1 - blockIdx.x % TILES; // the longest rows of tiles first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, c = 2 * (threadIdx.x % 4);
  const unsigned short *q = heads + (int64)bh * T * DH, *k = heads + A::keysOf(b, h), *v = k + A::KPART;
  const int row0 = tile * kAttentionRows + warp * 16 + threadIdx.x % 32 / 4, row1 = row0 + 8;
  const int last = (min(T, (tile + 1) * kAttentionRows) - 1) / R; // the last key tile
  const float scaleLog2 = scale * 1.4426950408889634f;
  copyTilesAsync<T, DH, R, kAttentionThreads>(stages[0], k, v, 0);
  commitCopies();
  unsigned qa[DH / 16][4];
  loadRowFragments<T, DH>(qa, q, row0);
  float o[DH / 8][4] = {};
  float m0 = __int_as_float(0xff800000), m1 = m0, l0 = 0.0f, l1 = 0.0f;
  for (int kt = 0; kt <= last; ++kt) {
    TilePair<R, DH> &stage = stages[kt & 1];
    if (kt < last)
      copyTilesAsync<T, DH, R, kAttentionThreads>(stages[(kt + 1) & 1], k, v, (kt + 1) * R);
    commitCopies(); // (an empty group after the last tile: the wait below counts the same way)
    waitForAllButLatestCopies();
    __syncthreads();
    float s[R / 8][4];
    scoresBf16<DH, R / 8>(s, qa, stage.first);
    // The maxima of the raw scores, then scaled once (scaleLog2 > 0 keeps the order, and
    // rounding keeps it too): each probability is then one FFMA and one ex2.
    float raw0 = __int_as_float(0xff800000), raw1 = raw0;
    const bool diagonal = kt * R + R - 1 > tile * kAttentionRows; // keys past some rows
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = kt * R + j * 8 + c + (e & 1);
        if (diagonal && key > (e < 2 ? row0 : row1))
          s[j][e] = __int_as_float(0xff800000);
        if (e < 2) raw0 = fmaxf(raw0, s[j][e]); else raw1 = fmaxf(raw1, s[j][e]);
      }
    const float max0 = fmaxf(m0, quadMax(raw0) * scaleLog2), max1 = fmaxf(m1, quadMax(raw1) * scaleLog2);
    // Key 0 is in every row's first tile: the maxima are finite from there on.
    float alpha0 = exp2Approx(m0 - max0), alpha1 = exp2Approx(m1 - max1);
    m0 = max0;
    m1 = max1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2Approx(fmaf(s[j][e], scaleLog2, -(e < 2 ? m0 : m1)));
        s[j][e] = p;
        if (e < 2) sum0 += p; else sum1 += p;
      }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] *= alpha0; o[n][1] *= alpha0;
      o[n][2] *= alpha1; o[n][3] *= alpha1;
    }
    accumulateBf16<DH, R / 8>(o, s, stage.second);
    __syncthreads(); // every warp is done with this stage before it is loaded again
  }
  l0 = quadSum(l0);
  l1 = quadSum(l1);
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = e < 2 ? row0 : row1, d = n * 8 + c + (e & 1);
      if (row < T)
        out[((int64)b * T + row) * D + h * DH + d] = o[n][e] / (e < 2 ? l0 : l1);
    }
  if (threadIdx.x % 4 == 0) { // back from base 2 to the natural log
    if (row0 < T) lse[(int64)bh * T + row0] = (m0 + log2f(l0)) * 0.6931471805599453f;
    if (row1 < T) lse[(int64)bh * T + row1] = (m1 + log2f(l1)) * 0.6931471805599453f;
  }
}

// Under ROPE, the gradient of rotated q (or k) in C fragments turned back (rope's gradient) at
// rows row0 and row1: column d's pair d + DH / 2 is fragment n + DH / 16 of the same lane.
template <int T, int DH, bool ROPE>
__device__ __forceinline__ void rotateFragmentsBack(float (*acc)[4], int row0, int row1, int c, const double *table) {
  if constexpr (ROPE) {
#pragma unroll
    for (int n = 0; n < DH / 16; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int row = e < 2 ? row0 : row1;
        if (row < T)
          ropePair<T, DH / 2, true>(acc[n][e], acc[n + DH / 16][e], table, row, n * 8 + c + (e & 1));
      }
  }
}

// dk and dv for 64 keys (four warps of 16): each query tile of R rows from the keys' own on,
// p^T and dp^T = v dout^T recomputed from the forward's lse and delta (attentionDelta).
// Under grouped-query attention a block takes the keys of one KV head and walks the queries of
// its G query heads in turn (their sums in that order: the same bits every run).
template <int B, int T, int H, int DH, int KV = H, bool ROPE = false, typename Out>
__device__ void attentionKeyValueGradBf16(const unsigned short *dout, const unsigned short *heads, Out dqkv,
                                          float scale, const float *lse, const float *delta,
                                          const double *table = nullptr) {
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows, R = attentionTileRows<DH>();
  constexpr int SUB = DH <= 64 ? 32 : 16; // queries a step: fewer registers live next to dk and dv
  __shared__ __align__(16) TilePair<R, DH> stages[2]; // queries, dout
  const int tile = blockIdx.x % TILES; // the earliest keys have the most queries: first
  const int bkv = blockIdx.x / TILES, b = bkv / KV, kvh = bkv % KV;
  const int warp = threadIdx.x / 32, c = 2 * (threadIdx.x % 4);
  const unsigned short *q = nullptr, *dy = nullptr;
  const float *rowLse = nullptr, *rowDelta = nullptr;
  const int key0 = tile * kAttentionRows + warp * 16 + threadIdx.x % 32 / 4, key1 = key0 + 8;
  const int first = tile * kAttentionRows / R, last = (T - 1) / R; // query tiles
  const float scaleLog2 = scale * 1.4426950408889634f;
  // Each stage's queries' lse and delta arrive with its tiles.
  __shared__ float lses[2][R], deltas[2][R];
  auto copyStage = [&](int stage, int qt) {
    copyTilesAsync<T, DH, R, kAttentionThreads>(stages[stage], q, dy, qt * R);
    for (int i = threadIdx.x; i < R; i += kAttentionThreads) {
      int query = qt * R + i;
      copyAsync4(&lses[stage][i], rowLse + (query < T ? query : 0), query < T);
      copyAsync4(&deltas[stage][i], rowDelta + (query < T ? query : 0), query < T);
    }
    commitCopies();
  };
  unsigned ka[DH / 16][4], va[DH / 16][4];
  const unsigned short *keys = heads + A::QPART + (int64)bkv * T * DH;
  loadRowFragments<T, DH>(ka, keys, key0);
  loadRowFragments<T, DH>(va, keys + A::KPART, key0);
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  for (int g = 0; g < A::G; ++g) {
    const int64 bh = (int64)b * H + kvh * A::G + g;
    q = heads + bh * T * DH;
    dy = dout + bh * T * DH;
    rowLse = lse + bh * T;
    rowDelta = delta + bh * T;
    copyStage(0, first);
    for (int qt = first; qt <= last; ++qt) {
      const int current = (qt - first) & 1;
      TilePair<R, DH> &stage = stages[current];
      if (qt < last)
        copyStage(current ^ 1, qt + 1);
      else
        commitCopies();
      waitForAllButLatestCopies();
      __syncthreads();
      const bool edge = qt * R < tile * kAttentionRows + kAttentionRows || qt * R + R > T; // diagonal or last
#pragma unroll
      for (int part = 0; part < R / SUB; ++part) {
        float p[SUB / 8][4], dp[SUB / 8][4];
        scoresBf16<DH, SUB / 8>(p, ka, stage.first + SUB * part);   // s^T: keys x queries
        scoresBf16<DH, SUB / 8>(dp, va, stage.second + SUB * part); // dp^T = v dout^T
#pragma unroll
        for (int j = 0; j < SUB / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            int i = SUB * part + j * 8 + c + e, query = qt * R + i;
            bool inside = query < T;
            float l = lses[current][i] * 1.4426950408889634f, dl = deltas[current][i];
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              int at = 2 * half + e, key = half ? key1 : key0;
              float prob = exp2Approx(fmaf(p[j][at], scaleLog2, -l));
              if (edge && (key > query || !inside))
                prob = 0.0f;
              p[j][at] = prob;
              dp[j][at] = prob * (dp[j][at] - dl) * scale; // ds^T
            }
          }
        accumulateBf16<DH, SUB / 8>(dv, p, stage.second + SUB * part);
        accumulateBf16<DH, SUB / 8>(dk, dp, stage.first + SUB * part);
      }
      __syncthreads();
    }
  }
  rotateFragmentsBack<T, DH, ROPE>(dk, key0, key1, c, table);
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int key = e < 2 ? key0 : key1, d = n * 8 + c + (e & 1);
      if (key >= T)
        continue;
      int64 at = ((int64)b * T + key) * A::W + D + kvh * DH + d;
      dqkv[at] = dk[n][e];
      dqkv[at + KV * DH] = dv[n][e];
    }
}

// dq for 64 queries: ds = p (dp - delta) scale against every key tile up to theirs, times k.
template <int B, int T, int H, int DH, int KV = H, bool ROPE = false, typename Out>
__device__ void attentionQueryGradBf16(const unsigned short *dout, const unsigned short *heads, Out dqkv, float scale,
                                       const float *lse, const float *delta, const double *table = nullptr) {
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int TILES = (T + kAttentionRows - 1) / kAttentionRows, R = attentionTileRows<DH>();
  __shared__ __align__(16) TilePair<R, DH> stages[2]; // keys, values
  const int tile = TILES - 1 - blockIdx.x % TILES;
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, c = 2 * (threadIdx.x % 4);
  const unsigned short *q = heads + (int64)bh * T * DH, *k = heads + A::keysOf(b, h), *v = k + A::KPART;
  const int row0 = tile * kAttentionRows + warp * 16 + threadIdx.x % 32 / 4, row1 = row0 + 8;
  const int last = (min(T, (tile + 1) * kAttentionRows) - 1) / R;
  const float scaleLog2 = scale * 1.4426950408889634f;
  copyTilesAsync<T, DH, R, kAttentionThreads>(stages[0], k, v, 0);
  commitCopies();
  unsigned qa[DH / 16][4], da[DH / 16][4];
  loadRowFragments<T, DH>(qa, q, row0);
  loadRowFragments<T, DH>(da, dout + (int64)bh * T * DH, row0);
  const float log2e = 1.4426950408889634f; // lse in base 2, as the scores here
  float lse0 = row0 < T ? lse[(int64)bh * T + row0] * log2e : 0.0f, lse1 = row1 < T ? lse[(int64)bh * T + row1] * log2e : 0.0f;
  float delta0 = row0 < T ? delta[(int64)bh * T + row0] : 0.0f, delta1 = row1 < T ? delta[(int64)bh * T + row1] : 0.0f;
  float dq[DH / 8][4] = {};
  for (int kt = 0; kt <= last; ++kt) {
    TilePair<R, DH> &stage = stages[kt & 1];
    if (kt < last)
      copyTilesAsync<T, DH, R, kAttentionThreads>(stages[(kt + 1) & 1], k, v, (kt + 1) * R);
    commitCopies();
    waitForAllButLatestCopies();
    __syncthreads();
    float ds[R / 8][4], dp[R / 8][4];
    scoresBf16<DH, R / 8>(ds, qa, stage.first);
    scoresBf16<DH, R / 8>(dp, da, stage.second);
    const bool diagonal = kt * R + R - 1 > tile * kAttentionRows;
#pragma unroll
    for (int j = 0; j < R / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = kt * R + j * 8 + c + (e & 1), row = e < 2 ? row0 : row1;
        float prob = exp2Approx(fmaf(ds[j][e], scaleLog2, -(e < 2 ? lse0 : lse1)));
        if (diagonal && key > row)
          prob = 0.0f;
        ds[j][e] = prob * (dp[j][e] - (e < 2 ? delta0 : delta1)) * scale;
      }
    accumulateBf16<DH, R / 8>(dq, ds, stage.first);
    __syncthreads();
  }
  rotateFragmentsBack<T, DH, ROPE>(dq, row0, row1, c, table);
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = e < 2 ? row0 : row1, d = n * 8 + c + (e & 1);
      if (row < T)
        dqkv[((int64)b * T + row) * A::W + h * DH + d] = dq[n][e];
    }
}
// ---- A thread per query (or key), CUDA-core products ----
// fp32 attention (no gemm_dtype), and BF16 attention whose head dimension the tensor-core
// kernels do not take (ROUND: the operands and the probabilities rounded to BF16 where the
// BF16 GEMMs round them). Blocks of 64 threads, the other side through shared memory 32 rows at
// a time.
template <bool ROUND, int T, int DH>
__device__ void loadSimtTile(float (*tile)[DH], const float *src, int64 stride, int first) {
  for (int i = threadIdx.x; i < 32 * DH; i += blockDim.x) {
    int r = i / DH, d = i % DH;
    tile[r][d] = first + r < T ? gemmOperand<ROUND>(src[(first + r) * stride + d]) : 0.0f;
  }
}

// Keys and values k0 .. k0 + 31 of one head into shared memory, once every thread is done with
// the previous ones.
template <bool ROUND, int T, int DH>
__device__ void loadKeyValueTiles(float (*ks)[DH], float (*vs)[DH], const float *keys, const float *values, int W,
                                  int k0) {
  __syncthreads();
  loadSimtTile<ROUND, T, DH>(ks, keys, W, k0);
  loadSimtTile<ROUND, T, DH>(vs, values, W, k0);
  __syncthreads();
}

template <int DH>
__device__ __forceinline__ float dotSimt(const float *a, const float *b) {
  float s = 0.0f;
  for (int d = 0; d < DH; ++d)
    s += a[d] * b[d];
  return s;
}

// qkv's rows hold H query heads, then KV key heads and KV value heads (AttentionHeads); query
// head h reads KV head h / (H / KV). Rotated (RoPE) q and k come rotated (ropeRows first).
template <bool ROUND, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionForwardSimt(const float *qkv, Out out, float *lse, float scale) {
  constexpr int D = H * DH, W = (H + 2 * KV) * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float ks[32][DH], vs[32][DH];
  const int tile = TILES - 1 - blockIdx.x % TILES, bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int row = tile * kAttentionRows + threadIdx.x;
  const float *q = qkv + (int64)b * T * W + h * DH, *keys = qkv + (int64)b * T * W + D + h / (H / KV) * DH;
  float qr[DH], o[DH];
  for (int d = 0; d < DH; ++d) {
    qr[d] = row < T ? gemmOperand<ROUND>(q[(int64)row * W + d]) : 0.0f;
    o[d] = 0.0f;
  }
  float m = __int_as_float(0xff800000), l = 0.0f;
  const int last = min(T, (tile + 1) * kAttentionRows);
  for (int k0 = 0; k0 < last; k0 += 32) {
    loadKeyValueTiles<ROUND, T, DH>(ks, vs, keys, keys + KV * DH, W, k0);
    for (int j = 0; j < 32 && k0 + j <= row && k0 + j < T; ++j) {
      float s = dotSimt<DH>(qr, ks[j]) * scale;
      if (s > m) {
        float alpha = expf(m - s);
        l *= alpha;
        for (int d = 0; d < DH; ++d)
          o[d] *= alpha;
        m = s;
      }
      float p = expf(s - m);
      l += p;
      for (int d = 0; d < DH; ++d)
        o[d] += gemmOperand<ROUND>(p) * vs[j][d];
    }
  }
  if (row >= T)
    return;
  int64 at = ((int64)b * T + row) * D + h * DH;
  for (int d = 0; d < DH; ++d)
    out[at + d] = o[d] / l;
  lse[(int64)bh * T + row] = m + logf(l);
}

// A block per 64 keys of one KV head, walking the queries of its H / KV query heads in turn.
template <bool ROUND, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionKeyValueGradSimt(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, W = (H + 2 * KV) * DH, G = H / KV, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float qs[32][DH], dos[32][DH], lses[32], deltas[32];
  const int tile = blockIdx.x % TILES, bkv = blockIdx.x / TILES, b = bkv / KV, kvh = bkv % KV;
  const int key = tile * kAttentionRows + threadIdx.x;
  const float *keys = qkv + (int64)b * T * W + D + kvh * DH;
  float kr[DH], vr[DH], dk[DH], dv[DH];
  for (int d = 0; d < DH; ++d) {
    kr[d] = key < T ? gemmOperand<ROUND>(keys[(int64)key * W + d]) : 0.0f;
    vr[d] = key < T ? gemmOperand<ROUND>(keys[(int64)key * W + KV * DH + d]) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (int g = 0; g < G; ++g) {
    const int h = kvh * G + g;
    const int64 bh = (int64)b * H + h;
    const float *q = qkv + (int64)b * T * W + h * DH, *dy = dout + (int64)b * T * D + h * DH;
    for (int q0 = tile * kAttentionRows; q0 < T; q0 += 32) {
      __syncthreads();
      loadSimtTile<ROUND, T, DH>(qs, q, W, q0);
      loadSimtTile<ROUND, T, DH>(dos, dy, D, q0);
      if (threadIdx.x < 32) {
        int row = q0 + threadIdx.x;
        lses[threadIdx.x] = row < T ? lse[bh * T + row] : 0.0f;
        deltas[threadIdx.x] = row < T ? delta[bh * T + row] : 0.0f;
      }
      __syncthreads();
      for (int j = 0; j < 32; ++j) {
        int query = q0 + j;
        if (query < key || query >= T)
          continue;
        float p = expf(dotSimt<DH>(kr, qs[j]) * scale - lses[j]);
        float ds = p * (dotSimt<DH>(vr, dos[j]) - deltas[j]) * scale;
        for (int d = 0; d < DH; ++d) {
          dv[d] += gemmOperand<ROUND>(p) * dos[j][d];
          dk[d] += gemmOperand<ROUND>(ds) * qs[j][d];
        }
      }
    }
  }
  if (key >= T)
    return;
  int64 at = ((int64)b * T + key) * W + D + kvh * DH;
  for (int d = 0; d < DH; ++d) {
    dqkv[at + d] = dk[d];
    dqkv[at + KV * DH + d] = dv[d];
  }
}

template <bool ROUND, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionQueryGradSimt(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, W = (H + 2 * KV) * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float ks[32][DH], vs[32][DH];
  const int tile = TILES - 1 - blockIdx.x % TILES, bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int row = tile * kAttentionRows + threadIdx.x;
  const float *q = qkv + (int64)b * T * W + h * DH, *dy = dout + (int64)b * T * D + h * DH;
  const float *keys = qkv + (int64)b * T * W + D + h / (H / KV) * DH;
  float qr[DH], dr[DH], dq[DH];
  for (int d = 0; d < DH; ++d) {
    qr[d] = row < T ? gemmOperand<ROUND>(q[(int64)row * W + d]) : 0.0f;
    dr[d] = row < T ? gemmOperand<ROUND>(dy[(int64)row * D + d]) : 0.0f;
    dq[d] = 0.0f;
  }
  const float rowLse = row < T ? lse[(int64)bh * T + row] : 0.0f;
  const float rowDelta = row < T ? delta[(int64)bh * T + row] : 0.0f;
  const int last = min(T, (tile + 1) * kAttentionRows);
  for (int k0 = 0; k0 < last; k0 += 32) {
    loadKeyValueTiles<ROUND, T, DH>(ks, vs, keys, keys + KV * DH, W, k0);
    for (int j = 0; j < 32 && k0 + j <= row && k0 + j < T; ++j) {
      float p = expf(dotSimt<DH>(qr, ks[j]) * scale - rowLse);
      float ds = p * (dotSimt<DH>(dr, vs[j]) - rowDelta) * scale;
      for (int d = 0; d < DH; ++d)
        dq[d] += gemmOperand<ROUND>(ds) * ks[j][d];
    }
  }
  if (row < T)
    for (int d = 0; d < DH; ++d)
      dqkv[((int64)b * T + row) * W + h * DH + d] = dq[d];
}
