// Causal attention's forward on Hopper's warpgroup products (wgmma.cuh; sm_90a): the same
// function as attentionForwardBf16 (attention.cuh: the same operands, head-major BF16 from
// toHeadsBf16, the same online softmax in base 2, probabilities rounded to BF16 for p v), over
// tiles of 128 queries and 128 keys. A block is two warpgroups, 64 queries each; both load the
// tiles (cp.async, two stages: the next keys and values land while this tile is used) into
// shared memory in the products' swizzled layout, and each multiplies its queries by the keys
// (q k^T: q and k from shared memory), takes the softmax in registers and multiplies the
// probabilities, still in registers, by the values.
#pragma once

#include "attention.cuh"
#include "wgmma.cuh"

enum { kWgmmaRows = 128, kWgmmaThreads = 256 }; // a block's queries, and keys of a tile

// Rows [row0, row0 + R) of a head-major BF16 tensor (rows of DH values, T of them; rows at or
// past T zero) into `tile` in the products' layout: DH / 64 blocks of R swizzled rows of 64
// values (128 bytes) each. Asynchronous: the caller commits the copies as a group.
template <int T, int DH, int R>
__device__ void copySwizzledAsync(unsigned char *tile, const unsigned short *src, int row0) {
  constexpr int CHUNKS = R * DH / 8; // 16 bytes each, a row's in a row of threads
#pragma unroll
  for (int i = threadIdx.x; i < CHUNKS; i += kWgmmaThreads) {
    int r = i / (DH / 8), chunk = i % (DH / 8), row = row0 + r;
    bool valid = row < T;
    unsigned char *dst = tile + chunk / 8 * R * 128 + swizzledChunk(r, chunk % 8);
    copyAsync16((unsigned short *)dst, src + (int64)(valid ? row : 0) * DH + 8 * chunk, valid);
  }
}

// Until this thread's copies but the latest group have landed, then every thread's (a barrier
// after each thread's proxy fence): the tiles they filled are the products' to read.
__device__ __forceinline__ void awaitCopiedStage() {
  waitForAllButLatestCopies();
  fenceProxyAsync();
  __syncthreads();
}

// The kernel's dynamic shared memory from its first multiple of 1024 bytes (the swizzle's
// period; the launches ask for 1 KB more than they use).
__device__ __forceinline__ unsigned char *alignedShared() {
  extern __shared__ unsigned char attentionShared[];
  // (an offset from the array, not a pointer made from an integer: so the compiler keeps
  // knowing it is shared memory, and the accesses through it are ld.shared and st.shared,
  // not generic ones, which wait on the long scoreboard)
  return attentionShared + (1024 - sharedAddress(attentionShared) % 1024) % 1024;
}

// The shared memory attentionForwardWgmma takes: 128 queries, STAGES stages of keys and
// values, and 1 KB to align the tiles to the swizzle's 1024 bytes.
template <int DH, int STAGES> __host__ __device__ constexpr int attentionWgmmaShared() {
  return (1 + 2 * STAGES) * kWgmmaRows * DH * 2 + 1024;
}

// What a warpgroup's lane keeps of its two rows (row0 and row0 + 8) between key tiles: the
// running maxima of the scaled scores (base 2) and the sums of their exponentials.
struct OnlineSoftmax {
  float m0, m1, l0, l1;
};
// Before the first key tile: maxima -inf, sums 0. (A function, not member initialisers: NVRTC
// has no -inf constant that the host compiler also takes.)
__device__ __forceinline__ OnlineSoftmax freshSoftmax() {
  const float lowest = __int_as_float(0xff800000);
  return {lowest, lowest, 0.0f, 0.0f};
}

