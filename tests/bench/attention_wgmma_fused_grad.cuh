// The causal attention's whole gradient in one kernel on Hopper's warpgroup products: the
// warp-specialised dk dv kernel (attention_wgmma_grad.cuh) that also makes dq, as
// FlashAttention-3 does, so that s and dp are multiplied once (5 products, not the split's 7).
// Each step (128 keys x 64 queries) writes ds^T to shared memory; dq's partial = ds k goes to
// staging tiles that a writer warp adds to an fp32 buffer in global memory by bulk reductions.
// Head dimension 128: the two consumer warpgroups make a half of the head dimension each over
// all 128 keys (one staging tile); 64: each makes the whole width over its own 64 keys (a tile
// each, added one after the other). The blocks add to a query tile in a fixed order, the latest
// keys first (or, reversed, the earliest first), each waiting on a counter a tile: the same bits
// every run. Blocks start in that order, so a block only ever waits on blocks already started.
#pragma once

#include "attention_wgmma_grad.cuh"

// The fused kernel's shared memory past GradShared's (keys, values, two stages, five barriers):
// five more barriers (dq staged x2, staging free x2, keys free) in the same 1 KB; ds^T (128 key
// rows of 64 queries, BF16, swizzled as a value tile); two stages of dq's staging tiles (TILES of
// them: 64 rows of DH fp32). So that a warp's rows fall in different banks, each row is 16 bytes longer,
// or (PACKED) the 16-byte chunks of row r are swizzled as r % 8 says (packedChunk), the layout
// the dq buffer then has too, so that a tile is added by one bulk reduction, not one a row.
template <int DH, bool PACKED> struct FusedGradShared : GradShared<DH> {
  using G = GradShared<DH>;
  static constexpr int DS = kWgmmaRows * kGradQueries * 2, ROW = DH * 4 + (PACKED ? 0 : 16);
  static constexpr int TILE = kGradQueries * ROW;
  static constexpr int TILES = DH == 128 ? 1 : 2, STAGING = TILES * TILE;
  __device__ explicit FusedGradShared(unsigned keysAt) : G(keysAt) {}
  __device__ unsigned dqFull(int u) const { return G::keysFull() + 8 * (5 + u % 2); }
  __device__ unsigned dqEmpty(int u) const { return G::keysFull() + 8 * (7 + u % 2); }
  __device__ unsigned keysEmpty() const { return G::keysFull() + 8 * 9; } // the next item's keys may land
  __device__ unsigned dsAt() const { return G::keysFull() + 1024; }
  // Stage u's staging tile of consumer warpgroup `consumer` (the one tile at DH 128).
  __device__ unsigned stagingAt(int u, int consumer) const {
    return dsAt() + DS + u % 2 * STAGING + (TILES - 1) * consumer * TILE;
  }
};
template <int DH, bool PACKED = true> __host__ __device__ constexpr int attentionFusedGradShared() {
  return attentionGradSpecialisedShared<DH>() - 5 * 8 + 1024 + FusedGradShared<DH, PACKED>::DS +
         2 * FusedGradShared<DH, PACKED>::STAGING;
}

// Where the 16-byte chunk `chunk` of dq's row `row` lies in a packed staging tile and buffer:
// the chunk's place among its row's groups of eight (128 bytes) crossed with the row's place
// among eight rows.
__host__ __device__ __forceinline__ int packedChunk(int row, int chunk) { return chunk ^ (row % 8); }

// The fp32 dq buffer ([B H][T][DH], each row's chunks packedChunk's where packed; zero before
// the kernel unless fusedGradStoresFirst) and its counters ([B H][query tiles of 64], zero
// before): how many blocks have added to each query tile.
struct FusedGradBuffers {
  float *dq;
  unsigned *added;
};

// Whether the first block in the order for a query tile stores its dq tile rather than adding
// it, so that the buffer needs no zeroing: in order (a first is known) and packed (a tile is
// one bulk copy).
template <bool ORDERED, bool PACKED> __host__ __device__ constexpr bool fusedGradStoresFirst() {
  return ORDERED && PACKED;
}

// A fused block's work item w (w < B H KTILES): (sequence, head) bh's key tile `tile`, the key
// tiles of a head in the order they add to a query tile (the latest first; REVERSED, the
// earliest), and the query tiles it walks, step i at query tile qt(i): from its keys' own on
// (REVERSED: from the last back).
template <int T, int DH, bool REVERSED> struct FusedGradItem {
  static constexpr int KTILES = SwizzledTiles<T, DH>::TILES, LAST = (T - 1) / kGradQueries;
  int tile, bh, first;
  __device__ explicit FusedGradItem(int w)
      : tile(REVERSED ? w % KTILES : KTILES - 1 - w % KTILES), bh(w / KTILES), first(tile * kWgmmaRows / kGradQueries) {
  }
  __device__ int steps() const { return LAST - first + 1; }
  __device__ int qt(int i) const { return REVERSED ? LAST - i : first + i; }
};

