// Reductions over many elements in two launches, so that the whole GPU takes the first: column
// sums (a broadcast's gradient) and the sum of squares (the gradient norm). Partial sums in
// double, then the partials in a fixed order: the same bits every run, no atomics.
#pragma once

#include "common.cuh"

// Column sums of x viewed as [Repeats, Period]. Launch 0: one thread per column sums a chunk
// of Chunk rows into scratch (ColumnBlocks blocks across the columns, for each chunk).
template <int64 Period, int64 Repeats, int64 ColumnBlocks, int64 Chunk>
__device__ void columnSumPartials(const float *x, float *scratch) {
  double *partial = (double *)scratch;
  int64 chunk = blockIdx.x / ColumnBlocks, column = (blockIdx.x % ColumnBlocks) * blockDim.x + threadIdx.x;
  if (column >= Period) return;
  double sum = 0;
  for (int64 r = chunk * Chunk; r < Repeats && r < (chunk + 1) * Chunk; ++r) sum += x[r * Period + column];
  partial[chunk * Period + column] = sum;
}

// Launch 1: the chunks in order.
template <int64 Period, int64 Chunks, typename Out>
__device__ void columnSumTotals(Out out, const float *scratch) {
  const double *partial = (const double *)scratch;
  int64 column = blockIdx.x * blockDim.x + threadIdx.x;
  if (column >= Period) return;
  double sum = 0;
  for (int64 c = 0; c < Chunks; ++c) sum += partial[c * Period + column];
  out[column] = (float)sum;
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