// Issues s = q k^T for this warpgroup's 64 queries and the 128 keys of a tile (asynchronous:
// the caller commits and waits). `queries` and `keys` are the shared addresses of the tiles.
template <int DH>
__device__ __forceinline__ void issueScores(float (*s)[4], unsigned queries, unsigned keys, int group) {
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk) {
    unsigned along = kk / 4 * 128 * kWgmmaRows + kk % 4 * 32; // 16 values on: block kk / 4, 32 bytes a step
    wgmmaShared<kWgmmaRows>(s, wgmmaDescriptor(queries + along + group * 64 * 128, 0, 1024),
                            wgmmaDescriptor(keys + along, 0, 1024), kk > 0);
  }
}

// Issues o += p v over the 128 keys of a tile (p this lane's A fragments, values the tile's
// shared address).
template <int DH> __device__ __forceinline__ void issueValues(float (*o)[4], const unsigned (*p)[4], unsigned values) {
#pragma unroll
  for (int kk = 0; kk < kWgmmaRows / 16; ++kk) // keys 16 kk ..: 16 rows of 128 bytes on
    wgmmaRegisters<DH>(o, p[kk], wgmmaDescriptor(values + kk * 16 * 128, kWgmmaRows * 128, 1024), 1);
}

// The causal mask on a diagonal tile kt of N keys: -inf at the keys past each of this lane's
// rows (row0 and row0 + 8).
template <int N> __device__ __forceinline__ void maskDiagonal(float (*s)[4], int kt, int row0) {
  const int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (kt * N + j * 8 + c + (e & 1) > row0 + (e < 2 ? 0 : 8))
        s[j][e] = __int_as_float(0xff800000);
}

// The online softmax over key tile kt's scores (in place: s becomes the probabilities, fp32),
// as attentionForwardBf16's: the causal mask on the diagonal, the new maxima, the sums; alpha
// the factors the outputs so far are to be scaled by. The mask is a branch of its own (the
// same for the whole block): below the diagonal its compares and selects would cost about as
// much as the maxima.
__device__ __forceinline__ void softmaxTile(float (*s)[4], OnlineSoftmax &r, float &alpha0, float &alpha1, int kt,
                                            int tile, int row0, float scaleLog2) {
  constexpr int N = kWgmmaRows;
  if (kt * N + N - 1 > tile * kWgmmaRows) // keys past some rows
    maskDiagonal<N>(s, kt, row0);
  // The rows' maxima as trees (depth 5, not a chain of 32: the warp waits on them alone).
  float m[N / 8][2];
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    m[j][0] = fmaxf(s[j][0], s[j][1]);
    m[j][1] = fmaxf(s[j][2], s[j][3]);
  }
#pragma unroll
  for (int level = 1; level < N / 8; level *= 2) // a count the unrolling sees: m stays in registers
#pragma unroll
    for (int j = 0; j < N / 8; j += 2 * level) {
      m[j][0] = fmaxf(m[j][0], m[j + level][0]);
      m[j][1] = fmaxf(m[j][1], m[j + level][1]);
    }
  const float raw0 = m[0][0], raw1 = m[0][1];
  // Key 0 is in every row's first tile: the maxima are finite from there on.
  const float max0 = fmaxf(r.m0, quadMax(raw0) * scaleLog2), max1 = fmaxf(r.m1, quadMax(raw1) * scaleLog2);
  alpha0 = exp2Approx(r.m0 - max0);
  alpha1 = exp2Approx(r.m1 - max1);
  r.m0 = max0;
  r.m1 = max1;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p = exp2Approx(fmaf(s[j][e], scaleLog2, -(e < 2 ? max0 : max1)));
      s[j][e] = p;
      if (e < 2)
        sum0 += p;
      else
        sum1 += p;
    }
  r.l0 = r.l0 * alpha0 + sum0;
  r.l1 = r.l1 * alpha1 + sum1;
}

