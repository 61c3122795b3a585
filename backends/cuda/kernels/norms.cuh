// LayerNorm and RMSNorm (Layer = false: no mean, no beta), the residual add fused with the
// norm that follows it, and their gradient. One block of 256 threads per row for the row
// kernels; statistics in double, added in a fixed order.
#pragma once

#include "common.cuh"
#include "reduce.cuh"

// A warp takes a row (eight rows a 256-thread block): its lanes read the row 32 elements at a
// time and meet in shuffles, with no block-wide barrier between the passes.
enum { kNormRowsPerBlock = 8 };

// This warp's row, or -1 past the last.
template <int64 Rows>
__device__ __forceinline__ int64 normRow() {
  int64 row = blockIdx.x * (int64)kNormRowsPerBlock + threadIdx.x / 32;
  return row < Rows ? row : -1;
}

__device__ __forceinline__ double warpSumDouble(double value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// A row's elements each lane holds in registers (j = lane + 32 c), where rows are short enough
// (D <= 1024): every load is issued before any store, instead of each store waiting on the loads
// before it (a one-row decode step's norms took 25 us, load after dependent load).
template <int64 D>
struct RowInRegisters {
  static constexpr bool kHeld = D <= 1024;
  static constexpr int kPerLane = (int)((D + 31) / 32);
};

// out = (x - mean) * rstd * gamma (+ beta) over one row of D, by its warp, from the values `v`
// its lanes hold; the same arithmetic, in the same order, as normalizeRow.
template <bool Layer, int64 D, typename Out>
__device__ void normalizeHeld(const float (&v)[RowInRegisters<D>::kPerLane], const float *gamma, const float *beta,
                              Out dst, double eps) {
  constexpr int Per = RowInRegisters<D>::kPerLane;
  const int lane = threadIdx.x % 32;
  double sum = 0;
#pragma unroll
  for (int c = 0; c < Per; ++c)
    if (lane + 32 * c < D) sum += v[c];
  double mean = Layer ? warpSumDouble(sum) / D : 0.0;
  double squares = 0;
#pragma unroll
  for (int c = 0; c < Per; ++c)
    if (lane + 32 * c < D) squares += (v[c] - mean) * (v[c] - mean);
  float rstd = (float)(1.0 / sqrt(warpSumDouble(squares) / D + eps));
  float g[Per], bias[Per];
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int j = lane + 32 * c;
    g[c] = j < D ? gamma[j] : 0.0f;
    bias[c] = Layer && j < D ? beta[j] : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int j = lane + 32 * c;
    if (j >= D) continue;
    if (Layer)
      dst[j] = (v[c] - (float)mean) * rstd * g[c] + bias[c];
    else
      dst[j] = (v[c] - (float)mean) * rstd * g[c];
  }
}

// out = (x - mean) * rstd * gamma (+ beta) over one row of D, by its warp; x is read from `row`.
template <bool Layer, int64 D, typename Out>
__device__ void normalizeRow(const float *row, const float *gamma, const float *beta, Out dst, double eps) {
  const int lane = threadIdx.x % 32;
  if constexpr (RowInRegisters<D>::kHeld) {
    float v[RowInRegisters<D>::kPerLane];
#pragma unroll
    for (int c = 0; c < RowInRegisters<D>::kPerLane; ++c) v[c] = lane + 32 * c < D ? row[lane + 32 * c] : 0.0f;
    normalizeHeld<Layer, D>(v, gamma, beta, dst, eps);
  } else {
    double sum = 0;
    for (int j = lane; j < D; j += 32) sum += row[j];
    double mean = Layer ? warpSumDouble(sum) / D : 0.0;
    double squares = 0;
    for (int j = lane; j < D; j += 32) squares += (row[j] - mean) * (row[j] - mean);
    float rstd = (float)(1.0 / sqrt(warpSumDouble(squares) / D + eps));
    for (int j = lane; j < D; j += 32) {
      if (Layer)
        dst[j] = (row[j] - (float)mean) * rstd * gamma[j] + beta[j];
      else
        dst[j] = (row[j] - (float)mean) * rstd * gamma[j];
    }
  }
}

template <bool Layer, int64 D, int64 Rows, typename Out>
__device__ void layerNorm(const float *x, const float *gamma, const float *beta, Out out, double eps) {
  int64 row = normRow<Rows>();
  if (row >= 0)
    normalizeRow<Layer, D>(x + row * D, gamma, beta, out + row * D, eps);
}

// One row by its warp, held in registers (D <= 1024): sum = x + y (written where writeSum) and
// normed = the norm of it. x, y, sum and normed point at the row.
template <bool Layer, int64 D, typename SumOut, typename Out>
__device__ void residualNormHeld(const float *x, const float *y, const float *gamma, const float *beta, SumOut sum,
                                 bool writeSum, Out normed, double eps) {
  constexpr int Per = RowInRegisters<D>::kPerLane;
  const int lane = threadIdx.x % 32;
  float a[Per], b[Per];
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int j = lane + 32 * c;
    a[c] = j < D ? x[j] : 0.0f;
    b[c] = j < D ? y[j] : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    a[c] += b[c];
    if (writeSum && lane + 32 * c < D) sum[lane + 32 * c] = a[c];
  }
  normalizeHeld<Layer, D>(a, gamma, beta, normed, eps);
}

