// The causal attention's key/value gradient on Hopper's warpgroup products (wgmma.cuh; sm_90a):
// the same function as attention.cuh's attentionKeyValueGradBf16 (multi-head attention, no
// RoPE): dk and dv for 128 keys (two warpgroups of 64), walking the query tiles of 64 from the
// keys' own on. With the keys as the products' rows (FlashAttention-3's swapped form), s^T = k
// q^T and dp^T = v dout^T come out with a warpgroup's keys as rows, so p^T and ds^T are already
// the A fragments of dv += p^T dout and dk += ds^T q, in registers. k and v of the block's keys
// stay in shared memory; queries, dout and their lse and delta arrive by cp.async, two stages.
#pragma once

#include "attention_wgmma.cuh"

enum { kGradQueries = 64 }; // queries a step

// The shared memory attentionKeyValueGradWgmma takes: keys and values (128 rows each), two
// stages of queries and dout (64 rows each) with their lse and delta, and 1 KB to align.
template <int DH> __host__ __device__ constexpr int attentionGradWgmmaShared() {
  return 2 * kWgmmaRows * DH * 2 + 4 * kGradQueries * DH * 2 + 4 * kGradQueries * 4 + 1024;
}

// This lane's first key row (and that + 8) in a gradient block of 128 keys (key tile `tile`),
// warpgroup `group` taking rows 64 group on: the rows of its accumulators.
__device__ __forceinline__ int gradKey0(int tile, int group) {
  return tile * kWgmmaRows + group * 64 + threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
}

// Issues s^T = k q^T and dp^T = v dout^T for this warpgroup's 64 keys (`group`'s rows of the
// 128-row key and value tiles) and a 64-row query tile (queries and dout: shared addresses of
// tiles whose 64-value blocks are `block` bytes apart). PARTS: 1 s^T alone, 2 dp^T alone, 3 both.
template <int DH, int PARTS = 3>
__device__ __forceinline__ void issueGradScores(float (*st)[4], float (*dpt)[4], unsigned keys, unsigned values,
                                                unsigned queries, unsigned dout, unsigned block, int group) {
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    unsigned keysAlong = kk / 4 * kWgmmaRows * 128 + group * 64 * 128 + kk % 4 * 32,
             along = kk / 4 * block + kk % 4 * 32;
    if (PARTS & 1)
      wgmmaShared<kGradQueries>(st, wgmmaDescriptor(keys + keysAlong, 0, 1024),
                                wgmmaDescriptor(queries + along, 0, 1024), kk > 0);
    if (PARTS & 2)
      wgmmaShared<kGradQueries>(dpt, wgmmaDescriptor(values + keysAlong, 0, 1024),
                                wgmmaDescriptor(dout + along, 0, 1024), kk > 0);
  }
}

// The lse of this lane's query column j * 8 + 2 (lane % 4) + e: from shared memory, or held.
__device__ __forceinline__ float lseAt(const float *lses, int j, int e) {
  return lses[j * 8 + 2 * (threadIdx.x % 4) + e];
}
__device__ __forceinline__ float lseAt(const float2 *held, int j, int e) { return e ? held[j].y : held[j].x; }

// This lane's columns' lses into registers (held[j]: columns j * 8 + 2 (lane % 4) and the next),
// loaded while the products that precede their use run.
__device__ __forceinline__ void lseHeld(float2 *held, const float *lses) {
#pragma unroll
  for (int j = 0; j < kGradQueries / 8; ++j)
    held[j] = *(const float2 *)(lses + j * 8 + 2 * (threadIdx.x % 4));
}

// p^T = exp(s^T scale - lse) for query tile qt (lses its 64 queries'), in st and as the A
// fragments of dv's product (pa); 0 past the causal diagonal and T (EDGE: the tile may have such
// queries; a template argument, so that the tiles below the diagonal pay for no compares and
// selects).
// Lses: the 64 queries' in shared memory (const float *), or this lane's columns' held in
// registers (const float2 *: lseHeld's).
template <int T, bool EDGE, typename Lses>
__device__ __forceinline__ void gradProbabilitiesP(unsigned (*pa)[4], float (*st)[4], Lses lses, int qt, int key0,
                                                   float scale) {
  const int c = 2 * (threadIdx.x % 4);
  const float scaleLog2 = scale * 1.4426950408889634f;
#pragma unroll
  for (int j = 0; j < kGradQueries / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int query = qt * kGradQueries + j * 8 + c + e;
      const float l = lseAt(lses, j, e) * 1.4426950408889634f;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int at = 2 * half + e;
        const float prob = exp2Approx(fmaf(st[j][at], scaleLog2, -l));
        st[j][at] = EDGE && (key0 + 8 * half > query || query >= T) ? 0.0f : prob;
      }
    }
    pa[j / 2][2 * (j % 2)] = packBf16(st[j][0], st[j][1]);
    pa[j / 2][2 * (j % 2) + 1] = packBf16(st[j][2], st[j][3]);
  }
}