// f(it, use, item) for each of the block's work items (b, b + gridDim.x, ...): `use` its first
// step counted over the block's work (the stages' and staging tiles' turns), `item` its place
// among the block's items (the keys' turns). The producer, the writer and the consumers walk
// the same items.
template <int B, int H, typename Item, typename F> __device__ __forceinline__ void forEachFusedItem(F f) {
  int use = 0, item = 0;
  for (int w = blockIdx.x; w < B * H * Item::KTILES; w += gridDim.x, ++item) {
    const Item it(w);
    f(it, use, item);
    use += it.steps();
  }
}

// This lane's ds^T (da: A fragments, its warpgroup's 64 keys x 64 queries) into the shared
// ds^T tile at generic address `ds`, key rows from `row0` (the warpgroup's first).
__device__ __forceinline__ void storeDsTransposed(unsigned char *ds, const unsigned (*da)[4], int row0) {
  const int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4), row = row0 + threadIdx.x % 128 / 32 * 16 + g;
#pragma unroll
  for (int kk = 0; kk < kGradQueries / 16; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) // queries 16 kk + 8 half + c ..: chunk 2 kk + half
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *(unsigned *)(ds + swizzledChunk(row + 8 * r, 2 * kk + half) + 2 * c) = da[kk][2 * half + r];
}

// The writer (one lane of the producer's second warp): each step's staged dq into the buffer,
// after the blocks of later key tiles (REVERSED: earlier) have added theirs to that query tile;
// two tiles (DH 64) one after the other, so that their sums come in one order. The first block
// in the order stores its tile rather than adding it, so the buffer needs no zeroing. The
// item's steps are the block's from `use` on. ORDERED false: no waiting, the sums in whatever
// order the blocks come, onto a zeroed buffer (not deterministic; the bench times what order
// costs).
template <int B, int T, int H, int DH, bool ORDERED, bool REVERSED, bool PACKED>
__device__ void addQueryGrads(const FusedGradShared<DH, PACKED> &sh, FusedGradBuffers buffers,
                              FusedGradItem<T, DH, REVERSED> it, int use) {
  constexpr int MQ = kGradQueries, NK = kWgmmaRows, KTILES = FusedGradItem<T, DH, REVERSED>::KTILES;
  constexpr int QTILES = (T + MQ - 1) / MQ, STEP = REVERSED ? -1 : 1;
  using F = FusedGradShared<DH, PACKED>;
  const int start = it.qt(0), steps = it.steps();
  // (pointers carried along: the lane has 24 registers)
  unsigned *added = buffers.added + (int64)it.bh * QTILES + start;
  float *dq = buffers.dq + ((int64)it.bh * T + start * MQ) * DH;
  for (int i = 0; i < steps; ++i, added += STEP, dq += STEP * MQ * DH) {
    const int u = use + i, qt = start + STEP * i, rows = min(MQ, T - qt * MQ);
    const int latest = min(KTILES - 1, (qt * MQ + rows - 1) / NK); // the latest key tile adding to qt
    barrierWait(sh.dqFull(u), (u / 2) & 1);
    const int before = REVERSED ? it.tile : latest - it.tile; // the blocks that add to qt first
    if (ORDERED)
      semaphoreWait(added, before);
    fenceProxyAsyncGlobal(); // the acquire before this block's bulk reductions
    for (int consumer = 0; consumer < F::TILES; ++consumer) {
      const unsigned staging = sh.stagingAt(u, consumer);
      if (fusedGradStoresFirst<ORDERED, PACKED>() && before == 0 && consumer == 0)
        bulkStore(dq, staging, rows * DH * 4);
      else if (PACKED)
        bulkReduceAdd(dq, staging, rows * DH * 4);
      else
        for (int r = 0; r < rows; ++r)
          bulkReduceAdd(dq + r * DH, staging + r * F::ROW, DH * 4);
      bulkCommit();
      bulkWaitAll();
    }
    fenceProxyAsyncGlobal();
    semaphoreRelease(added);
    barrierArrive(sh.dqEmpty(u));
  }
}

