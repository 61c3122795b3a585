// The sample op (support/Sampling.h's definition) after argmax's parts (each row's largest logit
// and its index, decode.cuh): where all of the rows' blocks fit the GPU at once, one cooperative
// launch over every block of every row (sampleGrid, below); otherwise the weights of every token
// (many blocks a row), then a block of 1024 threads a row for the thresholds and the draw
// (sampleRows); on compute capability 9.0, where TGC_SAMPLE_CLUSTER=1 asks for it, one launch
// of a cluster of blocks a row without the argmax parts (sampleCluster, at the end). Every
// decision is an integer sum or an integer comparison, so the token is the CPU's whatever the
// order of the sums.
#pragma once

#include "decode.cuh"
#include "Sampling.h"

// sampleRows' block: 1024 threads a row.
constexpr int kSampleThreads = 1024;
// Loads each thread has in flight at once in the passes over a row (ten passes over GPT-2's
// 50,257 logits: one block a row).
constexpr int kSampleUnroll = 8;

// f(valid, logit, weight) for the row's elements i = threadIdx.x + k * kSampleThreads in order
// of k, kSampleUnroll loads (of the logit, and of the weight where weights is not null; 1
// otherwise) in flight at once. Every thread calls f the same number of times (valid is false
// past the row's end), so that f may use warp-wide intrinsics.
template <int64 N, typename F>
__device__ __forceinline__ void sampleForEach(const float *x, const unsigned long long *weights, F f) {
  constexpr int64 Step = (int64)kSampleThreads * kSampleUnroll;
  for (int64 base = threadIdx.x; base - threadIdx.x < N; base += Step) {
    float v[kSampleUnroll];
    unsigned long long w[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      int64 i = base + (int64)u * kSampleThreads;
      v[u] = i < N ? x[i] : 0.0f;
      w[u] = i < N && weights ? weights[i] : 1ull;
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) f(base + (int64)u * kSampleThreads < N, v[u], w[u]);
  }
}

// Adds `weight` to bins[bin] (nothing where bin < 0); every lane of the warp calls it. The lanes
// of one bin add their sum in one atomic (a weight is at most 2^40: its low 21 and high 20 bits
// summed over 32 lanes fit 32 bits), so that the lanes of the common leading bytes do not queue
// on one 64-bit shared atomic each.
__device__ __forceinline__ void sampleAddToBin(unsigned long long *bins, int bin, unsigned long long weight) {
#if __CUDA_ARCH__ >= 800
  unsigned peers = __match_any_sync(0xffffffffu, bin);
  unsigned low = __reduce_add_sync(peers, (unsigned)(weight & 0x1fffffull));
  unsigned high = __reduce_add_sync(peers, (unsigned)(weight >> 21));
  if (bin >= 0 && (int)(threadIdx.x % 32) == __ffs(peers) - 1)
    atomicAdd(&bins[bin], ((unsigned long long)high << 21) + low);
#else
  if (bin >= 0)
    atomicAdd(&bins[bin], weight);
#endif
}

// A warp's own bins, each in two 32-bit pieces: the weights' low 22 bits and the rest (a weight
// is at most 2^40, so each piece's sum over the warp's tokens fits 32 bits up to 1024 of them).
struct SampleWarpBins {
  unsigned low[256], high[256];
};

// Adds `weight` to bin `bin` of the calling warp's own bins (nothing where bin < 0): each lane
// its own 32-bit shared atomics, the lanes not gathered by bin first (tests/bench/sample_parts.cu,
// H100: a round of sampleGrid's took ~6.3 us with the gathering, __match_any_sync and the sums
// over its groups, and ~1.2 us without).
__device__ __forceinline__ void sampleAddToWarpBin(SampleWarpBins &bins, int bin, unsigned long long weight) {
  if (bin < 0)
    return;
  atomicAdd(&bins.low[bin], (unsigned)(weight & 0x3fffffu));
  if (unsigned high = (unsigned)(weight >> 22))
    atomicAdd(&bins.high[bin], high);
}