// The probabilities (C fragments of s) rounded to BF16 as p v's A fragments: 16 keys each.
__device__ __forceinline__ void packProbabilities(unsigned (*p)[4], const float (*s)[4]) {
#pragma unroll
  for (int j = 0; j < kWgmmaRows / 8; ++j) {
    p[j / 2][2 * (j % 2)] = packBf16(s[j][0], s[j][1]);
    p[j / 2][2 * (j % 2) + 1] = packBf16(s[j][2], s[j][3]);
  }
}

template <int DH> __device__ __forceinline__ void scaleOutputs(float (*o)[4], float alpha0, float alpha1) {
#pragma unroll
  for (int n = 0; n < DH / 8; ++n) {
    o[n][0] *= alpha0;
    o[n][1] *= alpha0;
    o[n][2] *= alpha1;
    o[n][3] *= alpha1;
  }
}

// Two adjacent outputs (i even) in one store: 8 bytes of fp32 or 4 of BF16.
__device__ __forceinline__ void store2(float *out, int64 i, float lo, float hi) {
  *(float2 *)(out + i) = make_float2(lo, hi);
}
__device__ __forceinline__ void store2(Bf16Out out, int64 i, float lo, float hi) {
  *(unsigned *)(out.p + i) = packBf16(lo, hi); // (bf16Pair's rounding in one instruction)
}

// out = o / l at this lane's rows and columns, and the rows' log-sum-exps (natural log).
template <int T, int H, int DH, typename Out>
__device__ void storeAttention(const float (*o)[4], OnlineSoftmax r, Out out, float *lse, int b, int h, int row0) {
  const int c = 2 * (threadIdx.x % 4), row1 = row0 + 8;
  r.l0 = quadSum(r.l0);
  r.l1 = quadSum(r.l1);
  const float inverse0 = 1.0f / r.l0, inverse1 = 1.0f / r.l1; // (a division a row, not one an output)
  const int64 at0 = ((int64)b * T + row0) * H * DH + h * DH + c, at1 = at0 + 8 * H * DH;
#pragma unroll
  for (int n = 0; n < DH / 8; ++n) {
    if (row0 < T)
      store2(out, at0 + n * 8, o[n][0] * inverse0, o[n][1] * inverse0);
    if (row1 < T)
      store2(out, at1 + n * 8, o[n][2] * inverse1, o[n][3] * inverse1);
  }
  if (threadIdx.x % 4 == 0) { // back from base 2 to the natural log
    const int64 at = ((int64)b * H + h) * T;
    if (row0 < T)
      lse[at + row0] = (r.m0 + log2f(r.l0)) * 0.6931471805599453f;
    if (row1 < T)
      lse[at + row1] = (r.m1 + log2f(r.l1)) * 0.6931471805599453f;
  }
}