// ds^T = p^T (dp^T - delta) scale from gradProbabilitiesP's p^T (st), as the A fragments of
// dk's product (da); 0 where p^T is masked.
template <int T, bool EDGE>
__device__ __forceinline__ void gradProbabilitiesDs(unsigned (*da)[4], const float (*st)[4], float (*dpt)[4],
                                                    const float *deltas, int qt, int key0, float scale) {
  const int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < kGradQueries / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int query = qt * kGradQueries + j * 8 + c + e;
      const float dl = deltas[j * 8 + c + e];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int at = 2 * half + e;
        const bool masked = EDGE && (key0 + 8 * half > query || query >= T);
        dpt[j][at] = masked ? 0.0f : st[j][at] * (dpt[j][at] - dl) * scale;
      }
    }
    da[j / 2][2 * (j % 2)] = packBf16(dpt[j][0], dpt[j][1]);
    da[j / 2][2 * (j % 2) + 1] = packBf16(dpt[j][2], dpt[j][3]);
  }
}

// p^T and ds^T as gradProbabilitiesP and gradProbabilitiesDs (lses and deltas the 64 queries').
template <int T, bool EDGE>
__device__ __forceinline__ void gradProbabilitiesOf(unsigned (*pa)[4], unsigned (*da)[4], float (*st)[4],
                                                    float (*dpt)[4], const float *lses, const float *deltas, int qt,
                                                    int key0, float scale) {
  gradProbabilitiesP<T, EDGE>(pa, st, lses, qt, key0, scale);
  gradProbabilitiesDs<T, EDGE>(da, st, dpt, deltas, qt, key0, scale);
}

template <int T>
__device__ __forceinline__ void gradProbabilities(unsigned (*pa)[4], unsigned (*da)[4], float (*st)[4], float (*dpt)[4],
                                                  const float *lses, const float *deltas, int qt, int key0, bool edge,
                                                  float scale) {
  if (edge)
    gradProbabilitiesOf<T, true>(pa, da, st, dpt, lses, deltas, qt, key0, scale);
  else
    gradProbabilitiesOf<T, false>(pa, da, st, dpt, lses, deltas, qt, key0, scale);
}

// Issues dv += p^T dout and dk += ds^T q over a 64-row query tile (q and dout read transposed).
// PARTS: 1 dv alone, 2 dk alone, 3 both.
template <int DH, int PARTS = 3>
__device__ __forceinline__ void issueKeyValueGrads(float (*dv)[4], float (*dk)[4], const unsigned (*pa)[4],
                                                   const unsigned (*da)[4], unsigned queries, unsigned dout,
                                                   unsigned block) {
#pragma unroll
  for (int kk = 0; kk < kGradQueries / 16; ++kk) { // queries 16 kk ..: 16 rows of 128 bytes on
    if (PARTS & 1)
      wgmmaRegisters<DH>(dv, pa[kk], wgmmaDescriptor(dout + kk * 16 * 128, block, 1024), 1);
    if (PARTS & 2)
      wgmmaRegisters<DH>(dk, da[kk], wgmmaDescriptor(queries + kk * 16 * 128, block, 1024), 1);
  }
}

// dk and dv of this lane's keys into dqkv's k and v parts ([B, T, 3 H DH]).
template <int T, int H, int DH, typename Out>
__device__ void storeKeyValueGrads(const float (*dk)[4], const float (*dv)[4], Out dqkv, int b, int h, int key0) {
  const int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int key = key0 + (e < 2 ? 0 : 8), d = n * 8 + c + (e & 1);
      if (key >= T)
        continue;
      int64 at = ((int64)b * T + key) * 3 * H * DH + H * DH + h * DH + d;
      dqkv[at] = dk[n][e];
      dqkv[at + H * DH] = dv[n][e];
    }
}