// The producer lane's copies for the block's items: each item's first stages as soon as the
// consumers free them, its keys and values once the consumers are done with the last item's.
template <int B, int T, int H, int DH, bool REVERSED, bool PACKED>
__device__ void produceFusedGrad(const unsigned short *tiles, const float *lse, const float *delta,
                                 const FusedGradShared<DH, PACKED> &sh) {
  using Item = FusedGradItem<T, DH, REVERSED>;
  forEachFusedItem<B, H, Item>([=](const Item &it, int use, int item) {
    const int steps = it.steps(), early = min((int)kGradStages, steps);
    for (int i = 0; i < early; ++i)
      produceGradStage<B, T, H, DH>(tiles, lse, delta, sh, it.bh, it.qt(i), use + i);
    if (item > 0)
      barrierWait(sh.keysEmpty(), (item - 1) & 1);
    produceGradKeys<B, T, H, DH>(tiles, sh, it.bh, it.tile);
    for (int i = early; i < steps; ++i)
      produceGradStage<B, T, H, DH>(tiles, lse, delta, sh, it.bh, it.qt(i), use + i);
  });
}

// Consumer warpgroup `consumer`'s dq (this lane's rows `row` and row + 8 of 64 queries; head
// dims 64 consumer .. at DH 128, all 64 at DH 64) into its staging tile.
template <int DH, bool PACKED>
__device__ __forceinline__ void stageQueryGrads(unsigned char *staging, const float (*dq)[4], int consumer, int row) {
  const int c = 2 * (threadIdx.x % 4) + (DH == 128 ? consumer * 64 : 0);
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int column = 8 * j + c, at = PACKED ? packedChunk(row, column / 4) * 16 + column % 4 * 4 : column * 4;
      *(float2 *)(staging + (row + 8 * r) * FusedGradShared<DH, PACKED>::ROW + at) =
          make_float2(dq[j][2 * r], dq[j][2 * r + 1]);
    }
}

// A consumer warpgroup's part of a fused item whose steps are the block's from `use` on (its
// `item`th): dk and dv of its 64 keys over the item's query tiles, ds^T to shared memory and
// dq's partial product staged each step; then dk and dv into dqkv.
template <int B, int T, int H, int DH, bool REVERSED, bool PACKED, typename Out>
__device__ void consumeFusedItem(const FusedGradShared<DH, PACKED> &sh, unsigned char *base,
                                 FusedGradItem<T, DH, REVERSED> it, int use, int item, Out dqkv, float scale) {
  using F = FusedGradShared<DH, PACKED>;
  constexpr int NK = kWgmmaRows, MQ = kGradQueries, QUERIES = F::QUERIES, HALF = F::HALF;
  enum { kDsFree = 1, kDsReady = 2 }; // named barriers of the two consumer warpgroups
  const int consumer = threadIdx.x / 128 - 1, lane = threadIdx.x % 32;
  const int key0 = it.tile * NK + consumer * 64 + threadIdx.x % 128 / 32 * 16 + lane / 4; // and key0 + 8
  unsigned char *ds = base + (sh.dsAt() - sh.keysAt);
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  barrierWait(sh.keysFull(), item & 1);
  for (int i = 0; i < it.steps(); ++i) {
    const int u = use + i, qt = it.qt(i);
    const unsigned at = sh.stageAt(u);
    unsigned pa[MQ / 16][4], da[MQ / 16][4]; // p^T and ds^T as A fragments
    gradStepProbabilities<T, DH>(pa, da, sh, base, u, qt, it.tile, key0, consumer, scale);
    if (u > 0)
      namedBarrierSync(kDsFree, 256); // both warpgroups' dq products of the last step are done
    storeDsTransposed(ds, da, consumer * 64);
    fenceProxyAsync();
    namedBarrierSync(kDsReady, 256);
    // dq's part, 64 queries x 64 head dims: at DH 128 this warpgroup's half of the head
    // dimension over all 128 keys; at DH 64 the whole of it over the warpgroup's own 64 keys.
    float dq[8][4];
    constexpr int KEYS = DH == 128 ? NK : 64;
    const int keyRow = DH == 128 ? 0 : consumer * 64, block = DH == 128 ? consumer : 0;
    wgmmaFence();
    issueKeyValueGrads<DH>(dv, dk, pa, da, at, at + QUERIES, HALF);
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) { // keys keyRow + 16 kk ..: 16 rows of ds^T and of k on
      const unsigned rows = (keyRow + kk * 16) * 128;
      wgmmaSharedTransposed64(dq, wgmmaDescriptor(sh.dsAt() + rows, NK * 128, 1024),
                              wgmmaDescriptor(sh.keysAt + block * NK * 128 + rows, NK * 128, 1024), kk > 0);
    }
    wgmmaCommit();
    wgmmaWait<0>();
    fenceAccumulators<DH / 8>(dv);
    fenceAccumulators<DH / 8>(dk);
    fenceAccumulators<8>(dq);
    if (lane == 0)
      barrierArrive(sh.empty(u));
    if (u >= 2)
      barrierWait(sh.dqEmpty(u), (u / 2 - 1) & 1);
    stageQueryGrads<DH, PACKED>(base + (sh.stagingAt(u, consumer) - sh.keysAt), dq, consumer,
                                threadIdx.x % 128 / 32 * 16 + lane / 4);
    fenceProxyAsync();
    if (lane == 0)
      barrierArrive(sh.dqFull(u));
  }
  if (lane == 0) // the last products have read the keys and values
    barrierArrive(sh.keysEmpty());
  storeKeyValueGrads<T, H, DH>(dk, dv, dqkv, it.bh / H, it.bh % H, key0);
}