// The forward for 128 queries (a block of two warpgroups; dynamic shared memory of
// attentionWgmmaShared<DH, 2>() bytes): out = softmax(mask(scale q k^T)) v and each query's
// log-sum-exp, as attentionForwardBf16. Each tile's products wait for each other.
template <int B, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionForwardWgmma(const unsigned short *heads, Out out, float *lse, float scale) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int M = kWgmmaRows, N = kWgmmaRows, TILES = (T + M - 1) / M;
  constexpr int TILE = N * DH * 2; // bytes of a tile of keys (or values, or queries)
  unsigned char *queries = alignedShared();
  const unsigned queriesAt = sharedAddress(queries);
  const int tile = TILES - 1 - blockIdx.x % TILES; // the longest rows of tiles first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H, group = threadIdx.x / 128;
  const unsigned short *q = heads + (int64)bh * T * DH, *k = heads + A::keysOf(b, h), *v = k + A::KPART;
  const int row0 = tile * M + group * 64 + threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
  const int last = (min(T, (tile + 1) * M) - 1) / N; // the last key tile
  const float scaleLog2 = scale * 1.4426950408889634f;
  copySwizzledAsync<T, DH, M>(queries, q, tile * M);
  copySwizzledAsync<T, DH, N>(queries + TILE, k, 0);
  copySwizzledAsync<T, DH, N>(queries + 2 * TILE, v, 0);
  commitCopies();
  float o[DH / 8][4] = {};
  OnlineSoftmax r = freshSoftmax();
  for (int kt = 0; kt <= last; ++kt) {
    const int stage = 1 + 2 * (kt & 1); // tiles: keys at stage, values at stage + 1
    if (kt < last) {
      copySwizzledAsync<T, DH, N>(queries + (4 - stage) * TILE, k, (kt + 1) * N);
      copySwizzledAsync<T, DH, N>(queries + (5 - stage) * TILE, v, (kt + 1) * N);
    }
    commitCopies(); // (an empty group after the last tile: the wait below counts the same way)
    awaitCopiedStage();
    float s[N / 8][4];
    wgmmaFence();
    issueScores<DH>(s, queriesAt, queriesAt + stage * TILE, group);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<N / 8>(s);
    float alpha0, alpha1;
    softmaxTile(s, r, alpha0, alpha1, kt, tile, row0, scaleLog2);
    unsigned p[N / 16][4];
    packProbabilities(p, s);
    scaleOutputs<DH>(o, alpha0, alpha1);
    wgmmaFence();
    issueValues<DH>(o, p, queriesAt + (stage + 1) * TILE);
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(o);
    __syncthreads(); // both warpgroups are done with this stage before it is loaded again
  }
  storeAttention<T, H, DH>(o, r, out, lse, b, h, row0);
}

// The same forward with the products of neighbouring tiles overlapped (FlashAttention-3's
// ordering within a warpgroup): at tile j the scores of j and p v of tile j - 1 are issued
// together, and the softmax of j runs while p v of j - 1 is in flight. Three stages of keys
// and values (j - 1's values, j's keys, j + 1's landing): attentionWgmmaShared<DH, 3>() bytes.
template <int B, int T, int H, int DH, int KV = H, typename Out>
__device__ void attentionForwardWgmmaOverlapped(const unsigned short *heads, Out out, float *lse, float scale) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  using A = AttentionHeads<B, T, H, KV, DH>;
  constexpr int M = kWgmmaRows, N = kWgmmaRows, TILES = (T + M - 1) / M;
  constexpr int TILE = N * DH * 2;
  unsigned char *queries = alignedShared();
  const unsigned queriesAt = sharedAddress(queries);
  const int tile = TILES - 1 - blockIdx.x % TILES;
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H, group = threadIdx.x / 128;
  const unsigned short *q = heads + (int64)bh * T * DH, *k = heads + A::keysOf(b, h), *v = k + A::KPART;
  const int row0 = tile * M + group * 64 + threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4;
  const int last = (min(T, (tile + 1) * M) - 1) / N;
  const float scaleLog2 = scale * 1.4426950408889634f;
  auto keysOf = [&](int kt) { return 1 + 2 * (kt % 3); }; // the tile of kt's keys; its values follow
  auto load = [&](int kt) {
    copySwizzledAsync<T, DH, N>(queries + keysOf(kt) * TILE, k, kt * N);
    copySwizzledAsync<T, DH, N>(queries + (keysOf(kt) + 1) * TILE, v, kt * N);
  };
  copySwizzledAsync<T, DH, M>(queries, q, tile * M);
  load(0);
  commitCopies();
  if (last > 0)
    load(1);
  commitCopies();
  awaitCopiedStage();
  float s[N / 8][4], o[DH / 8][4] = {};
  unsigned p[N / 16][4];
  OnlineSoftmax r = freshSoftmax();
  float alpha0, alpha1;
  wgmmaFence();
  issueScores<DH>(s, queriesAt, queriesAt + keysOf(0) * TILE, group);
  wgmmaCommit();
  wgmmaWait<0>();
  fenceAccumulators<N / 8>(s);
  softmaxTile(s, r, alpha0, alpha1, 0, tile, row0, scaleLog2);
  packProbabilities(p, s);
  for (int kt = 1; kt <= last; ++kt) {
    // Tile kt's copies (issued one tile ago) have landed for every thread, and every warpgroup
    // is past tile kt - 2's values: kt + 1 may load into their stage.
    waitForAllCopies();
    fenceProxyAsync();
    __syncthreads();
    if (kt < last)
      load(kt + 1);
    commitCopies();
    wgmmaFence();
    issueScores<DH>(s, queriesAt, queriesAt + keysOf(kt) * TILE, group);
    wgmmaCommit();
    issueValues<DH>(o, p, queriesAt + (keysOf(kt - 1) + 1) * TILE);
    wgmmaCommit();
    wgmmaWait<1>(); // the scores; p v of kt - 1 may still run
    fenceAccumulators<N / 8>(s);
    softmaxTile(s, r, alpha0, alpha1, kt, tile, row0, scaleLog2);
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(o);
    scaleOutputs<DH>(o, alpha0, alpha1);
    packProbabilities(p, s);
  }
  wgmmaFence();
  issueValues<DH>(o, p, queriesAt + (keysOf(last) + 1) * TILE);
  wgmmaCommit();
  wgmmaWait<0>();
  fenceAccumulators<DH / 8>(o);
  storeAttention<T, H, DH>(o, r, out, lse, b, h, row0);
}