// sum = x + y (the residual stream goes on), normed = the norm of sum.
template <bool Layer, int64 D, int64 Rows, typename Out>
__device__ void residualNorm(const float *x, const float *y, const float *gamma, const float *beta,
                             float *sum, Out normed, double eps) {
  int64 row = normRow<Rows>();
  if (row < 0)
    return;
  int64 base = row * D;
  if constexpr (RowInRegisters<D>::kHeld) {
    residualNormHeld<Layer, D>(x + base, y + base, gamma, beta, sum + base, true, normed + base, eps);
  } else {
    for (int j = threadIdx.x % 32; j < D; j += 32) sum[base + j] = x[base + j] + y[base + j];
    normalizeRow<Layer, D>(sum + base, gamma, beta, normed + base, eps); // each lane reads its own sums
  }
}

// The gradient, launch 0 (a warp per row): dx (plus dres, the residual stream's gradient the
// norm's input also receives, where Accumulate: the add after the norm's gradient, fused), and
// the row's mean and rstd into stats. (Rows held in registers, as the forward holds them, took
// 151 registers with these double sums unrolled: one block an SM, 3.5 times slower.)
template <bool Layer, int64 D, int64 Rows, bool Accumulate, typename Out>
__device__ void normBackwardRows(const float *dy, const float *x, const float *gamma, const float *dres, Out dx,
                                 float *stats, double eps) {
  int64 row = normRow<Rows>();
  if (row < 0)
    return;
  const int lane = threadIdx.x % 32;
  int64 base = row * D;
  double sum = 0;
  for (int j = lane; j < D; j += 32) sum += x[base + j];
  double mean = Layer ? warpSumDouble(sum) / D : 0.0;
  double squares = 0;
  for (int j = lane; j < D; j += 32) squares += (x[base + j] - mean) * (x[base + j] - mean);
  double rstd = 1.0 / sqrt(warpSumDouble(squares) / D + eps);
  double g = 0, gx = 0; // sum dy * gamma, sum dy * gamma * xhat
  for (int j = lane; j < D; j += 32) {
    double gj = (double)dy[base + j] * gamma[j];
    g += gj;
    gx += gj * (x[base + j] - mean) * rstd;
  }
  double meanG = Layer ? warpSumDouble(g) / D : 0.0;
  double meanGX = warpSumDouble(gx) / D;
  for (int j = lane; j < D; j += 32) {
    double xhat = (x[base + j] - mean) * rstd;
    float grad = (float)(rstd * ((double)dy[base + j] * gamma[j] - meanG - xhat * meanGX));
    if constexpr (Accumulate)
      dx[base + j] = dres[base + j] + grad;
    else
      dx[base + j] = grad;
  }
  if (lane == 0) { stats[2 * row] = (float)mean; stats[2 * row + 1] = (float)rstd; }
}

// Launch 1: dgamma and dbeta summed over chunks of Chunk rows, a thread per feature
// (ColumnBlocks blocks across the features, for each chunk), into doubles after the stats.
template <int64 D, int64 Rows, int64 ColumnBlocks, int64 Chunk>
__device__ void normBackwardPartials(const float *dy, const float *x, float *stats) {
  double *partial = (double *)(stats + 2 * Rows);
  int64 chunk = blockIdx.x / ColumnBlocks, j = (blockIdx.x % ColumnBlocks) * blockDim.x + threadIdx.x;
  if (j >= D) return;
  double dgammaSum = 0, dbetaSum = 0;
  for (int64 r = chunk * Chunk; r < Rows && r < (chunk + 1) * Chunk; ++r) {
    double xhat = ((double)x[r * D + j] - stats[2 * r]) * stats[2 * r + 1];
    dgammaSum += (double)dy[r * D + j] * xhat;
    dbetaSum += dy[r * D + j];
  }
  partial[2 * (chunk * D + j)] = dgammaSum;
  partial[2 * (chunk * D + j) + 1] = dbetaSum;
}

// Launch 2: the chunks' partial sums (reduce.cuh's columnTotal, 32 features a block).
template <bool Layer, int64 D, int64 Rows, int64 Chunks, typename GammaOut, typename BetaOut>
__device__ void normBackwardColumns(float *stats, GammaOut dgamma, BetaOut dbeta) {
  __shared__ double shared[kTotalParts][32];
  const double *partial = (const double *)(stats + 2 * Rows);
  int64 j = totalColumn();
  double dgammaSum = columnTotal<D, Chunks, 2>(partial, j, 0, shared);
  double dbetaSum = columnTotal<D, Chunks, 2>(partial, j, 1, shared);
  if (threadIdx.x >= 32 || j >= D) return;
  dgamma[j] = (float)dgammaSum;
  if (Layer)
    dbeta[j] = (float)dbetaSum;
}