template <int B, int T, int H, int DH, typename Out>
__device__ void attentionKeyValueGradWgmma(const unsigned short *dout, const unsigned short *heads, Out dqkv,
                                           float scale, const float *lse, const float *delta) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  using A = AttentionHeads<B, T, H, H, DH>;
  constexpr int NK = kWgmmaRows, MQ = kGradQueries, TILES = (T + NK - 1) / NK;
  constexpr int KEYS = NK * DH * 2, QUERIES = MQ * DH * 2; // bytes of a tile
  unsigned char *keys = alignedShared();
  // keys | values | (queries | dout) x 2 | lse x 2 | delta x 2
  float *lses = (float *)(keys + 2 * KEYS + 4 * QUERIES), *deltas = lses + 2 * MQ;
  const unsigned keysAt = sharedAddress(keys), valuesAt = keysAt + KEYS;
  auto queriesAt = [&](int stage) { return keysAt + 2 * KEYS + 2 * stage * QUERIES; };
  const int tile = blockIdx.x % TILES; // the earliest keys have the most queries: first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H, group = threadIdx.x / 128;
  const int key0 = gradKey0(tile, group);                                                       // and key0 + 8
  const int first = tile * NK / MQ, last = (T - 1) / MQ;                                        // query tiles
  const unsigned short *q = heads + (int64)bh * T * DH, *dy = dout + (int64)bh * T * DH;
  const unsigned short *k = heads + A::QPART + (int64)bh * T * DH, *v = k + A::KPART;
  auto copyStage = [&](int stage, int qt) {
    unsigned char *at = keys + 2 * KEYS + 2 * stage * QUERIES;
    copySwizzledAsync<T, DH, MQ>(at, q, qt * MQ);
    copySwizzledAsync<T, DH, MQ>(at + QUERIES, dy, qt * MQ);
    for (int i = threadIdx.x; i < MQ; i += kWgmmaThreads) {
      int query = qt * MQ + i;
      copyAsync4(&lses[stage * MQ + i], lse + (int64)bh * T + (query < T ? query : 0), query < T);
      copyAsync4(&deltas[stage * MQ + i], delta + (int64)bh * T + (query < T ? query : 0), query < T);
    }
    commitCopies();
  };
  copySwizzledAsync<T, DH, NK>(keys, k, tile * NK);
  copySwizzledAsync<T, DH, NK>(keys + KEYS, v, tile * NK);
  copyStage(0, first);
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  for (int qt = first; qt <= last; ++qt) {
    const int stage = (qt - first) & 1;
    if (qt < last)
      copyStage(stage ^ 1, qt + 1);
    else
      commitCopies();
    awaitCopiedStage();
    float st[MQ / 8][4], dpt[MQ / 8][4]; // s^T and dp^T: this warpgroup's 64 keys x 64 queries
    wgmmaFence();
    issueGradScores<DH>(st, dpt, keysAt, valuesAt, queriesAt(stage), queriesAt(stage) + QUERIES, MQ * 128, group);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<MQ / 8>(st);
    fenceAccumulators<MQ / 8>(dpt);
    const bool edge = qt * MQ < tile * NK + NK || qt * MQ + MQ > T; // diagonal or last
    unsigned pa[MQ / 16][4], da[MQ / 16][4];                        // p^T and ds^T as A fragments
    gradProbabilities<T>(pa, da, st, dpt, lses + stage * MQ, deltas + stage * MQ, qt, key0, edge, scale);
    wgmmaFence();
    issueKeyValueGrads<DH>(dv, dk, pa, da, queriesAt(stage), queriesAt(stage) + QUERIES, MQ * 128);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(dv);
    fenceAccumulators<DH / 8>(dk);
    __syncthreads(); // both warpgroups are done with this stage before it is loaded again
  }
  storeKeyValueGrads<T, H, DH>(dk, dv, dqkv, b, h, key0);
}

// The shared memory attentionQueryGradWgmma takes: queries and dout (128 rows each), two
// stages of keys and values (64 rows each), and 1 KB to align.
template <int DH> __host__ __device__ constexpr int attentionQueryGradWgmmaShared() {
  return 2 * kWgmmaRows * DH * 2 + 4 * kGradQueries * DH * 2 + 1024;
}