// ---- Warp-specialised: a producer warp's bulk copies, two consumer warpgroups in turn ----
// The operands in the products' layout already in global memory ("tiles"): q, then k, then v,
// each [B][heads][TILES][DH / 64][128 rows][64 values], the 16-byte chunks of each row swizzled
// as in shared memory (swizzledChunk) and rows past T zero; a tile then lands in shared memory by
// one bulk copy. toSwizzledTiles writes them from the head-major copy.
template <int T, int DH> struct SwizzledTiles {
  static constexpr int TILES = (T + kWgmmaRows - 1) / kWgmmaRows, TILE = kWgmmaRows * DH * 2; // bytes
  static constexpr int64 HEAD = (int64)TILES * kWgmmaRows * DH;                               // values
};

// The head-major copy src (heads [T][DH] each) into `heads` heads of tiles at dst; a 16-byte
// chunk a thread.
template <int T, int DH> __device__ void toSwizzledTiles(const unsigned short *src, unsigned short *dst, int64 heads) {
  using S = SwizzledTiles<T, DH>;
  FOR_EACH_ELEMENT(i, heads * S::TILES * kWgmmaRows * (DH / 8)) {
    int chunk = (int)(i % (DH / 8));
    int64 row = i / (DH / 8), head = row / (S::TILES * kWgmmaRows);
    int r = (int)(row % (S::TILES * kWgmmaRows)), rr = r % kWgmmaRows;
    uint4 value = r < T ? *(const uint4 *)(src + (head * T + r) * DH + 8 * chunk) : make_uint4(0, 0, 0, 0);
    int64 at =
        (head * S::TILES + r / kWgmmaRows) * S::TILE + chunk / 8 * kWgmmaRows * 128 + swizzledChunk(rr, chunk % 8);
    *(uint4 *)((unsigned char *)dst + at) = value;
  }
}

enum { kSpecialisedThreads = 384, kPingpongBarrier = 1 }; // a producer and two consumer warpgroups

// The shared memory attentionForwardSpecialised takes: queries, two stages of keys and of
// values, ten barriers, and 1 KB to align the tiles.
template <int DH> __host__ __device__ constexpr int attentionSpecialisedShared() {
  return 5 * kWgmmaRows * DH * 2 + 10 * 8 + 1024;
}

// Heads a group of the forward's work order: as many as keep their keys and values (T DH 4
// bytes each) within about 24 MB of L2, so that the blocks at work at once, all on one group's
// heads, read them from L2 rather than memory. B H: no grouping.
template <int B, int T, int H, int DH> __host__ __device__ constexpr int attentionHeadsInL2() {
  constexpr int64 fit = (24ll << 20) / ((int64)T * DH * 4);
  return fit < 1 ? 1 : fit > B * H ? B * H : (int)fit;
}

