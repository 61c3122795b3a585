// The token embedding's lookup and its gradient. The gradient adds each table row's positions
// in position order, as the CPU does, without atomics.
#pragma once

#include "common.cuh"

// out[p, :] = table[ids[p], :]; an id outside the table gives a zero row.
template <int64 Count, int64 Vocab, int64 Dim, typename Out>
__device__ void embedding(const float *table, const int *ids, Out out) {
  FOR_EACH_ELEMENT(i, Count) {
    int id = ids[i / Dim];
    out[i] = (id >= 0 && id < Vocab) ? table[(int64)id * Dim + i % Dim] : 0.0f;
  }
}

// One block (256 threads) per Rows table rows (a block reads every id once for all its rows).
// The block finds, 256 ids at a time, the positions that read one of its rows (compacted in
// position order with a prefix sum), then each thread adds those positions' rows of dy into its
// Columns columns of the row they read: position order for every row, as on the CPU, and no
// atomics.
template <int64 Dim, int64 Positions, int64 Columns, int64 Vocab, int Rows, typename Out>
__device__ void embeddingBackward(const float *dy, const int *ids, Out dtable) {
  __shared__ int hits[256];
  __shared__ int found[256];
  __shared__ int foundRow[256];
  int64 first = (int64)blockIdx.x * Rows;
  float acc[Rows][Columns];
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Columns; ++c) acc[r][c] = 0.0f;
  for (int64 base = 0; base < Positions; base += 256) {
    int64 p = base + threadIdx.x;
    int64 row = p < Positions ? ids[p] - first : -1;
    int hit = (row >= 0 && row < Rows) ? 1 : 0;
    hits[threadIdx.x] = hit;
    __syncthreads();
    for (int stride = 1; stride < 256; stride <<= 1) { // inclusive prefix sum
      int add = threadIdx.x >= stride ? hits[threadIdx.x - stride] : 0;
      __syncthreads();
      hits[threadIdx.x] += add;
      __syncthreads();
    }
    if (hit) {
      found[hits[threadIdx.x] - 1] = (int)p;
      foundRow[hits[threadIdx.x] - 1] = (int)row;
    }
    int count = hits[255];
    __syncthreads();
    for (int k = 0; k < count; ++k)
#pragma unroll
      for (int r = 0; r < Rows; ++r)
        if (foundRow[k] == r)
          for (int c = 0; c < Columns; ++c) {
            int col = threadIdx.x + c * 256;
            if (col < Dim) acc[r][c] += dy[(int64)found[k] * Dim + col];
          }
    __syncthreads();
  }
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Columns; ++c) {
      int col = threadIdx.x + c * 256;
      if (first + r < Vocab && col < Dim) dtable[(first + r) * Dim + col] = acc[r][c];
    }
}
