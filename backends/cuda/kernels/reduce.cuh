// Reductions over many elements in two launches, so that the whole GPU takes the first: column
// sums (a broadcast's gradient) and the sum of squares (the gradient norm). Partial sums in
// double, then the partials in a fixed order: the same bits every run, no atomics.
#pragma once

#include "common.cuh"

// Cols adjacent elements of a row from p, fp32 or BF16 (Cols 4: one load4, p then a multiple
// of 4 elements into an aligned buffer).
template <int Cols, typename In> __device__ __forceinline__ void loadColumns(const In *p, float (&v)[Cols]) {
  if constexpr (Cols == 4) {
    float4 q = load4(p, 0);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
    for (int c = 0; c < Cols; ++c) v[c] = elementValue(p[c]);
  }
}

// Column sums of x viewed as [Repeats, Period] (fp32, or stored in BF16). Launch 0: each thread
// sums Cols adjacent columns (4 where Period is a multiple of 4) down a chunk of Chunk rows into
// scratch (ColumnBlocks blocks across the columns, for each chunk). Eight rows' loads are issued
// before their adds; each column's sum still takes the rows in order.
template <int64 Period, int64 Repeats, int64 ColumnBlocks, int64 Chunk, int Cols, typename In>
__device__ void columnChunkSums(const In *x, double *partial) {
  constexpr int Unroll = 8;
  int64 chunk = blockIdx.x / ColumnBlocks;
  int64 column = ((blockIdx.x % ColumnBlocks) * blockDim.x + threadIdx.x) * Cols;
  if (column >= Period) return;
  int64 r = chunk * Chunk, last = r + Chunk < Repeats ? r + Chunk : Repeats;
  double sum[Cols] = {};
  for (; r + Unroll <= last; r += Unroll) {
    float v[Unroll][Cols];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) loadColumns<Cols>(x + (r + u) * Period + column, v[u]);
#pragma unroll
    for (int u = 0; u < Unroll; ++u)
#pragma unroll
      for (int c = 0; c < Cols; ++c) sum[c] += v[u][c];
  }
  for (; r < last; ++r) {
    float v[Cols];
    loadColumns<Cols>(x + r * Period + column, v);
#pragma unroll
    for (int c = 0; c < Cols; ++c) sum[c] += v[c];
  }
#pragma unroll
  for (int c = 0; c < Cols; ++c) partial[chunk * Period + column + c] = sum[c];
}
template <int64 Period, int64 Repeats, int64 ColumnBlocks, int64 Chunk, typename In>
__device__ void columnSumPartials(const In *x, float *scratch) {
  constexpr int Cols = Period % 4 == 0 ? 4 : 1;
  columnChunkSums<Period, Repeats, ColumnBlocks, Chunk, Cols>(x, (double *)scratch);
}

// The chunks' partial sums, S interleaved sums a column and chunk (partial[S (c Period + j) + k]),
// 8 columns a block of 256 threads: thread t takes column t % 8 and part t / 8 of the chunks
// (chunks p, p + 32, ...), its S sums at once; then each of the block's 8 S (column, sum) pairs
// adds its 32 parts in order: a fixed tree, the same bits every run. 32 columns a block left most
// multiprocessors idle (24 blocks at 768 columns: 18 us for 9 MB); a block of 8 has them all
// from 1056 columns. write(k, j, total) stores sum k of column j.
enum { kColumnsPerTotalBlock = 8, kTotalParts = 32 };

template <int64 Period, int64 Chunks, int S, typename Write>
__device__ void columnTotals(const double *partial, Write write) {
  __shared__ double shared[kTotalParts][S][kColumnsPerTotalBlock];
  const int slot = threadIdx.x % kColumnsPerTotalBlock, part = threadIdx.x / kColumnsPerTotalBlock;
  const int64 column = (int64)blockIdx.x * kColumnsPerTotalBlock + slot;
  double sum[S];
#pragma unroll
  for (int k = 0; k < S; ++k) sum[k] = 0;
  if (column < Period)
#pragma unroll 4
    for (int64 c = part; c < Chunks; c += kTotalParts)
#pragma unroll
      for (int k = 0; k < S; ++k) sum[k] += partial[S * (c * Period + column) + k];
#pragma unroll
  for (int k = 0; k < S; ++k) shared[part][k][slot] = sum[k];
  __syncthreads();
  if (threadIdx.x >= S * kColumnsPerTotalBlock)
    return;
  const int k = threadIdx.x / kColumnsPerTotalBlock;
  const int64 j = (int64)blockIdx.x * kColumnsPerTotalBlock + threadIdx.x % kColumnsPerTotalBlock;
  if (j >= Period)
    return;
  double total = 0;
#pragma unroll
  for (int p = 0; p < kTotalParts; ++p) total += shared[p][k][threadIdx.x % kColumnsPerTotalBlock];
  write(k, j, total);
}

// Launch 1: each column's chunks (columnTotals).
template <int64 Period, int64 Chunks, typename Out>
__device__ void columnSumTotals(Out out, const float *scratch) {
  columnTotals<Period, Chunks, 1>((const double *)scratch, [&](int, int64 j, double total) { out[j] = (float)total; });
}

// Sum of squares of Count elements. Launch 0: each block sums a contiguous range of PerBlock
// (a fixed tree inside it) into scratch.
template <int64 Count, int64 PerBlock>
__device__ void sumSquaresPartials(const float *x, float *scratch) {
  __shared__ double shared[256];
  double *partial = (double *)scratch;
  int64 begin = blockIdx.x * PerBlock, end = begin + PerBlock < Count ? begin + PerBlock : Count;
  double sum = 0;
  for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) sum += (double)x[i] * x[i];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Launch 1, one block: the Blocks partial sums.
template <int64 Blocks>
__device__ void sumSquaresTotal(float *out, const float *scratch) {
  __shared__ double shared[256];
  const double *partial = (const double *)scratch;
  double sum = 0;
  for (int i = threadIdx.x; i < Blocks; i += blockDim.x) sum += partial[i];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) out[0] = (float)sum;
}