// A block's work item w (w < B H TILES) as its tile of queries and (sequence, head): the heads in
// groups of GROUP, a group's items together and the longest tiles of each group first.
template <int B, int T, int H, int GROUP> struct SpecialisedItem {
  static constexpr int TILES = (T + kWgmmaRows - 1) / kWgmmaRows, TOTAL = B * H * TILES;
  int tile, bh, last; // last: the last key tile
  __device__ explicit SpecialisedItem(int w) {
    const int group = w / (GROUP * TILES), at = w % (GROUP * TILES), size = min(GROUP, B * H - group * GROUP);
    tile = TILES - 1 - at / size;
    bh = group * GROUP + at % size;
    last = (min(T, (tile + 1) * kWgmmaRows) - 1) / kWgmmaRows;
  }
};

// The attention's operands where they lie, as tensor maps (bench_util.cuh's encodeHeads): heads,
// q k v head-major ([B H + 2 B KV][T][DH]), and dout ([B H][T][DH]; the gradient's); boxes of 64
// rows x 64 values (128 bytes), swizzled by 128 bytes as the products read them. With them the
// producer copies need no tiles in SwizzledTiles' layout (a pass over the operands before the
// kernel), and rows past T come as zeros.
struct AttentionMaps {
  TensorMap heads, dout;
};

// Tile `tile` (128 rows) of head `head` of q, k and v's heads one after the other, into shared
// memory at `dst` in SwizzledTiles' tile layout, onto barrier `bar`: from SwizzledTiles' copy
// (one bulk copy), or by the tensor maps (a box per 64 rows and 64 values).
template <int T, int DH>
__device__ __forceinline__ void copyHeadTile(const unsigned short *tiles, unsigned dst, int64 head, int tile,
                                             unsigned bar) {
  using S = SwizzledTiles<T, DH>;
  bulkCopy(dst, tiles + head * S::HEAD + (int64)tile * kWgmmaRows * DH, S::TILE, bar);
}
template <int T, int DH>
__device__ __forceinline__ void copyHeadTile(const AttentionMaps *maps, unsigned dst, int64 head, int tile,
                                             unsigned bar) {
  for (int block = 0; block < DH / 64; ++block)
    for (int half = 0; half < 2; ++half)
      tensorCopy3d(dst + block * kWgmmaRows * 128 + half * 64 * 128, &maps->heads, block * 64,
                   tile * kWgmmaRows + half * 64, (int)head, bar);
}

// The warp-specialised kernel's shared memory: queries at `at`, then keys and values of two
// stages, then the barriers: queries' full, keys' full x2, values' full x2, keys' empty x2,
// values' empty x2, queries' empty. A stage's use u (keys and values counted together over the
// block's items) is stage u % 2, its phase u / 2.
template <int DH> struct SpecialisedShared {
  static constexpr int TILE = kWgmmaRows * DH * 2;
  unsigned at, bars;
  __device__ explicit SpecialisedShared(unsigned at) : at(at), bars(at + 5 * TILE) {}
  __device__ unsigned queriesFull() const { return bars; }
  __device__ unsigned keysFull(int u) const { return bars + 8 * (1 + (u & 1)); }
  __device__ unsigned valuesFull(int u) const { return bars + 8 * (3 + (u & 1)); }
  __device__ unsigned keysEmpty(int u) const { return bars + 8 * (5 + (u & 1)); }
  __device__ unsigned valuesEmpty(int u) const { return bars + 8 * (7 + (u & 1)); }
  __device__ unsigned queriesEmpty() const { return bars + 8 * 9; }
  __device__ unsigned keysAt(int u) const { return at + (1 + (u & 1)) * TILE; }
  __device__ unsigned valuesAt(int u) const { return at + (3 + (u & 1)) * TILE; }
};