// Thread 0's (best, index) given to every thread of the block. Caller gives each caller shared
// words of its own (one pair for every caller grew gpt2-124m's decode step by 1,152 bytes of
// CUBIN).
template <int Caller>
__device__ __forceinline__ void sampleShareBest(float &best, int &index) {
  __shared__ float sharedBest;
  __shared__ int sharedIndex;
  if (threadIdx.x == 0) {
    sharedBest = best;
    sharedIndex = index;
  }
  __syncthreads();
  best = sharedBest;
  index = sharedIndex;
}

// The row's largest logit and its index, from argmaxParts' parts, given to every thread.
template <int64 N, int64 Chunk> __device__ void sampleRowBest(const float *parts, int64 row, float &best, int &index) {
  argmaxOfParts<N, Chunk>(parts, row, best, index);
  sampleShareBest<0>(best, index);
}

// Launch 1: the weights [Rows, N] of each row's tokens (nothing under temperature <= 0), a block
// per Chunk of a row.
template <int64 N, int64 Chunk>
__device__ void sampleWeights(const float *x, const float *parts, const float *sampling, unsigned long long *weights) {
  constexpr int64 Chunks = (N + Chunk - 1) / Chunk;
  float temperature = sampling[0];
  if (!(temperature > 0.0f))
    return;
  int64 row = blockIdx.x / Chunks, first = (blockIdx.x % Chunks) * Chunk;
  float best;
  int index;
  sampleRowBest<N, Chunk>(parts, row, best, index);
  for (int64 i = first + threadIdx.x; i < N && i < first + Chunk; i += blockDim.x)
    weights[row * N + i] = samplingWeight(x[row * N + i], best, temperature);
}

// The block's total of `value` (common.cuh's fixed tree; integers, so any order would do).
__device__ unsigned long long sampleBlockSum(unsigned long long value) {
  __shared__ unsigned long long totals[32];
  return blockReduce(value, totals, [](unsigned long long a, unsigned long long b) { return a + b; });
}

// The sum of `value` over the threads before this one (in thread order): each warp's running
// sums by shuffles, then the warps' totals before this warp.
__device__ unsigned long long sampleExclusiveScan(unsigned long long value) {
  __shared__ unsigned long long totals[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long inclusive = value;
  for (int offset = 1; offset < 32; offset <<= 1) {
    unsigned long long before = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset)
      inclusive += before;
  }
  if (lane == 31)
    totals[warp] = inclusive;
  __syncthreads();
  unsigned long long earlier = 0;
  for (int w = 0; w < warp; ++w)
    earlier += totals[w];
  __syncthreads();
  return earlier + inclusive - value;
}

// Row `row`'s draw for the token after position `counter` (samplingDraw), scaled to total, from
// the seed's two 32-bit words (the low, then the high).
__device__ __forceinline__ unsigned long long sampleRowDraw(const int *seed, int64 row, long long counter,
                                                            unsigned long long total) {
  unsigned long long word = (unsigned long long)(unsigned)seed[0] | (unsigned long long)(unsigned)seed[1] << 32;
  return samplingDraw(word, row, counter, total);
}

// One radix round's decision from its 256 bins (in shared memory, complete): the next byte of
// the key at `shift` is the bin where the weight from the top, past `above` (the keys above the
// prefix's range), reaches `target` (bin 0 if none); prefix, above and kept (the weight of the
// keys >= the prefix so far) move on to it. Thread t holds bin 255 - t, so the bins above it
// are the threads before it; every thread of the block calls it.
__device__ void sampleNextByte(const unsigned long long *bins, int shift, unsigned long long target, unsigned &prefix,
                               unsigned long long &above, unsigned long long &kept) {
  __shared__ unsigned sharedPrefix;
  __shared__ unsigned long long sharedAbove, sharedKept;
  int b = 255 - (int)threadIdx.x;
  unsigned long long own = b >= 0 ? bins[b] : 0ull;
  unsigned long long before = above + sampleExclusiveScan(own);
  if (threadIdx.x == 0) {
    sharedPrefix = prefix;
    sharedAbove = above;
    sharedKept = above + bins[0];
  }
  __syncthreads();
  if (b >= 0 && before < target && target <= before + own) {
    sharedPrefix = prefix | (unsigned)b << shift;
    sharedAbove = before;
    sharedKept = before + own;
  }
  __syncthreads();
  prefix = sharedPrefix;
  above = sharedAbove;
  kept = sharedKept;
}