// dq for 128 queries (two warpgroups of 64), as attentionQueryGradBf16: against each key tile of
// 64 up to theirs, s = q k^T and dp = dout v^T (q and dout from shared memory), ds = p (dp -
// delta) scale in registers, dq += ds k with k read transposed.
template <int B, int T, int H, int DH, typename Out>
__device__ void attentionQueryGradWgmma(const unsigned short *dout, const unsigned short *heads, Out dqkv, float scale,
                                        const float *lse, const float *delta) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  using A = AttentionHeads<B, T, H, H, DH>;
  constexpr int MQ = kWgmmaRows, NK = kGradQueries, TILES = (T + MQ - 1) / MQ;
  constexpr int QUERIES = MQ * DH * 2, KEYS = NK * DH * 2; // bytes of a tile
  unsigned char *queries = alignedShared();
  const unsigned queriesAt = sharedAddress(queries);
  auto keysAt = [&](int stage) { return queriesAt + 2 * QUERIES + 2 * stage * KEYS; }; // values follow
  const int tile = TILES - 1 - blockIdx.x % TILES; // the longest rows of tiles first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H, group = threadIdx.x / 128;
  const int c = 2 * (threadIdx.x % 4);
  const int row0 = tile * MQ + group * 64 + threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4, row1 = row0 + 8;
  const int last = (min(T, (tile + 1) * MQ) - 1) / NK; // the last key tile
  const float scaleLog2 = scale * 1.4426950408889634f;
  const unsigned short *q = heads + (int64)bh * T * DH, *dy = dout + (int64)bh * T * DH;
  const unsigned short *k = heads + A::QPART + (int64)bh * T * DH, *v = k + A::KPART;
  const float lse0 = row0 < T ? lse[(int64)bh * T + row0] * 1.4426950408889634f : 0.0f;
  const float lse1 = row1 < T ? lse[(int64)bh * T + row1] * 1.4426950408889634f : 0.0f;
  const float delta0 = row0 < T ? delta[(int64)bh * T + row0] : 0.0f;
  const float delta1 = row1 < T ? delta[(int64)bh * T + row1] : 0.0f;
  auto copyStage = [&](int stage, int kt) {
    unsigned char *at = queries + 2 * QUERIES + 2 * stage * KEYS;
    copySwizzledAsync<T, DH, NK>(at, k, kt * NK);
    copySwizzledAsync<T, DH, NK>(at + KEYS, v, kt * NK);
    commitCopies();
  };
  copySwizzledAsync<T, DH, MQ>(queries, q, tile * MQ);
  copySwizzledAsync<T, DH, MQ>(queries + QUERIES, dy, tile * MQ);
  copyStage(0, 0);
  float dq[DH / 8][4] = {};
  for (int kt = 0; kt <= last; ++kt) {
    const int stage = kt & 1;
    if (kt < last)
      copyStage(stage ^ 1, kt + 1);
    else
      commitCopies();
    awaitCopiedStage();
    float s[NK / 8][4], dp[NK / 8][4];
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk) {
      unsigned rowsAlong = kk / 4 * MQ * 128 + group * 64 * 128 + kk % 4 * 32, along = kk / 4 * NK * 128 + kk % 4 * 32;
      wgmmaShared<NK>(s, wgmmaDescriptor(queriesAt + rowsAlong, 0, 1024),
                      wgmmaDescriptor(keysAt(stage) + along, 0, 1024), kk > 0);
      wgmmaShared<NK>(dp, wgmmaDescriptor(queriesAt + QUERIES + rowsAlong, 0, 1024),
                      wgmmaDescriptor(keysAt(stage) + KEYS + along, 0, 1024), kk > 0);
    }
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<NK / 8>(s);
    fenceAccumulators<NK / 8>(dp);
    if (kt * NK + NK - 1 > tile * MQ) // keys past some rows: their scores -inf, p 0
      maskDiagonal<NK>(s, kt, row0);
    unsigned da[NK / 16][4]; // ds as A fragments
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float prob = exp2Approx(fmaf(s[j][e], scaleLog2, -(e < 2 ? lse0 : lse1)));
        s[j][e] = prob * (dp[j][e] - (e < 2 ? delta0 : delta1)) * scale; // ds
      }
      da[j / 2][2 * (j % 2)] = packBf16(s[j][0], s[j][1]);
      da[j / 2][2 * (j % 2) + 1] = packBf16(s[j][2], s[j][3]);
    }
    wgmmaFence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; ++kk) // keys 16 kk ..: 16 rows of 128 bytes on
      wgmmaRegisters<DH>(dq, da[kk], wgmmaDescriptor(keysAt(stage) + kk * 16 * 128, NK * 128, 1024), 1);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(dq);
    __syncthreads(); // both warpgroups are done with this stage before it is loaded again
  }
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = e < 2 ? row0 : row1, d = n * 8 + c + (e & 1);
      if (row < T)
        dqkv[((int64)b * T + row) * A::W + h * DH + d] = dq[n][e];
    }
}