// The producer (one lane): each of the block's items' query tile once the last item's scores
// are done with theirs, and its key and value tiles as their stages free up.
// Operands: SwizzledTiles' tiles (const unsigned short *) or tensor maps (const AttentionMaps *).
template <int B, int T, int H, int DH, int KV, int GROUP, typename Operands>
__device__ void produceTiles(Operands tiles, const SpecialisedShared<DH> &sh) {
  using S = SwizzledTiles<T, DH>;
  using Item = SpecialisedItem<B, T, H, GROUP>;
  int use = 0, item = 0;
  for (int w = blockIdx.x; w < Item::TOTAL; w += gridDim.x, ++item) {
    const Item it(w);
    const int b = it.bh / H, h = it.bh % H;
    const int64 k = (int64)B * H + (int64)b * KV + h / (H / KV), v = k + (int64)B * KV; // their heads
    if (item > 0)
      barrierWait(sh.queriesEmpty(), (item - 1) & 1);
    barrierExpectBytes(sh.queriesFull(), S::TILE);
    copyHeadTile<T, DH>(tiles, sh.at, it.bh, it.tile, sh.queriesFull());
    for (int j = 0; j <= it.last; ++j, ++use) {
      if (use >= 2)
        barrierWait(sh.keysEmpty(use), ((use >> 1) - 1) & 1);
      barrierExpectBytes(sh.keysFull(use), S::TILE);
      copyHeadTile<T, DH>(tiles, sh.keysAt(use), k, j, sh.keysFull(use));
      if (use >= 2)
        barrierWait(sh.valuesEmpty(use), ((use >> 1) - 1) & 1);
      barrierExpectBytes(sh.valuesFull(use), S::TILE);
      copyHeadTile<T, DH>(tiles, sh.valuesAt(use), v, j, sh.valuesFull(use));
    }
  }
}

// The forward for tiles of 128 queries as attentionForwardWgmmaOverlapped, with
// FlashAttention-3's division of work: warp 0 (one lane) copies the tiles by bulk copies as
// their stages free up (transaction barriers full and empty for queries, keys and values apart),
// and the two consumer warpgroups take turns at the tensor cores (named barriers): one issues its
// products while the other's softmax runs. Registers move from the producer's warpgroup to the
// consumers'. Block b takes work items b, b + gridDim.x, ...: with a block an item, one tile
// each; with fewer blocks (persistent, one an SM), the producer loads the next item's queries,
// keys and values while the consumers finish this one's. The items in SpecialisedItem's order,
// GROUP heads at a time.
// Operands: produceTiles'.
template <int B, int T, int H, int DH, int KV = H, int GROUP = attentionHeadsInL2<B, T, H, DH>(), typename Operands,
          typename Out>