// The largest key t such that the row's tokens of key >= t and >= lowest weigh at least target
// (each weighs 1 where weights is null), and in `kept` what they weigh: a radix select, a byte
// of the key a round, each round's 256 sums made by integer atomics in shared memory (the same
// totals in any order).
template <int64 N>
__device__ unsigned sampleThreshold(const float *x, const unsigned long long *weights, unsigned lowest,
                                    unsigned long long target, unsigned long long &kept) {
  constexpr int Copies = 8; // histograms: warp w adds to copy w % Copies, then they are summed
  __shared__ unsigned long long copies[Copies][256];
  unsigned long long *bins = copies[0];
  unsigned prefix = 0;
  unsigned long long above = 0; // the weight of the keys above the prefix's range
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int k = threadIdx.x; k < Copies * 256; k += blockDim.x)
      copies[k / 256][k % 256] = 0;
    __syncthreads();
    unsigned decided = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
    // Logits share their leading bytes: 50k atomics on a few bins queued for half a
    // millisecond. Each warp's lanes of a bin add once (sampleAddToBin), into one of 8 copies.
    unsigned long long *mine = copies[(threadIdx.x / 32) % Copies];
    sampleForEach<N>(x, weights, [&](bool valid, float logit, unsigned long long weight) {
      unsigned key = samplingKey(logit);
      bool counted = valid && key >= lowest && (key & decided) == prefix;
      sampleAddToBin(mine, counted ? (int)((key >> shift) & 255u) : -1, weight);
    });
    __syncthreads();
    for (int k = threadIdx.x; k < 256; k += blockDim.x) {
      unsigned long long sum = 0;
      for (int c = 0; c < Copies; ++c)
        sum += copies[c][k];
      bins[k] = sum;
    }
    __syncthreads();
    sampleNextByte(bins, shift, target, prefix, above, kept);
  }
  return prefix; // kept: after the last round, the weight of the keys >= the threshold
}

// Launch 2: a block of 1024 threads a row: argmax under temperature <= 0, else the top-k key,
// the kept weight, the top-p key, and the token the draw lands on (each thread a contiguous run
// of tokens, the runs' weights scanned in thread order).
template <int64 N, int64 Chunk, int64 Stride>
__device__ void sampleRows(const float *logits, const float *parts, const int *counters, const float *sampling,
                           const int *seed, const unsigned long long *allWeights, int *out) {
  int64 row = blockIdx.x;
  float best;
  int index;
  sampleRowBest<N, Chunk>(parts, row, best, index);
  float temperature = sampling[0], topP = sampling[1];
  int64 topK = samplingTopK(sampling[2], N);
  if (!(temperature > 0.0f)) {
    if (threadIdx.x == 0)
      out[row] = index;
    return;
  }
  const float *x = logits + row * N;
  const unsigned long long *weights = allWeights + row * N;
  unsigned long long kept = 0;
  unsigned lowest = topK > 0 ? sampleThreshold<N>(x, nullptr, 0u, (unsigned long long)topK, kept) : 0u;
  unsigned long long total = 0;
  sampleForEach<N>(x, weights, [&](bool valid, float logit, unsigned long long weight) {
    if (valid && samplingKey(logit) >= lowest)
      total += weight;
  });
  total = sampleBlockSum(total);
  if (total == 0) { // no finite logit
    if (threadIdx.x == 0)
      out[row] = index;
    return;
  }
  if (topP < 1.0f)
    lowest = sampleThreshold<N>(x, weights, lowest, samplingMassTarget(total, topP), total);
  unsigned long long draw = sampleRowDraw(seed, row, (long long)counters[row] - row * Stride, total);
  constexpr int64 Run = (N + kSampleThreads - 1) / kSampleThreads;
  int64 first = threadIdx.x * Run, last = first + Run < N ? first + Run : N;
  unsigned long long own = 0;
  for (int64 at = first; at < last; at += kSampleUnroll) { // kSampleUnroll loads in flight
    float v[kSampleUnroll];
    unsigned long long w[kSampleUnroll];
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u) {
      v[u] = at + u < last ? x[at + u] : 0.0f;
      w[u] = at + u < last ? weights[at + u] : 0ull;
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u)
      if (at + u < last && samplingKey(v[u]) >= lowest)
        own += w[u];
  }
  unsigned long long running = sampleExclusiveScan(own);
  if (running <= draw && draw < running + own)
    for (int64 i = first; i < last; ++i)
      if (samplingKey(x[i]) >= lowest && (running += weights[i]) > draw) {
        out[row] = (int)i;
        break;
      }
}