// ---- Warp-specialised: a producer lane's bulk copies, two consumer warpgroups ----
enum { kGradStages = 2 };

// The shared memory attentionKeyValueGradSpecialised takes: keys and values (128 rows each),
// two stages of queries and dout (64 rows each) with their lse and delta (64 floats each, in
// 1 KB: the next stage's tiles start at a multiple of 1024 bytes), five barriers, and 1 KB to
// align.
template <int DH> __host__ __device__ constexpr int attentionGradSpecialisedShared() {
  return 2 * kWgmmaRows * DH * 2 + kGradStages * (2 * kGradQueries * DH * 2 + 1024) + 5 * 8 + 1024;
}

// The warp-specialised gradient's shared memory from `keysAt` (a multiple of 1024): keys, values,
// the stages (queries | dout | lse | delta, each stage 1024-aligned), then the barriers: the
// keys' full, the stages' full x2 and empty x2. The stages' use u (query tile first + u) is stage
// u % 2, its phase u / 2.
template <int DH> struct GradShared {
  static constexpr int KEYS = kWgmmaRows * DH * 2, QUERIES = kGradQueries * DH * 2, HALF = kGradQueries * 128;
  static constexpr int STAGE = 2 * QUERIES + 1024;
  unsigned keysAt, barriersAt; // the barriers past the stages, unless a kernel places them
  __device__ explicit GradShared(unsigned keysAt)
      : keysAt(keysAt), barriersAt(keysAt + 2 * KEYS + kGradStages * STAGE) {}
  __device__ GradShared(unsigned keysAt, unsigned barriersAt) : keysAt(keysAt), barriersAt(barriersAt) {}
  __device__ unsigned valuesAt() const { return keysAt + KEYS; }
  __device__ unsigned stageAt(int u) const { return keysAt + 2 * KEYS + u % kGradStages * STAGE; }
  __device__ unsigned keysFull() const { return barriersAt; }
  __device__ unsigned full(int u) const { return keysFull() + 8 * (1 + u % kGradStages); }
  __device__ unsigned empty(int u) const { return keysFull() + 8 * (1 + kGradStages + u % kGradStages); }
};

// Query tile qt (64 rows) of head bh's q and of its dout into the stage at `at` (dout G::QUERIES
// bytes on), a copy per 64-value block (G::HALF bytes apart), onto barrier `bar`: from
// SwizzledTiles' copy (half qt % 2 of a 128-row tile; dout's heads after q's, k's and v's), or
// by the tensor maps.
template <int B, int T, int H, int DH>
__device__ __forceinline__ void copyStageRows(const unsigned short *tiles, unsigned at, int64 bh, int qt,
                                              unsigned bar) {
  using S = SwizzledTiles<T, DH>;
  using G = GradShared<DH>;
  constexpr int NK = kWgmmaRows, MQ = kGradQueries;
  const int64 part = (int64)B * H * S::HEAD;
  for (int tensor = 0; tensor < 2; ++tensor) // q, dout
    for (int block = 0; block < DH / 64; ++block) {
      const unsigned short *src = tiles + (tensor ? 3 * part : 0) + bh * S::HEAD + (int64)(qt / 2) * NK * DH +
                                  block * NK * 64 + (qt % 2) * MQ * 64;
      bulkCopy(at + tensor * G::QUERIES + block * G::HALF, src, G::HALF, bar);
    }
}
template <int B, int T, int H, int DH>
__device__ __forceinline__ void copyStageRows(const AttentionMaps *maps, unsigned at, int64 bh, int qt, unsigned bar) {
  using G = GradShared<DH>;
  for (int block = 0; block < DH / 64; ++block) {
    tensorCopy3d(at + block * G::HALF, &maps->heads, block * 64, qt * kGradQueries, (int)bh, bar);
    tensorCopy3d(at + G::QUERIES + block * G::HALF, &maps->dout, block * 64, qt * kGradQueries, (int)bh, bar);
  }
}