__device__ void attentionForwardSpecialised(Operands tiles, Out out, float *lse, float scale) {
  static_assert(DH == 64 || DH == 128, "the products' N is the head dimension: 64 or 128");
  using Item = SpecialisedItem<B, T, H, GROUP>;
  constexpr int M = kWgmmaRows, N = kWgmmaRows;
  const SpecialisedShared<DH> sh(sharedAddress(alignedShared()));
  if (threadIdx.x == 0) {
    for (int i = 0; i < 5; ++i)
      barrierInit(sh.bars + 8 * i, 1);
    for (int i = 5; i < 10; ++i)
      barrierInit(sh.bars + 8 * i, 8); // a lane of each consumer warp
    fenceBarrierInit();             // the barriers as the bulk copies (the asynchronous proxy) see them
  }
  __syncthreads();
  const int group = threadIdx.x / 128;
  if (group == 0) {
    releaseRegisters<24>();
    if (threadIdx.x == 0)
      produceTiles<B, T, H, DH, KV, GROUP>(tiles, sh);
    return;
  }
  claimRegisters<240>();
  const int consumer = group - 1, lane = threadIdx.x % 32;
  const float scaleLog2 = scale * 1.4426950408889634f;
  auto release = [&](unsigned bar) {
    if (lane == 0)
      barrierArrive(bar);
  };
  // Turns at the tensor cores: consumer c waits on barrier kPingpongBarrier + c, and lets the
  // other go once its products are issued. Consumer 0 goes first; consumer 1 passes once more at
  // the start and so not after its last products: the turns balance.
  auto awaitTurn = [&]() { namedBarrierSync(kPingpongBarrier + consumer, 256); };
  auto passTurn = [&]() { namedBarrierArrive(kPingpongBarrier + 1 - consumer, 256); };
  if (consumer == 1)
    passTurn();
  int use = 0, item = 0;
  for (int w = blockIdx.x; w < Item::TOTAL; w += gridDim.x, ++item) {
    const Item it(w);
    const int row0 = it.tile * M + consumer * 64 + threadIdx.x % 128 / 32 * 16 + lane / 4;
    float s[N / 8][4], o[DH / 8][4] = {};
    unsigned p[N / 16][4];
    OnlineSoftmax r = freshSoftmax();
    float alpha0, alpha1;
    barrierWait(sh.queriesFull(), item & 1);
    barrierWait(sh.keysFull(use), (use >> 1) & 1);
    awaitTurn();
    wgmmaFence();
    issueScores<DH>(s, sh.at, sh.keysAt(use), consumer);
    wgmmaCommit();
    passTurn();
    wgmmaWait<0>();
    fenceAccumulators<N / 8>(s);
    release(sh.keysEmpty(use));
    if (it.last == 0)
      release(sh.queriesEmpty());
    softmaxTile(s, r, alpha0, alpha1, 0, it.tile, row0, scaleLog2);
    packProbabilities(p, s);
    for (int j = 1; j <= it.last; ++j) {
      const int now = use + j, before = now - 1;
      barrierWait(sh.keysFull(now), (now >> 1) & 1);
      barrierWait(sh.valuesFull(before), (before >> 1) & 1);
      awaitTurn();
      wgmmaFence();
      issueScores<DH>(s, sh.at, sh.keysAt(now), consumer);
      wgmmaCommit();
      issueValues<DH>(o, p, sh.valuesAt(before));
      wgmmaCommit();
      passTurn();
      wgmmaWait<1>();
      fenceAccumulators<N / 8>(s);
      release(sh.keysEmpty(now));
      if (j == it.last)
        release(sh.queriesEmpty());
      softmaxTile(s, r, alpha0, alpha1, j, it.tile, row0, scaleLog2);
      wgmmaWait<0>();
      fenceAccumulators<DH / 8>(o);
      release(sh.valuesEmpty(before));
      scaleOutputs<DH>(o, alpha0, alpha1);
      packProbabilities(p, s);
    }
    const int final = use + it.last;
    barrierWait(sh.valuesFull(final), (final >> 1) & 1);
    awaitTurn();
    wgmmaFence();
    issueValues<DH>(o, p, sh.valuesAt(final));
    wgmmaCommit();
    if (consumer == 0 || w + (int)gridDim.x < Item::TOTAL)
      passTurn();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(o);
    release(sh.valuesEmpty(final));
    storeAttention<T, H, DH>(o, r, out, lse, it.bh / H, it.bh % H, row0);
    use = final + 1;
  }
}

// attentionForwardSpecialised with its operands copied by tensor maps from where they lie
// (AttentionMaps): a kernel here rather than in the bench, for WgmmaNvrtcTest compiles it too.
template <int B, int T, int H, int DH, int KV, int GROUP, typename Out>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    mappedForward(const __grid_constant__ AttentionMaps maps, Out out, float *lse, float scale) {
  attentionForwardSpecialised<B, T, H, DH, KV, GROUP>(&maps, out, lse, scale);
}