// ---- The draw over all of a row's blocks: one cooperative launch after argmaxParts ----
// Launch 0 (argmaxParts, then sampleGridClear) zeroes each row's sums; launch 1 is
// sampleGrid's, Rows x Chunks blocks of kSampleGridThreads all resident at once (a cooperative
// launch): each block holds its chunk's keys and weights in registers, adds its counts to the
// row's bins in global memory (each warp counting into bins of its own first), and after a
// barrier of the row's blocks every block takes the same decision from the same integer sums
// (sampleNextByte), so the token is sampleRows's, the CPU's, by construction. Each round passes
// over registers, not over the row in memory.

// (Sampling.h's kSampleGridThreads a block, thread t holding bin 255 - t in sampleNextByte;
// kSampleGridSlots: bins of 4 top-k rounds, the total (without top-p, whose first round's bins
// sum to it), 4 top-p rounds.)

template <int64 N, int64 Chunk>
struct SampleGrid {
  static constexpr int64 Chunks = (N + Chunk - 1) / Chunk;
  static constexpr int Per = (int)(Chunk / kSampleGridThreads); // a thread's contiguous run
  // 64-bit words a row: the slots' bins, the chunks' sums, the barrier (two 32-bit words).
  static constexpr int64 Words = kSampleGridRowWords + Chunks;
  static_assert(Chunk % kSampleGridThreads == 0, "a chunk is whole runs of the block's threads");
};

