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

// How a fused kernel's consumers order their products. Plain: each step's products issued
// together and awaited. Overlapped: FlashAttention-3's order (gradStepProbabilities' OVERLAP;
// dq's product before dk's, and dq staged while dk's runs); at head dim 64, where a
// warpgroup's dq reads only its own ds^T, its ds^T barriers are its own. Lagged: overlapped,
// and at head dim 128 ds^T double-buffered and each step's dq product issued in the next step,
// so that the warpgroups wait for each other's ds^T a step after it is written (a whole step
// apart, no longer in step).
enum FusedFlavor { kPlain, kOverlapped, kLagged };

// Whether a flavour at head dimension DH is lagged (at 64 the lagged flavour is the overlapped
// one): then its shared memory has two ds^T tiles (FusedGradShared's DOUBLE).
template <FusedFlavor FLAVOR, int DH> __host__ __device__ constexpr bool fusedGradLagged() {
  return FLAVOR == kLagged && DH == 128;
}

// The fused kernel's shared memory past GradShared's (keys, values, two stages, five barriers):
// five more barriers (dq staged x2, staging free x2, keys free) in the same 1 KB; ds^T (128 key
// rows of 64 queries, BF16, swizzled as a value tile); two stages of dq's staging tiles (TILES of
// them: 64 rows of DH fp32). So that a warp's rows fall in different banks, each row is 16 bytes longer,
// or (PACKED) the 16-byte chunks of row r are swizzled as r % 8 says (packedChunk), the layout
// the dq buffer then has too, so that a tile is added by one bulk reduction, not one a row.
// DOUBLE (the lagged flavour at head dim 128): two ds^T tiles, and the ten barriers in the second
// half of the first stage's lse and delta kilobyte (lse and delta take the first), so that the
// whole fits in 227 KB.
template <int DH, bool PACKED, bool DOUBLE = false> struct FusedGradShared : GradShared<DH> {
  using G = GradShared<DH>;
  static constexpr int DS = kWgmmaRows * kGradQueries * 2, ROW = DH * 4 + (PACKED ? 0 : 16);
  static constexpr int TILE = kGradQueries * ROW;
  static constexpr int TILES = DH == 128 ? 1 : 2, STAGING = TILES * TILE, DSTILES = DOUBLE ? 2 : 1;
  static constexpr int PAST = 2 * G::KEYS + kGradStages * G::STAGE; // the stages' end
  __device__ explicit FusedGradShared(unsigned keysAt)
      : G(keysAt, DOUBLE ? keysAt + 2 * G::KEYS + 2 * G::QUERIES + 512 : keysAt + PAST) {}
  __device__ unsigned dqFull(int u) const { return G::keysFull() + 8 * (5 + u % 2); }
  __device__ unsigned dqEmpty(int u) const { return G::keysFull() + 8 * (7 + u % 2); }
  __device__ unsigned keysEmpty() const { return G::keysFull() + 8 * 9; } // the next item's keys may land
  // ds^T of step u (DOUBLE: its tile u % 2).
  __device__ unsigned dsAt(int u = 0) const { return G::keysAt + PAST + (DOUBLE ? u % 2 * DS : 1024); }
  // Stage u's staging tile of consumer warpgroup `consumer` (the one tile at DH 128).
  __device__ unsigned stagingAt(int u, int consumer) const {
    return dsAt(0) + DSTILES * DS + u % 2 * STAGING + (TILES - 1) * consumer * TILE;
  }
};
template <int DH, bool PACKED = true, bool DOUBLE = false>
__host__ __device__ constexpr int attentionFusedGradShared() {
  using F = FusedGradShared<DH, PACKED, DOUBLE>;
  return F::PAST + (DOUBLE ? 0 : 1024) + F::DSTILES * F::DS + 2 * F::STAGING + 1024;
}
static_assert(attentionFusedGradShared<128, true, true>() <= 232448, "the lagged form's shared memory");

