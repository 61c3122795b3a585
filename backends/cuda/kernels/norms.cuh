// LayerNorm and RMSNorm (Layer = false: no mean, no beta), the residual add fused with the
// norm that follows it, and their gradient. The forward takes a row a warp, the gradient a chunk
// of rows a block; statistics in double, added in a fixed order.
#pragma once

#include "common.cuh"
#include "reduce.cuh"

// A row of at most 1024 features is taken by a warp (eight rows a 256-thread block), whose
// lanes meet in shuffles with no block-wide barrier; a wider row by a block of 256 threads. Either
// holds the row in registers (j = t + Threads c, t the thread's place in the warp or block):
// every load is issued before any store, instead of each store waiting on the loads before it (a
// one-row decode step's norms took 25 us, load after dependent load; gpt-1.3b's rows of 2048,
// read from memory a warp each pass after pass, took twice the time their bytes need).
enum { kNormRowsPerBlock = 8, kWideNormThreads = 256 };

template <int64 D>
struct RowInRegisters {
  static constexpr bool kByWarp = D <= 1024;
  static constexpr int kThreads = kByWarp ? 32 : kWideNormThreads;
  static constexpr int kPerLane = (int)((D + kThreads - 1) / kThreads);
};

// This warp's row (a block's, for wide rows), or -1 past the last.
template <int64 D, int64 Rows>
__device__ __forceinline__ int64 normRow() {
  int64 row = RowInRegisters<D>::kByWarp ? blockIdx.x * (int64)kNormRowsPerBlock + threadIdx.x / 32 : blockIdx.x;
  return row < Rows ? row : -1;
}

// The sum over the threads holding a row of D: its warp's, or its block's (a fixed tree either
// way; T has shuffleXor and +).
template <int64 D, typename T>
__device__ __forceinline__ T rowSum(T value) {
  auto add = [](T a, T b) { return a + b; };
  if constexpr (RowInRegisters<D>::kByWarp) {
    for (int offset = 16; offset > 0; offset >>= 1)
      value = add(value, shuffleXor(value, offset));
    return value;
  } else {
    __shared__ T shared[kWideNormThreads / 32];
    return blockReduce(value, shared, add);
  }
}

// out = (x - mean) * rstd * gamma (+ beta) over one row of D, by the threads holding it, from
// the values `v` each holds.
template <bool Layer, int64 D, typename Out>
__device__ void normalizeHeld(const float (&v)[RowInRegisters<D>::kPerLane], const float *gamma, const float *beta,
                              Out dst, double eps) {
  constexpr int Per = RowInRegisters<D>::kPerLane, Threads = RowInRegisters<D>::kThreads;
  const int lane = threadIdx.x % Threads;
  double sum = 0;
#pragma unroll
  for (int c = 0; c < Per; ++c)
    if (lane + Threads * c < D) sum += v[c];
  double mean = Layer ? rowSum<D>(sum) / D : 0.0;
  double squares = 0;
#pragma unroll
  for (int c = 0; c < Per; ++c)
    if (lane + Threads * c < D) squares += (v[c] - mean) * (v[c] - mean);
  float rstd = (float)(1.0 / sqrt(rowSum<D>(squares) / D + eps));
  float g[Per], bias[Per];
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int j = lane + Threads * c;
    g[c] = j < D ? gamma[j] : 0.0f;
    bias[c] = Layer && j < D ? beta[j] : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int j = lane + Threads * c;
    if (j >= D) continue;
    if (Layer)
      dst[j] = (v[c] - (float)mean) * rstd * g[c] + bias[c];
    else
      dst[j] = (v[c] - (float)mean) * rstd * g[c];
  }
}

// The values of `row` (D features; fp32, or stored in BF16) this thread holds, zero past D.
template <int64 D, typename In>
__device__ __forceinline__ void loadHeld(const In *row, float (&v)[RowInRegisters<D>::kPerLane]) {
  constexpr int Per = RowInRegisters<D>::kPerLane, Threads = RowInRegisters<D>::kThreads;
  const int lane = threadIdx.x % Threads;
#pragma unroll
  for (int c = 0; c < Per; ++c) v[c] = lane + Threads * c < D ? elementValue(row[lane + Threads * c]) : 0.0f;
}

template <bool Layer, int64 D, int64 Rows, typename Out>
__device__ void layerNorm(const float *x, const float *gamma, const float *beta, Out out, double eps) {
  int64 row = normRow<D, Rows>();
  if (row < 0)
    return;
  float v[RowInRegisters<D>::kPerLane];
  loadHeld<D>(x + row * D, v);
  normalizeHeld<Layer, D>(v, gamma, beta, out + row * D, eps);
}