// Zeroes the rows' words (launch 0's blocks, after argmaxParts): sampleGrid reads them as sums.
template <int64 N, int64 Chunk>
__device__ void sampleGridClear(unsigned long long *scratch, int64 rows) {
  const int64 words = rows * SampleGrid<N, Chunk>::Words;
  for (int64 i = (int64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += (int64)gridDim.x * blockDim.x)
    scratch[i] = 0;
}

// Each of a row's `blocks` blocks waits here for the others (the cooperative launch keeps them
// all resident; rows wait apart). `barrier`: the row's count (zero between barriers) and a
// generation that the last block to arrive moves on.
__device__ void sampleGridBarrier(unsigned *barrier, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned *generation = barrier + 1;
    unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(barrier, 1u) == blocks - 1) {
      barrier[0] = 0;
      __threadfence();
      atomicAdd(barrier + 1, 1u);
    } else {
      while (*generation == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

// sampleThreshold over the row's blocks: the largest key t >= lowest whose keys (>= t) weigh at
// least target (4 rounds, in the bins of slots slot..slot+3), and in kept what they weigh. A
// target of 0 is top-p's: samplingMassTarget(total, topP) of the weight of every key >= lowest,
// which is the sum of the first round's bins (no barrier of its own); `total` returns it, and
// where it is 0 (no finite logit) the rounds stop there.
template <int Per>
__device__ unsigned sampleGridThreshold(const unsigned (&key)[Per], const unsigned long long (&weight)[Per],
                                        bool weighted, unsigned lowest, unsigned long long target, float topP,
                                        unsigned long long *rowBins, int slot, unsigned *barrier, unsigned blocks,
                                        unsigned long long &kept, unsigned long long &total) {
  constexpr int Warps = kSampleGridThreads / 32;
  static_assert(Per * 32 <= 1024, "a warp's pieces sum at most 1024 weights");
  __shared__ unsigned long long local[256];
  __shared__ SampleWarpBins warpBins[Warps]; // each warp's counts, apart
  unsigned prefix = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8, ++slot) {
    for (int w = 0; w < Warps; ++w)
      warpBins[w].low[threadIdx.x] = warpBins[w].high[threadIdx.x] = 0;
    __syncthreads();
    unsigned decided = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
#pragma unroll
    for (int k = 0; k < Per; ++k) {
      bool counted = key[k] >= lowest && (key[k] & decided) == prefix && weight[k] != ~0ull;
      sampleAddToWarpBin(warpBins[threadIdx.x / 32], counted ? (int)((key[k] >> shift) & 255u) : -1,
                         weighted ? weight[k] : 1ull);
    }
    __syncthreads();
    unsigned long long sum = 0; // the block's count of bin threadIdx.x
    for (int w = 0; w < Warps; ++w)
      sum += warpBins[w].low[threadIdx.x] + ((unsigned long long)warpBins[w].high[threadIdx.x] << 22);
    if (sum)
      atomicAdd(rowBins + slot * 256 + threadIdx.x, sum);
    sampleGridBarrier(barrier, blocks);
    local[threadIdx.x] = __ldcg(rowBins + slot * 256 + threadIdx.x); // the row's bins, past the L1
    if (shift == 24) {
      total = sampleBlockSum(local[threadIdx.x]); // (its barriers make local whole)
      if (total == 0)
        return 0;
      if (target == 0)
        target = samplingMassTarget(total, topP);
    }
    __syncthreads();
    sampleNextByte(local, shift, target, prefix, above, kept);
  }
  return prefix;
}

// The token the draw lands on, written to *out by the thread whose run holds it: running is the
// kept weight of the row before this thread's run, own its run's (keys >= lowest; ~0 marks a
// place past the row).
template <int Per>
__device__ __forceinline__ void sampleLand(const unsigned (&key)[Per], const unsigned long long (&weight)[Per],
                                           unsigned lowest, unsigned long long running, unsigned long long own,
                                           unsigned long long draw, int64 first, int *out) {
  if (running <= draw && draw < running + own) {
#pragma unroll
    for (int k = 0; k < Per; ++k)
      if (weight[k] != ~0ull && key[k] >= lowest && (running += weight[k]) > draw) {
        *out = (int)(first + k);
        break;
      }
  }
}

// The weight of this thread's kept tokens (keys >= lowest; ~0 marks a place past the row).
template <int Per>
__device__ unsigned long long sampleGridKept(const unsigned (&key)[Per], const unsigned long long (&weight)[Per],
                                             unsigned lowest) {
  unsigned long long own = 0;
#pragma unroll
  for (int k = 0; k < Per; ++k)
    if (weight[k] != ~0ull && key[k] >= lowest)
      own += weight[k];
  return own;
}

// Launch 1: the sample op's token for each row, as sampleRows gives it (ArgChunk: argmaxParts's
// chunk; Chunk: a block's share of the row; scratch: sampleGridClear's zeroed words).
template <int64 N, int64 ArgChunk, int64 Chunk, int64 Stride>
__device__ void sampleGrid(const float *logits, const float *parts, const int *counters, const float *sampling,
                           const int *seed, unsigned long long *scratch, int *out) {
  using G = SampleGrid<N, Chunk>;
  constexpr int Per = G::Per;
  constexpr unsigned blocks = (unsigned)G::Chunks;
  const int64 row = blockIdx.x / G::Chunks, chunk = blockIdx.x % G::Chunks;
  unsigned long long *rowBins = scratch + row * G::Words, *chunkSums = rowBins + kSampleGridSlots * 256;
  unsigned *barrier = (unsigned *)(chunkSums + G::Chunks);
  float best;
  int index;
  sampleRowBest<N, ArgChunk>(parts, row, best, index);
  const float temperature = sampling[0], topP = sampling[1];
  const int64 topK = samplingTopK(sampling[2], N);
  if (!(temperature > 0.0f)) { // every block returns here alike: no barrier waits
    if (chunk == 0 && threadIdx.x == 0)
      out[row] = index;
    return;
  }
  const int64 first = chunk * Chunk + (int64)threadIdx.x * Per; // this thread's run
  unsigned key[Per];
  unsigned long long weight[Per];
#pragma unroll
  for (int k = 0; k < Per; ++k) {
    float logit = first + k < N ? logits[row * N + first + k] : 0.0f;
    key[k] = samplingKey(logit);
    weight[k] = first + k < N ? samplingWeight(logit, best, temperature) : ~0ull;
  }
  unsigned long long kept = 0, total = 0;
  unsigned lowest = 0;
  if (topK > 0)
    lowest = sampleGridThreshold<Per>(key, weight, false, 0u, (unsigned long long)topK, topP, rowBins, 0, barrier,
                                      blocks, kept, total);
  if (topP < 1.0f) { // the total from the first round's bins, then what the cut keeps
    lowest = sampleGridThreshold<Per>(key, weight, true, lowest, 0, topP, rowBins, 5, barrier, blocks, kept, total);
    if (total)
      total = kept;
  } else {
    unsigned long long blockTotal = sampleBlockSum(sampleGridKept<Per>(key, weight, lowest));
    if (threadIdx.x == 0 && blockTotal)
      atomicAdd(rowBins + 4 * 256, blockTotal);
    sampleGridBarrier(barrier, blocks);
    total = __ldcg(rowBins + 4 * 256);
  }
  if (total == 0) { // no finite logit (every block sees it: none waits again)
    if (chunk == 0 && threadIdx.x == 0)
      out[row] = index;
    return;
  }
  unsigned long long own = sampleGridKept<Per>(key, weight, lowest);
  unsigned long long draw = sampleRowDraw(seed, row, (long long)counters[row] - row * Stride, total);
  unsigned long long running = sampleExclusiveScan(own), mine = sampleBlockSum(own);
  if (threadIdx.x == 0)
    chunkSums[chunk] = mine;
  sampleGridBarrier(barrier, blocks);
  for (int64 c = 0; c < chunk; ++c)
    running += __ldcg(chunkSums + c);
  sampleLand<Per>(key, weight, lowest, running, own, draw, first, out + row);
}

// ---- The draw in one launch of a thread-block cluster a row (compute capability 9.0) ----
// No argmax launch before it and no grid barrier: sampleGrid meets its row's blocks at a
// barrier in global memory for each radix round, a microsecond or more each, after the argmax
// parts' launch. Here the row's Blocks blocks (one cluster: the kernel declares
// __cluster_dims__) hold the row's keys and weights in registers, a thread a contiguous run of
// Per tokens, and meet at the cluster's hardware barrier, each reading the others' sums from
// their shared memory (the cluster's distributed shared memory). The row's largest logit comes
// from the blocks' own argmax, combined the same way. Every decision is an integer sum or
// comparison, so the token is sampleRows's and sampleGrid's, the CPU's, by construction.

// This block's rank in its cluster.
__device__ __forceinline__ unsigned clusterRank() {
  unsigned rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}

// Every thread of every block of the cluster waits here; the shared-memory writes before it are
// seen by every block after it (release, acquire). Every thread of the block calls it.
__device__ __forceinline__ void clusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// The value at `local` (a __shared__ variable of this block) in block `rank` of the cluster.
__device__ __forceinline__ unsigned long long clusterLoad(const unsigned long long *local, unsigned rank) {
  unsigned address = (unsigned)__cvta_generic_to_shared(local), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  unsigned long long value;
  asm volatile("ld.shared::cluster.u64 %0, [%1];\n" : "=l"(value) : "r"(remote) : "memory");
  return value;
}

// A row's share of each of its Blocks blocks of Threads threads: Per tokens a thread.
template <int64 N, int Blocks, int Threads> struct SampleCluster {
  static constexpr int Per = (int)((N + (int64)Blocks * Threads - 1) / ((int64)Blocks * Threads));
  static constexpr int64 Share = (int64)Per * Threads; // a block's tokens
  static_assert(Threads >= 256 && Threads % 32 == 0, "a thread a bin in sampleNextByte");
};

// The cluster's sum of each block's `local`, in rank order, given to every thread of the block
// (after the cluster barrier that makes them complete; thread 0 reads, the block shares it).
template <int Blocks>
__device__ unsigned long long clusterSum(const unsigned long long *local, unsigned ranks = Blocks) {
  __shared__ unsigned long long shared;
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    for (unsigned r = 0; r < ranks; ++r)
      sum += clusterLoad(local, r);
    shared = sum;
  }
  __syncthreads();
  unsigned long long sum = shared;
  __syncthreads(); // read before the next call writes it
  return sum;
}

// sampleGridThreshold over the cluster: the largest key t >= lowest whose keys (>= t) weigh at
// least target (4 rounds; this block's counts in bins[slot..slot+3], kept apart so that no round
// waits for the others to have read the last), and in kept what they weigh.
template <int Per, int Blocks>
__device__ unsigned sampleClusterThreshold(const unsigned (&key)[Per], const unsigned long long (&weight)[Per],
                                           bool weighted, unsigned lowest, unsigned long long target,
                                           unsigned long long (*bins)[256], int slot, unsigned long long &kept) {
  __shared__ unsigned long long row[256];
  unsigned prefix = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8, ++slot) {
    unsigned decided = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
#pragma unroll
    for (int k = 0; k < Per; ++k) {
      bool counted = key[k] >= lowest && (key[k] & decided) == prefix && weight[k] != ~0ull;
      sampleAddToBin(bins[slot], counted ? (int)((key[k] >> shift) & 255u) : -1, weighted ? weight[k] : 1ull);
    }
    clusterSync();
    if (threadIdx.x < 256) {
      unsigned long long sum = 0;
      for (unsigned r = 0; r < (unsigned)Blocks; ++r)
        sum += clusterLoad(&bins[slot][threadIdx.x], r);
      row[threadIdx.x] = sum;
    }
    __syncthreads();
    sampleNextByte(row, shift, target, prefix, above, kept); // (its barriers: row read before rewritten)
  }
  return prefix;
}