// The producer lane's copies of the block's keys and values (onto the keys' full barrier).
// Operands: SwizzledTiles' tiles (const unsigned short *) or tensor maps (const AttentionMaps *).
template <int B, int T, int H, int DH, typename Operands>
__device__ void produceGradKeys(Operands tiles, const GradShared<DH> &sh, int64 bh, int tile) {
  barrierExpectBytes(sh.keysFull(), 2 * GradShared<DH>::KEYS);
  copyHeadTile<T, DH>(tiles, sh.keysAt, (int64)B * H + bh, tile, sh.keysFull());
  copyHeadTile<T, DH>(tiles, sh.valuesAt(), 2L * B * H + bh, tile, sh.keysFull());
}

// The producer lane's copies for the block's step u (counted over all its work): query tile qt
// of 64 of q and of dout, with their lse and delta, into the stage once the consumers have freed
// it. Operands: produceGradKeys'.
template <int B, int T, int H, int DH, typename Operands>
__device__ void produceGradStage(Operands tiles, const float *lse, const float *delta, const GradShared<DH> &sh,
                                 int64 bh, int qt, int u) {
  using G = GradShared<DH>;
  constexpr int MQ = kGradQueries;
  const int rows = min(MQ, T - qt * MQ);
  if (u >= kGradStages)
    barrierWait(sh.empty(u), (u / kGradStages - 1) & 1);
  barrierExpectBytes(sh.full(u), 2 * G::QUERIES + 2 * rows * 4);
  const unsigned at = sh.stageAt(u);
  copyStageRows<B, T, H, DH>(tiles, at, bh, qt, sh.full(u));
  bulkCopy(at + 2 * G::QUERIES, lse + bh * T + qt * MQ, rows * 4, sh.full(u));
  bulkCopy(at + 2 * G::QUERIES + MQ * 4, delta + bh * T + qt * MQ, rows * 4, sh.full(u));
}

// The producer lane of a block with one item: its keys and values, then its query tiles from
// `first` to `last`.
template <int B, int T, int H, int DH>
__device__ void produceGradTiles(const unsigned short *tiles, const float *lse, const float *delta,
                                 const GradShared<DH> &sh, int64 bh, int tile, int first, int last) {
  produceGradKeys<B, T, H, DH>(tiles, sh, bh, tile);
  for (int qt = first; qt <= last; ++qt)
    produceGradStage<B, T, H, DH>(tiles, lse, delta, sh, bh, qt, qt - first);
}

// A consumer warpgroup's step u (query tile qt) of the warp-specialised kernels: waits for the
// stage, multiplies s^T and dp^T, and leaves p^T and ds^T as A fragments (pa, da). OVERLAP
// (FlashAttention-3's order): s^T and dp^T issued as two groups, p^T made while dp^T's product
// runs, then dv += p^T dout issued and ds^T made while it runs; dv's product is left in flight,
// and pa must stay as it is until it ends.
template <int T, int DH, bool OVERLAP = false>
__device__ __forceinline__ void gradStepProbabilities(unsigned (*pa)[4], unsigned (*da)[4], float (*dv)[4],
                                                      const GradShared<DH> &sh, const unsigned char *base, int u,
                                                      int qt, int tile, int key0, int consumer, float scale) {
  using G = GradShared<DH>;
  constexpr int NK = kWgmmaRows, MQ = kGradQueries;
  const unsigned at = sh.stageAt(u);
  const float *lses = (const float *)(base + (at - sh.keysAt) + 2 * G::QUERIES), *deltas = lses + MQ;
  barrierWait(sh.full(u), (u / kGradStages) & 1);
  float st[MQ / 8][4], dpt[MQ / 8][4]; // s^T and dp^T: this warpgroup's 64 keys x 64 queries
  float2 held[MQ / 8];                 // (OVERLAP: the lses, loaded under the products)
  wgmmaFence();
  if (OVERLAP) {
    issueGradScores<DH, 1>(st, dpt, sh.keysAt, sh.valuesAt(), at, at + G::QUERIES, G::HALF, consumer);
    wgmmaCommit();
    issueGradScores<DH, 2>(st, dpt, sh.keysAt, sh.valuesAt(), at, at + G::QUERIES, G::HALF, consumer);
    wgmmaCommit();
    lseHeld(held, lses);
    wgmmaWait<1>();
  } else {
    issueGradScores<DH>(st, dpt, sh.keysAt, sh.valuesAt(), at, at + G::QUERIES, G::HALF, consumer);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<MQ / 8>(dpt);
  }
  fenceAccumulators<MQ / 8>(st);
  const bool edge = qt * MQ < tile * NK + NK || qt * MQ + MQ > T; // diagonal or last
  if (OVERLAP && edge)
    gradProbabilitiesP<T, true>(pa, st, (const float2 *)held, qt, key0, scale);
  else if (OVERLAP)
    gradProbabilitiesP<T, false>(pa, st, (const float2 *)held, qt, key0, scale);
  else if (edge)
    gradProbabilitiesP<T, true>(pa, st, lses, qt, key0, scale);
  else
    gradProbabilitiesP<T, false>(pa, st, lses, qt, key0, scale);
  if (OVERLAP) {
    wgmmaFence();
    issueKeyValueGrads<DH, 1>(dv, nullptr, pa, nullptr, at, at + G::QUERIES, G::HALF);
    wgmmaCommit();
    wgmmaWait<1>();
    fenceAccumulators<MQ / 8>(dpt);
  }
  if (edge)
    gradProbabilitiesDs<T, true>(da, st, dpt, deltas, qt, key0, scale);
  else
    gradProbabilitiesDs<T, false>(da, st, dpt, deltas, qt, key0, scale);
}