// Where the 16-byte chunk `chunk` of dq's row `row` lies in a packed staging tile and buffer:
// the chunk's place among its row's groups of eight (128 bytes) crossed with a permutation of
// the row's place among eight rows (0 2 4 6 1 3 5 7). A consumer warp stages rows g and g + 8
// (g < 8), two adjacent chunks a row, in 8-byte stores, which shared memory serves a half-warp
// (rows 0-3 or 4-7) at a time: the permutation sends those four rows' chunk pairs to all eight
// places of 128 bytes, so that each half-warp's store is one wavefront.
__host__ __device__ __forceinline__ int packedChunk(int row, int chunk) { return chunk ^ (row % 4 * 2 + row / 4 % 2); }

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

// The latest key tile that adds to query tile qt: the blocks that add to it are key tiles 0 to
// this one.
template <int T, int DH> __device__ __forceinline__ int fusedGradLatestKeyTile(int qt) {
  return min(SwizzledTiles<T, DH>::TILES - 1, (min(T, (qt + 1) * kGradQueries) - 1) / kWgmmaRows);
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
// the same items. Returns the block's steps.
template <int B, int H, typename Item, typename F> __device__ __forceinline__ int forEachFusedItem(F f) {
  int use = 0, item = 0;
  for (int w = blockIdx.x; w < B * H * Item::KTILES; w += gridDim.x, ++item) {
    const Item it(w);
    f(it, use, item);
    use += it.steps();
  }
  return use; // the block's steps
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
template <int B, int T, int H, int DH, bool ORDERED, bool REVERSED, bool PACKED, bool DOUBLE>
__device__ void addQueryGrads(const FusedGradShared<DH, PACKED, DOUBLE> &sh, FusedGradBuffers buffers,
                              FusedGradItem<T, DH, REVERSED> it, int use) {
  constexpr int MQ = kGradQueries, QTILES = (T + MQ - 1) / MQ, STEP = REVERSED ? -1 : 1;
  using F = FusedGradShared<DH, PACKED, DOUBLE>;
  const int start = it.qt(0), steps = it.steps();
  // (pointers carried along: the lane has 24 registers)
  unsigned *added = buffers.added + (int64)it.bh * QTILES + start;
  float *dq = buffers.dq + ((int64)it.bh * T + start * MQ) * DH;
  for (int i = 0; i < steps; ++i, added += STEP, dq += STEP * MQ * DH) {
    const int u = use + i, qt = start + STEP * i, rows = min(MQ, T - qt * MQ);
    const int latest = fusedGradLatestKeyTile<T, DH>(qt);
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
// Operands: SwizzledTiles' tiles (const unsigned short *) or tensor maps (const AttentionMaps *).
template <int B, int T, int H, int DH, bool REVERSED, typename Operands, typename F>
__device__ void produceFusedGrad(Operands tiles, const float *lse, const float *delta, const F &sh) {
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

// This warpgroup's dq for the step whose ds^T is at `dsAt` (issued, not committed), 64 queries x
// 64 head dims: at DH 128 its half of the head dimension over all 128 keys; at DH 64 the whole
// width over its own 64 keys.
template <int DH>
__device__ __forceinline__ void issueQueryGrads(float (*dq)[4], unsigned dsAt, unsigned keysAt, int consumer) {
  constexpr int NK = kWgmmaRows, KEYS = DH == 128 ? NK : 64;
  const int keyRow = DH == 128 ? 0 : consumer * 64, block = DH == 128 ? consumer : 0;
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) { // keys keyRow + 16 kk ..: 16 rows of ds^T and of k on
    const unsigned rows = (keyRow + kk * 16) * 128;
    wgmmaSharedTransposed64(dq, wgmmaDescriptor(dsAt + rows, NK * 128, 1024),
                            wgmmaDescriptor(keysAt + block * NK * 128 + rows, NK * 128, 1024), kk > 0);
  }
}

// Step u's dq (this warpgroup's) into its staging tile, once the writer is done with the tile
// two steps before; then the writer is told.
template <int DH, bool PACKED, typename F>
__device__ __forceinline__ void postQueryGrads(const F &sh, unsigned char *base, const float (*dq)[4], int u,
                                               int consumer) {
  if (u >= 2)
    barrierWait(sh.dqEmpty(u), (u / 2 - 1) & 1);
  stageQueryGrads<DH, PACKED>(base + (sh.stagingAt(u, consumer) - sh.keysAt), dq, consumer,
                              threadIdx.x % 128 / 32 * 16 + threadIdx.x % 32 / 4);
  fenceProxyAsync();
  if (threadIdx.x % 32 == 0)
    barrierArrive(sh.dqFull(u));
}

// A consumer warpgroup's part of a fused item whose steps are the block's from `use` on (its
// `item`th): dk and dv of its 64 keys over the item's query tiles, ds^T to shared memory and
// dq's partial product staged each step; then dk and dv into dqkv. FLAVOR plain or overlapped
// (FusedFlavor).
template <int B, int T, int H, int DH, bool REVERSED, bool PACKED, FusedFlavor FLAVOR, typename F, typename Out>
__device__ void consumeFusedItem(const F &sh, unsigned char *base, FusedGradItem<T, DH, REVERSED> it, int use, int item,
                                 Out dqkv, float scale) {
  constexpr int MQ = kGradQueries, QUERIES = F::QUERIES, HALF = F::HALF;
  constexpr bool OVERLAP = FLAVOR != kPlain, BOTH = !OVERLAP || DH == 128;
  const int consumer = threadIdx.x / 128 - 1, lane = threadIdx.x % 32;
  // ds^T's named barriers: free (the dq products of the last step are done) and ready; of both
  // warpgroups (256 threads), or (BOTH false) each warpgroup's own.
  const int dsFree = BOTH ? 1 : 1 + 2 * consumer, dsReady = dsFree + 1, threads = BOTH ? 256 : 128;
  const int key0 = gradKey0(it.tile, consumer); // and key0 + 8
  unsigned char *ds = base + (sh.dsAt() - sh.keysAt);
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  barrierWait(sh.keysFull(), item & 1);
  for (int i = 0; i < it.steps(); ++i) {
    const int u = use + i, qt = it.qt(i);
    const unsigned at = sh.stageAt(u);
    unsigned pa[MQ / 16][4], da[MQ / 16][4]; // p^T and ds^T as A fragments
    gradStepProbabilities<T, DH, OVERLAP>(pa, da, dv, sh, base, u, qt, it.tile, key0, consumer, scale);
    if (u > 0)
      namedBarrierSync(dsFree, threads);
    storeDsTransposed(ds, da, consumer * 64);
    fenceProxyAsync();
    namedBarrierSync(dsReady, threads);
    float dq[8][4];
    wgmmaFence();
    if (!OVERLAP)
      issueKeyValueGrads<DH>(dv, dk, pa, da, at, at + QUERIES, HALF);
    issueQueryGrads<DH>(dq, sh.dsAt(), sh.keysAt, consumer);
    wgmmaCommit();
    if (OVERLAP) {
      issueKeyValueGrads<DH, 2>(dv, dk, pa, da, at, at + QUERIES, HALF);
      wgmmaCommit();
      wgmmaWait<1>(); // dv's and dq's products; dk's runs on under dq's staging
    } else {
      wgmmaWait<0>();
      fenceAccumulators<DH / 8>(dk);
      if (lane == 0)
        barrierArrive(sh.empty(u));
    }
    fenceAccumulators<DH / 8>(dv);
    fenceAccumulators<8>(dq);
    postQueryGrads<DH, PACKED>(sh, base, dq, u, consumer);
    if (OVERLAP) {
      wgmmaWait<0>();
      fenceAccumulators<DH / 8>(dk);
      fenceFragments<MQ / 16>(pa); // read by the products until here
      fenceFragments<MQ / 16>(da);
      if (lane == 0)
        barrierArrive(sh.empty(u));
    }
  }
  if (lane == 0) // the last products have read the keys and values
    barrierArrive(sh.keysEmpty());
  storeKeyValueGrads<T, H, DH>(dk, dv, dqkv, it.bh / H, it.bh % H, key0);
}

// The lagged flavour's named barriers for step u's ds^T tile (u % 2) and warpgroup c: ready (c
// has written its half: c arrives, the other syncs before its dq product reads the tile) and
// freed (c's dq product has read the tile: c arrives, the other syncs before it writes its half
// again).
__device__ __forceinline__ int dsReadyBarrier(int u, int c) { return 1 + 2 * (u % 2) + c; }
__device__ __forceinline__ int dsFreedBarrier(int u, int c) { return 5 + 2 * (u % 2) + c; }

// consumeFusedItem's lagged flavour (DH 128; FusedFlavor): overlapped, with step u's ds^T in
// tile u % 2 and its dq product issued in step u + 1 beside dk's (the item's last step's after
// the loop), so that a warpgroup waits for the other's half of ds^T a step after it was written.
template <int B, int T, int H, int DH, bool REVERSED, bool PACKED, typename F, typename Out>
__device__ void consumeFusedItemLagged(const F &sh, unsigned char *base, FusedGradItem<T, DH, REVERSED> it, int use,
                                       int item, Out dqkv, float scale) {
  static_assert(DH == 128, "at DH 64 a warpgroup's dq reads only its own ds^T");
  constexpr int MQ = kGradQueries, QUERIES = F::QUERIES, HALF = F::HALF;
  const int consumer = threadIdx.x / 128 - 1, other = 1 - consumer, lane = threadIdx.x % 32;
  const int key0 = gradKey0(it.tile, consumer); // and key0 + 8
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  barrierWait(sh.keysFull(), item & 1);
  for (int i = 0; i < it.steps(); ++i) {
    const int u = use + i, qt = it.qt(i);
    const unsigned at = sh.stageAt(u);
    unsigned pa[MQ / 16][4], da[MQ / 16][4]; // p^T and ds^T as A fragments
    gradStepProbabilities<T, DH, true>(pa, da, dv, sh, base, u, qt, it.tile, key0, consumer, scale);
    if (u >= 2)
      namedBarrierSync(dsFreedBarrier(u, other), 256); // the other's dq product of step u - 2 is done
    storeDsTransposed(base + (sh.dsAt(u) - sh.keysAt), da, consumer * 64);
    fenceProxyAsync();
    namedBarrierArrive(dsReadyBarrier(u, consumer), 256);
    // (each branch issues and awaits its own products: none is in flight where they meet)
    if (i > 0) {
      namedBarrierSync(dsReadyBarrier(u - 1, other), 256);
      float dq[8][4];
      wgmmaFence();
      issueQueryGrads<DH>(dq, sh.dsAt(u - 1), sh.keysAt, consumer);
      wgmmaCommit();
      issueKeyValueGrads<DH, 2>(dv, dk, pa, da, at, at + QUERIES, HALF);
      wgmmaCommit();
      wgmmaWait<1>(); // dv's and the last step's dq products; dk's runs on under dq's staging
      fenceAccumulators<DH / 8>(dv);
      fenceAccumulators<8>(dq);
      namedBarrierArrive(dsFreedBarrier(u - 1, consumer), 256);
      postQueryGrads<DH, PACKED>(sh, base, dq, u - 1, consumer);
      wgmmaWait<0>();
    } else {
      wgmmaFence();
      issueKeyValueGrads<DH, 2>(dv, dk, pa, da, at, at + QUERIES, HALF);
      wgmmaCommit();
      wgmmaWait<0>();
      fenceAccumulators<DH / 8>(dv);
    }
    fenceAccumulators<DH / 8>(dk);
    fenceFragments<MQ / 16>(pa); // read by the products until here
    fenceFragments<MQ / 16>(da);
    if (lane == 0)
      barrierArrive(sh.empty(u));
  }
  const int last = use + it.steps() - 1; // the item's last step's dq
  namedBarrierSync(dsReadyBarrier(last, other), 256);
  float dq[8][4];
  wgmmaFence();
  issueQueryGrads<DH>(dq, sh.dsAt(last), sh.keysAt, consumer);
  wgmmaCommit();
  wgmmaWait<0>();
  fenceAccumulators<8>(dq);
  namedBarrierArrive(dsFreedBarrier(last, consumer), 256);
  if (lane == 0) // the last products have read the keys and values
    barrierArrive(sh.keysEmpty());
  postQueryGrads<DH, PACKED>(sh, base, dq, last, consumer);
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
// hold. DH 64 or 128. ORDERED: addQueryGrads'. PACKED: FusedGradShared's. FLAVOR: the
// consumers' (FusedFlavor). Operands: produceFusedGrad's.
template <int B, int T, int H, int DH, bool ORDERED = true, bool REVERSED = false, bool PACKED = true,
          FusedFlavor FLAVOR = kPlain, typename Operands, typename Out>
__device__ void attentionGradFused(Operands tiles, Out dqkv, float scale, const float *lse, const float *delta,
                                   FusedGradBuffers buffers) {
  static_assert(DH == 64 || DH == 128, "dq's products have N 64: the head dimension or its half");
  static_assert(T % 4 == 0, "lse and delta are copied in 16-byte pieces");
  constexpr bool LAGGED = fusedGradLagged<FLAVOR, DH>();
  using F = FusedGradShared<DH, PACKED, LAGGED>;
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
      produceFusedGrad<B, T, H, DH, REVERSED>(tiles, lse, delta, sh);
    else if (threadIdx.x == 32)
      forEachFusedItem<B, H, Item>([=](const Item &it, int use, int) {
        addQueryGrads<B, T, H, DH, ORDERED, REVERSED, PACKED>(sh, buffers, it, use);
      });
    return;
  }
  claimRegisters<240>();
  const int steps = forEachFusedItem<B, H, Item>([=](const Item &it, int use, int item) {
    if constexpr (LAGGED)
      consumeFusedItemLagged<B, T, H, DH, REVERSED, PACKED>(sh, base, it, use, item, dqkv, scale);
    else
      consumeFusedItem<B, T, H, DH, REVERSED, PACKED, FLAVOR>(sh, base, it, use, item, dqkv, scale);
  });
  if (LAGGED) // the other warpgroup's freed arrivals of the last two steps, which no step syncs on
    for (int u = max(0, steps - 2); u < steps; ++u)
      namedBarrierSync(dsFreedBarrier(u, 2 - threadIdx.x / 128), 256);
}

// attentionGradFused (packed, in order) with its operands copied by tensor maps from where they
// lie (AttentionMaps): a kernel here rather than in the bench, for WgmmaNvrtcTest compiles it too.
template <int B, int T, int H, int DH, FusedFlavor FLAVOR, typename Out>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    fusedGradMapped(const __grid_constant__ AttentionMaps maps, Out dqkv, float scale, const float *lse,
                    const float *delta, FusedGradBuffers buffers) {
  attentionGradFused<B, T, H, DH, true, false, true, FLAVOR>(&maps, dqkv, scale, lse, delta, buffers);
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

// dq's tile (sequence and head bh, query tile qt) from the fp32 buffer into dqkv's q part, once
// every key tile has added to it (its counter at latest + 1): attentionFusedQueryGrads a tile at
// a time, as a kernel launched behind the fused one (programmatic dependent launch: it starts
// once every fused block has started, on the SMs the finished blocks leave, and polls the
// counters), so that the conversion runs under the fused kernel's tail. Packed buffers.
template <int B, int T, int H, int DH, typename Out>
__device__ void finishQueryGradTile(const float *dq, const unsigned *added, Out dqkv, int bh, int qt) {
  constexpr int MQ = kGradQueries, QTILES = (T + MQ - 1) / MQ;
  const int rows = min(MQ, T - qt * MQ), latest = fusedGradLatestKeyTile<T, DH>(qt);
  if (threadIdx.x == 0) {
    const unsigned *counter = added + (int64)bh * QTILES + qt;
    while (*(volatile const unsigned *)counter != latest + 1) // (backing off: the fused blocks share L2)
      __nanosleep(512);
    semaphoreWait(counter, latest + 1); // the acquire
    fenceProxyAsyncGlobal();            // the bulk reductions' writes, then these loads
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * DH / 4; i += blockDim.x) {
    const int t = qt * MQ + i / (DH / 4), chunk = i % (DH / 4);
    const float4 v = __ldcg((const float4 *)(dq + ((int64)bh * T + t) * DH) + packedChunk(t, chunk));
    store4(dqkv, ((int64)(bh / H) * T + t) * 3 * H * DH + bh % H * DH + chunk * 4, v);
  }
}