// The row's first largest logit and its index (argmaxBetter's order) over the cluster, given to
// every thread: each block's from its threads' runs, then the blocks' in rank order.
template <int64 N, int Per, int Blocks>
__device__ void sampleClusterBest(const float (&logit)[Per], int64 first, float &best, int &index) {
  __shared__ unsigned long long mine; // this block's best: the value's bits, then the index
  best = __int_as_float(0x7fc00000); // no candidate yet: NaN at no index
  index = 0x7fffffff;
#pragma unroll
  for (int k = 0; k < Per; ++k)
    if (first + k < N && argmaxBetter(logit[k], (int)(first + k), best, index)) {
      best = logit[k];
      index = (int)(first + k);
    }
  argmaxBlock(best, index);
  if (threadIdx.x == 0)
    mine = (unsigned long long)__float_as_uint(best) << 32 | (unsigned)index;
  clusterSync();
  if (threadIdx.x == 0)
    for (unsigned r = 0; r < (unsigned)Blocks; ++r) {
      unsigned long long theirs = clusterLoad(&mine, r);
      float v = __uint_as_float((unsigned)(theirs >> 32));
      int i = (int)(unsigned)theirs;
      if (argmaxBetter(v, i, best, index)) {
        best = v;
        index = i;
      }
    }
  sampleShareBest<1>(best, index);
}