// dk and dv for 128 keys as attentionKeyValueGradWgmma, the operands in SwizzledTiles' layout
// (tiles: q, k, v, then dout, each [B][H] heads of tiles), copied by a producer lane
// (produceGradTiles) onto full and empty transaction barriers: the consumer warpgroups (64 keys
// each) no longer meet at a block-wide barrier, so one's elementwise work runs beside the
// other's products. T a multiple of 4 (lse and delta in 16-byte pieces; past T a stage keeps
// what it held, and those queries' p and ds are 0).
template <int B, int T, int H, int DH, typename Out>
__device__ void attentionKeyValueGradSpecialised(const unsigned short *tiles, Out dqkv, float scale, const float *lse,
                                                 const float *delta) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  static_assert(T % 4 == 0, "lse and delta are copied in 16-byte pieces");
  using G = GradShared<DH>;
  constexpr int NK = kWgmmaRows, MQ = kGradQueries, KTILES = SwizzledTiles<T, DH>::TILES;
  constexpr int QUERIES = G::QUERIES, HALF = G::HALF;
  unsigned char *base = alignedShared();
  const G sh(sharedAddress(base));
  const int tile = blockIdx.x % KTILES; // the earliest keys have the most queries: first
  const int bh = blockIdx.x / KTILES, b = bh / H, h = bh % H, group = threadIdx.x / 128;
  const int first = tile * NK / MQ, last = (T - 1) / MQ; // query tiles
  if (threadIdx.x == 0) {
    for (int i = 0; i < 1 + kGradStages; ++i)
      barrierInit(sh.keysFull() + 8 * i, 1);
    for (int i = 0; i < kGradStages; ++i)
      barrierInit(sh.empty(i), 8); // a lane of each consumer warp
    fenceBarrierInit();
  }
  __syncthreads();
  if (group == 0) {
    releaseRegisters<24>();
    if (threadIdx.x == 0)
      produceGradTiles<B, T, H, DH>(tiles, lse, delta, sh, bh, tile, first, last);
    return;
  }
  claimRegisters<240>();
  const int consumer = group - 1, lane = threadIdx.x % 32;
  const int key0 = gradKey0(tile, consumer); // and key0 + 8
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  barrierWait(sh.keysFull(), 0);
  for (int qt = first; qt <= last; ++qt) {
    const int u = qt - first;
    const unsigned at = sh.stageAt(u);
    unsigned pa[MQ / 16][4], da[MQ / 16][4]; // p^T and ds^T as A fragments
    gradStepProbabilities<T, DH>(pa, da, dv, sh, base, u, qt, tile, key0, consumer, scale);
    wgmmaFence();
    issueKeyValueGrads<DH>(dv, dk, pa, da, at, at + QUERIES, HALF);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(dv);
    fenceAccumulators<DH / 8>(dk);
    if (lane == 0)
      barrierArrive(sh.empty(u));
  }
  storeKeyValueGrads<T, H, DH>(dk, dv, dqkv, b, h, key0);
}