// One row, held in registers by the threads that take it: sum = x + y (written where writeSum)
// and normed = the norm of it. x, y, sum and normed point at the row; y in fp32 or stored in
// BF16 (a product that only the norm reads, CudaProgram::bf16Rounding).
template <bool Layer, int64 D, typename SumOut, typename Out, typename Y>
__device__ void residualNormHeld(const float *x, const Y *y, const float *gamma, const float *beta, SumOut sum,
                                 bool writeSum, Out normed, double eps) {
  constexpr int Per = RowInRegisters<D>::kPerLane, Threads = RowInRegisters<D>::kThreads;
  const int lane = threadIdx.x % Threads;
  float a[Per], b[Per];
#pragma unroll
  for (int c = 0; c < Per; ++c) { // the two rows' loads interleaved
    int j = lane + Threads * c;
    a[c] = j < D ? x[j] : 0.0f;
    b[c] = j < D ? elementValue(y[j]) : 0.0f;
  }
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    a[c] += b[c];
    if (writeSum && lane + Threads * c < D) sum[lane + Threads * c] = a[c];
  }
  normalizeHeld<Layer, D>(a, gamma, beta, normed, eps);
}

// sum = x + y (the residual stream goes on), normed = the norm of sum.
template <bool Layer, int64 D, int64 Rows, typename Out, typename Y>
__device__ void residualNorm(const float *x, const Y *y, const float *gamma, const float *beta,
                             float *sum, Out normed, double eps) {
  int64 row = normRow<D, Rows>();
  if (row < 0)
    return;
  int64 base = row * D;
  residualNormHeld<Layer, D>(x + base, y + base, gamma, beta, sum + base, true, normed + base, eps);
}

// The gradient in three launches. Launch 0, the rows' statistics: each row held in registers by
// its warp (its block where wider than 1024) as the forward holds it, its mean and rstd, and
// the means of g = dy * gamma and of g * xhat, into scratch (four doubles a row).
struct NormGradSums {
  double squares, g, gx; // sum (x - mean)^2, sum g, sum g * (x - mean)
};
__device__ __forceinline__ NormGradSums shuffleXor(NormGradSums v, int offset) {
  return {shuffleXor(v.squares, offset), shuffleXor(v.g, offset), shuffleXor(v.gx, offset)};
}
__device__ __forceinline__ NormGradSums operator+(NormGradSums a, NormGradSums b) {
  return {a.squares + b.squares, a.g + b.g, a.gx + b.gx};
}

// dy in fp32, or stored in BF16 (a product that only the gradient reads, CudaProgram::bf16Rounding).
template <bool Layer, int64 D, int64 Rows, typename Dy>
__device__ void normBackwardStats(const Dy *dy, const float *x, const float *gamma, float *scratch, double eps) {
  int64 row = normRow<D, Rows>();
  if (row < 0)
    return;
  constexpr int Per = RowInRegisters<D>::kPerLane, Threads = RowInRegisters<D>::kThreads;
  const int lane = threadIdx.x % Threads;
  float xv[Per], dyv[Per];
  loadHeld<D>(x + row * D, xv);
  loadHeld<D>(dy + row * D, dyv);
  double sum = 0;
#pragma unroll
  for (int c = 0; c < Per; ++c) sum += xv[c]; // zero past D
  double mean = Layer ? rowSum<D>(sum) / D : 0.0;
  NormGradSums s = {0, 0, 0};
#pragma unroll
  for (int c = 0; c < Per; ++c) {
    int64 j = lane + Threads * c;
    if (j >= D) continue;
    double centered = xv[c] - mean, g = (double)dyv[c] * gamma[j];
    s.squares += centered * centered;
    s.g += g;
    s.gx += g * centered;
  }
  s = rowSum<D>(s);
  double rstd = 1.0 / sqrt(s.squares / D + eps);
  if (lane == 0) {
    double *stats = (double *)scratch + 4 * row;
    stats[0] = mean;
    stats[1] = rstd;
    stats[2] = Layer ? s.g / D : 0.0; // mean(g)
    stats[3] = s.gx * rstd / D;       // mean(g * xhat)
  }
}

// Launch 1, a block per chunk of Chunk rows and 256 threads' columns (four a thread where rows
// are multiples of four): dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) (plus dres, the
// residual stream's gradient the norm's input also receives, where Accumulate: the add after the
// norm's gradient, fused), and the chunk's sums of dy * xhat and dy per column (dgamma's and
// dbeta's partial sums, doubles, rows in order) after the statistics. Columns a thread: no
// barrier, x and dy read once here and once in launch 0. (A block a chunk of rows, each row's
// sums over the block's barriers, kept too few rows in flight: 1.5 TB/s at gpt-1.3b.)
template <int64 D>
struct NormGradColumns {
  static constexpr int kPerThread = D % 4 == 0 ? 4 : 1;
  static constexpr int64 kBlocks = (D + 256 * kPerThread - 1) / (256 * kPerThread);
};