// The sample op's token for each row, a cluster of Blocks blocks of Threads threads a row
// (blocks [row * Blocks, (row + 1) * Blocks), one cluster); the kernel declares
// __cluster_dims__(Blocks, 1, 1). No block leaves while another may still read its shared memory:
// each return follows a last cluster barrier.
template <int64 N, int Blocks, int Threads, int64 Stride>
__device__ void sampleCluster(const float *logits, const int *counters, const float *sampling, const int *seed,
                              int *out) {
  using C = SampleCluster<N, Blocks, Threads>;
  constexpr int Per = C::Per;
  __shared__ unsigned long long bins[kSampleGridSlots][256]; // this block's counts: 4 top-k rounds, 4 top-p
  __shared__ unsigned long long sums[2];                     // this block's kept weight, its draw weight
  for (int i = threadIdx.x; i < kSampleGridSlots * 256; i += Threads)
    bins[i / 256][i % 256] = 0; // (zero before sampleClusterBest's barrier: no other block adds here)
  const unsigned rank = clusterRank();
  const int64 row = blockIdx.x / Blocks, first = rank * C::Share + (int64)threadIdx.x * Per; // this thread's run
  float logit[Per];
#pragma unroll
  for (int k = 0; k < Per; ++k)
    logit[k] = first + k < N ? logits[row * N + first + k] : 0.0f;
  float best;
  int index;
  sampleClusterBest<N, Per, Blocks>(logit, first, best, index);
  const float temperature = sampling[0], topP = sampling[1];
  const int64 topK = samplingTopK(sampling[2], N);
  if (!(temperature > 0.0f)) { // every block returns here alike
    if (rank == 0 && threadIdx.x == 0)
      out[row] = index;
    clusterSync();
    return;
  }
  unsigned key[Per];
  unsigned long long weight[Per];
#pragma unroll
  for (int k = 0; k < Per; ++k) { // as sampleGrid: ~0 marks a place past the row
    key[k] = samplingKey(logit[k]);
    weight[k] = first + k < N ? samplingWeight(logit[k], best, temperature) : ~0ull;
  }
  unsigned long long kept = 0;
  unsigned lowest = 0;
  if (topK > 0)
    lowest = sampleClusterThreshold<Per, Blocks>(key, weight, false, 0u, (unsigned long long)topK, bins, 0, kept);
  unsigned long long own = sampleGridKept<Per>(key, weight, lowest), blockTotal = sampleBlockSum(own);
  if (threadIdx.x == 0)
    sums[0] = blockTotal;
  clusterSync();
  unsigned long long total = clusterSum<Blocks>(&sums[0]);
  if (total == 0) { // no finite logit (every block sees it)
    if (rank == 0 && threadIdx.x == 0)
      out[row] = index;
    clusterSync();
    return;
  }
  if (topP < 1.0f) {
    lowest =
        sampleClusterThreshold<Per, Blocks>(key, weight, true, lowest, samplingMassTarget(total, topP), bins, 5, total);
    own = sampleGridKept<Per>(key, weight, lowest);
  }
  unsigned long long draw = sampleRowDraw(seed, row, (long long)counters[row] - row * Stride, total);
  unsigned long long running = sampleExclusiveScan(own), mine = sampleBlockSum(own);
  if (threadIdx.x == 0)
    sums[1] = mine;
  clusterSync();
  running += clusterSum<Blocks>(&sums[1], rank); // the blocks before this one
  sampleLand<Per>(key, weight, lowest, running, own, draw, first, out + row);
  clusterSync();
}
