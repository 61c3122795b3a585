// LayerNorm and RMSNorm (Layer = false: no mean, no beta), the residual add fused with the
// norm that follows it, and their gradient. One block of 256 threads per row for the row
// kernels; statistics in double, added in a fixed order.
#pragma once

#include "common.cuh"

// out = (x - mean) * rstd * gamma (+ beta) over rows of D; x is read from `row`.
template <bool Layer, int64 D, typename Out>
__device__ void normalizeRow(const float *row, const float *gamma, const float *beta, Out dst, double eps) {
  __shared__ double shared[256];
  double sum = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) sum += row[j];
  double mean = Layer ? blockSum(sum, shared) / D : 0.0;
  double squares = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) squares += (row[j] - mean) * (row[j] - mean);
  float rstd = (float)(1.0 / sqrt(blockSum(squares, shared) / D + eps));
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    if (Layer)
      dst[j] = (row[j] - (float)mean) * rstd * gamma[j] + beta[j];
    else
      dst[j] = (row[j] - (float)mean) * rstd * gamma[j];
  }
}

template <bool Layer, int64 D, typename Out>
__device__ void layerNorm(const float *x, const float *gamma, const float *beta, Out out, double eps) {
  normalizeRow<Layer, D>(x + (int64)blockIdx.x * D, gamma, beta, out + (int64)blockIdx.x * D, eps);
}

// sum = x + y (the residual stream goes on), normed = the norm of sum.
template <bool Layer, int64 D, typename Out>
__device__ void residualNorm(const float *x, const float *y, const float *gamma, const float *beta,
                             float *sum, Out normed, double eps) {
  int64 base = (int64)blockIdx.x * D;
  for (int j = threadIdx.x; j < D; j += blockDim.x) sum[base + j] = x[base + j] + y[base + j];
  normalizeRow<Layer, D>(sum + base, gamma, beta, normed + base, eps);
}

// The gradient, launch 0 (one block per row): dx, and the row's mean and rstd into stats.
template <bool Layer, int64 D, typename Out>
__device__ void normBackwardRows(const float *dy, const float *x, const float *gamma, Out dx, float *stats,
                                 double eps) {
  __shared__ double shared[256];
  int64 base = (int64)blockIdx.x * D;
  double sum = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) sum += x[base + j];
  double mean = Layer ? blockSum(sum, shared) / D : 0.0;
  double squares = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) squares += (x[base + j] - mean) * (x[base + j] - mean);
  double rstd = 1.0 / sqrt(blockSum(squares, shared) / D + eps);
  double g = 0, gx = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    double gj = (double)dy[base + j] * gamma[j];
    g += gj;
    gx += gj * (x[base + j] - mean) * rstd;
  }
  double meanG = Layer ? blockSum(g, shared) / D : 0.0;
  double meanGX = blockSum(gx, shared) / D;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    double xhat = (x[base + j] - mean) * rstd;
    dx[base + j] = (float)(rstd * ((double)dy[base + j] * gamma[j] - meanG - xhat * meanGX));
  }
  if (threadIdx.x == 0) { stats[2 * blockIdx.x] = (float)mean; stats[2 * blockIdx.x + 1] = (float)rstd; }
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

// Launch 2: the chunks' partial sums in chunk order.
template <bool Layer, int64 D, int64 Rows, int64 Chunks, typename GammaOut, typename BetaOut>
__device__ void normBackwardColumns(float *stats, GammaOut dgamma, BetaOut dbeta) {
  double *partial = (double *)(stats + 2 * Rows);
  int64 j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= D) return;
  double dgammaSum = 0, dbetaSum = 0;
  for (int64 c = 0; c < Chunks; ++c) {
    dgammaSum += partial[2 * (c * D + j)];
    dbetaSum += partial[2 * (c * D + j) + 1];
  }
  dgamma[j] = (float)dgammaSum;
  if (Layer)
    dbeta[j] = (float)dbetaSum;
}