// Sums (layer_norm_backward {dx_sums}): also each chunk's column sums of dx, a third double a
// feature (the bias gradient fuse-norm-bias-grad folds in: dx summed as it is written).
template <int64 D, int64 Rows, int64 Chunk, bool Accumulate, bool Sums, typename Out, typename Dy>
__device__ void normBackwardTile(const Dy *dy, const float *x, const float *gamma, const float *dres, Out dx,
                                 float *scratch) {
  constexpr int S = Sums ? 3 : 2; // doubles a feature and chunk
  constexpr int V = NormGradColumns<D>::kPerThread;
  constexpr int64 ColumnBlocks = NormGradColumns<D>::kBlocks;
  const double *stats = (const double *)scratch;
  double *partial = (double *)scratch + 4 * Rows;
  const int64 chunk = blockIdx.x / ColumnBlocks;
  const int64 j = ((blockIdx.x % ColumnBlocks) * blockDim.x + threadIdx.x) * V;
  if (j >= D)
    return;
  float g[V];
  double dgammaSum[V], dbetaSum[V], dxSum[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    g[v] = gamma[j + v];
    dgammaSum[v] = 0;
    dbetaSum[v] = 0;
    dxSum[v] = 0;
  }
  const int64 end = (chunk + 1) * Chunk < Rows ? (chunk + 1) * Chunk : Rows;
  // Rows four at a time: every load of the four issued before the first store (the stores
  // through dx may alias the loads as far as the compiler knows, which would keep each row's
  // loads waiting on the row before).
  constexpr int U = 4;
  for (int64 r0 = chunk * Chunk; r0 < end; r0 += U) {
    float xs[U][V], ds[U][V], rs[U][V];
    double st[U][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64 r = r0 + u < end ? r0 + u : r0, i = r * D + j; // past the end: a row read again, unused
      if constexpr (V == 4) {
        float4 a = load4(x, i), b = load4(dy, i), c = Accumulate ? load4(dres, i) : make_float4(0, 0, 0, 0);
        xs[u][0] = a.x, xs[u][1] = a.y, xs[u][2] = a.z, xs[u][3] = a.w;
        ds[u][0] = b.x, ds[u][1] = b.y, ds[u][2] = b.z, ds[u][3] = b.w;
        rs[u][0] = c.x, rs[u][1] = c.y, rs[u][2] = c.z, rs[u][3] = c.w;
      } else {
        xs[u][0] = x[i];
        ds[u][0] = elementValue(dy[i]);
        rs[u][0] = Accumulate ? dres[i] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) st[u][k] = stats[4 * r + k]; // mean, rstd, mean(g), mean(g * xhat)
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u >= end)
        break;
      float out[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        double xhat = (xs[u][v] - st[u][0]) * st[u][1];
        float grad = (float)(st[u][1] * ((double)ds[u][v] * g[v] - st[u][2] - xhat * st[u][3]));
        out[v] = Accumulate ? rs[u][v] + grad : grad;
        dgammaSum[v] += (double)ds[u][v] * xhat;
        dbetaSum[v] += ds[u][v];
        if (Sums)
          dxSum[v] += out[v];
      }
      const int64 i = (r0 + u) * D + j;
      if constexpr (V == 4)
        store4(dx, i, make_float4(out[0], out[1], out[2], out[3]));
      else
        dx[i] = out[0];
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) {
    partial[S * (chunk * D + j + v)] = dgammaSum[v];
    partial[S * (chunk * D + j + v) + 1] = dbetaSum[v];
    if (Sums)
      partial[S * (chunk * D + j + v) + 2] = dxSum[v];
  }
}

// Launch 2: the chunks' partial sums (reduce.cuh's columnTotals, 8 features a block).
template <bool Layer, int64 D, int64 Rows, int64 Chunks, bool Sums, typename GammaOut, typename BetaOut,
          typename SumOut>
__device__ void normBackwardColumns(const float *scratch, GammaOut dgamma, BetaOut dbeta, SumOut dsums) {
  const double *partial = (const double *)scratch + 4 * Rows;
  columnTotals<D, Chunks, Sums ? 3 : 2>(partial, [&](int k, int64 j, double total) {
    if (k == 0)
      dgamma[j] = (float)total;
    else if (k == 1) {
      if (Layer)
        dbeta[j] = (float)total;
    } else if (Sums)
      dsums[j] = (float)total;
  });
}