// dk and dv as attentionKeyValueGradSpecialised (into dqkv's k and v parts), and dq's partial
// products added to buffers.dq (attentionFusedQueryGrads then writes dq into dqkv). Work items:
// B H KTILES in FusedGradItem's order, block b taking items b, b + gridDim.x, ... (a block an
// item, or persistent: one an SM, the producer loading the next item's first query tiles while
// the consumers finish this one's). Forward, the key tiles of each head latest first, each
// walking its query tiles from its keys' own on. REVERSED: the earliest key tiles (the longest
// items) first, each walking its query tiles from the last back to its keys' own; then a head's
// items reach a query tile in the order they add to it, and the longest items do not come last.
// A block waits only on items before its own, which blocks before it or its own earlier turns
// hold. DH 64 or 128. ORDERED: addQueryGrads'. PACKED: FusedGradShared's.
template <int B, int T, int H, int DH, bool ORDERED = true, bool REVERSED = false, bool PACKED = true, typename Out>
__device__ void attentionGradFused(const unsigned short *tiles, Out dqkv, float scale, const float *lse,
                                   const float *delta, FusedGradBuffers buffers) {
  static_assert(DH == 64 || DH == 128, "dq's products have N 64: the head dimension or its half");
  static_assert(T % 4 == 0, "lse and delta are copied in 16-byte pieces");
  using F = FusedGradShared<DH, PACKED>;
  using Item = FusedGradItem<T, DH, REVERSED>;
  unsigned char *base = alignedShared();
  const F sh(sharedAddress(base));
  if (threadIdx.x == 0) {
    for (int i = 0; i < 3; ++i)
      barrierInit(sh.keysFull() + 8 * i, 1);
    for (int i = 0; i < 2; ++i) {
      barrierInit(sh.empty(i), 8); // a lane of each consumer warp
      barrierInit(sh.dqFull(i), 8);
      barrierInit(sh.dqEmpty(i), 1); // the writer
    }
    barrierInit(sh.keysEmpty(), 8);
    fenceBarrierInit();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    releaseRegisters<24>(); // (what 168 a thread at launch leaves for 240 a consumer; 16-20 bytes spill here)
    if (threadIdx.x == 0)
      produceFusedGrad<B, T, H, DH, REVERSED, PACKED>(tiles, lse, delta, sh);
    else if (threadIdx.x == 32)
      forEachFusedItem<B, H, Item>([=](const Item &it, int use, int) {
        addQueryGrads<B, T, H, DH, ORDERED, REVERSED, PACKED>(sh, buffers, it, use);
      });
    return;
  }
  claimRegisters<240>();
  forEachFusedItem<B, H, Item>([=](const Item &it, int use, int item) {
    consumeFusedItem<B, T, H, DH, REVERSED, PACKED>(sh, base, it, use, item, dqkv, scale);
  });
}

// dq from the fp32 buffer (PACKED: its rows' chunks packedChunk's) into dqkv's q part ([B, T,
// 3 H DH]).
template <int B, int T, int H, int DH, bool PACKED = true, typename Out>
__device__ void attentionFusedQueryGrads(const float *dq, Out dqkv) {
  FOR_EACH_ELEMENT(i, (int64)B * H * T * DH) {
    const int64 d = i % DH, t = i / DH % T, bh = i / ((int64)T * DH);
    const int64 from = PACKED ? i - d + packedChunk((int)t, (int)d / 4) * 4 + d % 4 : i;
    dqkv[((bh / H) * T + t) * 3 * H * DH + bh % H * DH + d] = dq[from];
  }
}
