// Matrix products of a few rows (a decode step's linear layers, M <= 64) against a weight
// [N, K] in BF16: out [M, N] = x [M, K] @ w^T (+ bias [N]) (then the GELU), BF16 operands and
// fp32 sums, as a gemm_dtype="bf16" GEMM computes them. Such a product reads the weight once and
// does little else; what bounds it is how many bytes of the weight are in flight, and the launch.
//   M <= 8:  on the CUDA cores (gemvBf16Rows), a warp per few output columns and slice of K
//            reads its weight in 16-byte loads and the rows of x (cached, every warp reads the
//            same) and meets in shuffles: one row's weight streams at 67-93% of the memory's
//            rate (gpt-1.3b's shapes on an H100), where cuBLASLt's split-K tiles for one row ran
//            at a seventh of it. The backend takes 2 rows and more to tensor cores where it can.
//   M <= 64: tensor cores (gemmRowsBf16): mma.sync over slices of K, every operand in 16-byte
//            loads straight into registers.
// Both load their first weights before they await the kernel before them (the weights are
// parameters, which no kernel of the step writes), so under programmatic launch the weight's
// reading overlaps the previous kernel's end.
#pragma once

#include "common.cuh"
#include "elementwise.cuh"
#include "norms.cuh"
#include "tensorcore.cuh"

// Eight consecutive elements of x at x + i (i a multiple of 8), as the GEMM reads them: fp32
// rounded to BF16, or stored in BF16 (common.cuh's unpack8 widens the 16 bytes loaded).
__device__ __forceinline__ void load8(const float *x, int64 i, float (&out)[8]) {
  float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
  out[0] = roundBf16(a.x), out[1] = roundBf16(a.y), out[2] = roundBf16(a.z), out[3] = roundBf16(a.w);
  out[4] = roundBf16(b.x), out[5] = roundBf16(b.y), out[6] = roundBf16(b.z), out[7] = roundBf16(b.w);
}
__device__ __forceinline__ void load8(const unsigned short *x, int64 i, float (&out)[8]) {
  unpack8(*(const uint4 *)(x + i), out);
}

// Element (r, n) of a product's output from its sum: the bias, then the GELU (an elementwise gelu
// after the product, fused: the same arithmetic) with the value before it into pre where that is
// not null (matmul_bias_gelu's second result).
template <int64 N, bool Bias, bool Gelu, typename Out>
__device__ __forceinline__ void writeProduct(Out out, float *pre, const float *bias, int64 r, int64 n, float sum) {
  float y = Bias ? sum + bias[n] : sum;
  out[r * N + n] = Gelu ? geluTanh(y) : y;
  if (Gelu && pre)
    pre[r * N + n] = y;
}

// The block's 8 warps are KS slices of K by 8 / KS groups of C output columns (a tile: 8 / KS * C
// columns; K / KS a multiple of 8: 16-byte rows). Each lane loads its columns' 16-byte pieces of
// its slice into registers first (C * K / KS / 256 loads), then the kernel awaits the one before
// it (awaitPreviousKernel: the weights are parameters, which no kernel of the step writes before
// it), so the weight's reading overlaps the previous kernel's end; Prologue (the fused norm) runs
// after that wait. A lane multiplies its pieces by the rows of x (cached: every warp reads the
// same), the warp meets in shuffles, and the slices' sums meet in shared memory in slice order
// (the same bits every run). C and KS (Gemv.cpp's gemvTile) trade the blocks that stream the
// weight against the loads each lane keeps in flight and the times x and the prologue are
// repeated (bench/gemv-decode.cu). The outputs as writeProduct writes them; with Swiglu (w [2N,
// K]: gate rows, then up rows) the warp takes rows n and N + n and writes swiglu's silu(gate) *
// up of the two sums (elementwise.cuh's swigluValue): SwiGLU's product, the [M, 2N] h never
// written. gemvBf16Rows gives a block a tile; gemvBf16RowsStrided a grid of any size its tiles
// in turn.
template <int64 N, int64 K, int C, int KS, bool Swiglu> struct GemvTiles {
  static_assert(8 % KS == 0 && K % (8 * KS) == 0, "whole 16-byte pieces in each slice");
  static constexpr int64 Slice = K / KS;
  static constexpr int Loads = (int)((Slice + 255) / 256), Rows = Swiglu ? 2 : 1, Columns = 8 / KS * C;
  static constexpr int64 Count = (N + Columns - 1) / Columns;
  using Pieces = uint4[C][Rows][Loads]; // a lane's pieces of its tile's weight

  // The lane's pieces of tile `tile`.
  static __device__ __forceinline__ void load(const unsigned short *w, int64 tile, Pieces &row) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int64 n0 = tile * Columns + warp / KS * C, k0 = warp % KS * Slice;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int i = 0; i < Loads; ++i) {
          int64 n = n0 + c, k = lane * 8 + 256 * i;
          row[c][r][i] = n < N && k < Slice ? *(const uint4 *)(w + (r * N + n) * K + k0 + k) : make_uint4(0, 0, 0, 0);
        }
  }

  // Tile `tile`'s outputs from the lanes' pieces and the M rows of x. With KS > 1 the slices meet
  // in shared memory: a block that takes another tile after this one syncs before it.
  template <int64 M, bool Bias, bool Gelu, typename X, typename Out>
  static __device__ __forceinline__ void multiply(const Pieces &row, int64 tile, const float *bias, Out out, const X *x,
                                                  float *pre) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slice = warp % KS;
    const int64 n0 = tile * Columns + warp / KS * C, k0 = slice * Slice;
    float acc[C][Rows][M] = {};
#pragma unroll
    for (int i = 0; i < Loads; ++i) {
      int64 k = lane * 8 + 256 * i;
      if (k >= Slice)
        break;
      float values[M][8];
#pragma unroll
      for (int m = 0; m < M; ++m)
        load8(x + m * K, k0 + k, values[m]);
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < Rows; ++r) {
          float weights[8];
          unpack8(row[c][r][i], weights);
#pragma unroll
          for (int m = 0; m < M; ++m)
#pragma unroll
            for (int e = 0; e < 8; ++e)
              acc[c][r][m] += weights[e] * values[m][e];
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < Rows; ++r)
#pragma unroll
        for (int m = 0; m < M; ++m)
          acc[c][r][m] = warpSum(acc[c][r][m]);
    // Lane m keeps row m's sums (every lane holds them all after the butterfly).
    float mine[C][Rows];
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < Rows; ++r) {
        mine[c][r] = acc[c][r][0];
#pragma unroll
        for (int m = 1; m < M; ++m)
          if (lane == m)
            mine[c][r] = acc[c][r][m];
      }
    auto write = [&](int64 m, int64 n, const float(&value)[Rows]) {
      if constexpr (Swiglu)
        out[m * N + n] = swigluValue(value[0], value[1]);
      else
        writeProduct<N, Bias, Gelu>(out, pre, bias, m, n, value[0]);
    };
    if constexpr (KS == 1) {
#pragma unroll
      for (int c = 0; c < C; ++c)
        if (lane < M && n0 + c < N)
          write(lane, n0 + c, mine[c]);
    } else {
      __shared__ float partial[KS][Columns][Rows][M];
      if (lane < M) {
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int r = 0; r < Rows; ++r)
            partial[slice][warp / KS * C + c][r][lane] = mine[c][r];
      }
      __syncthreads();
      for (int v = threadIdx.x; v < Columns * M; v += blockDim.x) {
        int column = v / M, m = v % M;
        int64 n = tile * Columns + column;
        if (n >= N)
          continue;
        float value[Rows];
#pragma unroll
        for (int r = 0; r < Rows; ++r) {
          value[r] = partial[0][column][r][m];
#pragma unroll
          for (int s = 1; s < KS; ++s)
            value[r] += partial[s][column][r][m];
        }
        write(m, n, value);
      }
    }
  }
};

template <int64 M, int64 N, int64 K, int C, int KS, bool Bias, bool Gelu, bool Swiglu, typename X, typename Out,
          typename Prologue>
__device__ void gemvBf16Rows(const unsigned short *w, const float *bias, Out out, Prologue prologue, const X *x,
                             float *pre = nullptr) {
  static_assert(!Swiglu || (!Bias && !Gelu), "SwiGLU's product has no bias or GELU");
  using Tiles = GemvTiles<N, K, C, KS, Swiglu>;
  typename Tiles::Pieces row;
  Tiles::load(w, blockIdx.x, row);
  awaitPreviousKernel();
  prologue();
  Tiles::template multiply<M, Bias, Gelu>(row, blockIdx.x, bias, out, x, pre);
}

// gemvBf16Rows's tiles over a grid of any size (Gemv.cpp gives it one wave where the tiles are
// many): block b takes tiles b, b + gridDim.x, ..., the first tile's weights loaded before the
// kernel awaits the one before it, each next tile's before this one multiplies (two tiles in
// flight a lane). Where the prologue is a fused norm, fewer blocks repeat it. The same sums in
// the same order as gemvBf16Rows at the same tile. gpt-1.3b's qkv and fc1 with their norm, one
// row, a tile of 4 columns in 2 slices of K over 4 blocks an SM: 11.1 -> 10.4 us and 14.5 ->
// 13.5 us on an H100 (tests/bench/gemv_waves.cu, BENCHMARKS.md session 52).
template <int64 M, int64 N, int64 K, int C, int KS, bool Bias, bool Gelu, bool Swiglu, typename X, typename Out,
          typename Prologue>
__device__ void gemvBf16RowsStrided(const unsigned short *w, const float *bias, Out out, Prologue prologue, const X *x,
                                    float *pre = nullptr) {
  static_assert(!Swiglu || (!Bias && !Gelu), "SwiGLU's product has no bias or GELU");
  using Tiles = GemvTiles<N, K, C, KS, Swiglu>;
  typename Tiles::Pieces cur, next;
  int64 tile = blockIdx.x;
  if (tile < Tiles::Count)
    Tiles::load(w, tile, cur);
  awaitPreviousKernel();
  prologue();
  for (; tile < Tiles::Count; tile += gridDim.x) {
    if (tile + gridDim.x < Tiles::Count)
      Tiles::load(w, tile + gridDim.x, next);
    Tiles::template multiply<M, Bias, Gelu>(cur, tile, bias, out, x, pre);
    if constexpr (KS > 1)
      __syncthreads(); // the slices' sums are read before the next tile writes them
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int r = 0; r < Tiles::Rows; ++r)
#pragma unroll
        for (int i = 0; i < Tiles::Loads; ++i)
          cur[c][r][i] = next[c][r][i];
  }
}

template <int64 M, int64 N, int64 K, int C, int KS, bool Bias, bool Gelu, typename X, typename Out>
__device__ void gemvBf16(const X *x, const unsigned short *w, const float *bias, Out out, float *pre) {
  gemvBf16Rows<M, N, K, C, KS, Bias, Gelu, false>(w, bias, out, [] {}, x, pre);
}

// gemvBf16's tiles over a grid of any size (gemvBf16RowsStrided).
template <int64 M, int64 N, int64 K, int C, int KS, bool Bias, bool Gelu, typename X, typename Out>
__device__ void gemvBf16Strided(const X *x, const unsigned short *w, const float *bias, Out out, float *pre) {
  gemvBf16RowsStrided<M, N, K, C, KS, Bias, Gelu, false>(
      w, bias, out, [] {}, x, pre);
}

// ---- 9 to 64 rows: tensor cores ----

// Eight consecutive elements of x at x + i (i a multiple of 8) as four BF16 pairs: one 16-byte
// load where x is stored in BF16, else two of fp32 rounded (cvt.rn, roundBf16's rounding).
__device__ __forceinline__ uint4 loadPairs8(const unsigned short *x, int64 i) { return *(const uint4 *)(x + i); }
__device__ __forceinline__ uint4 loadPairs8(const float *x, int64 i) {
  float4 a = *(const float4 *)(x + i), b = *(const float4 *)(x + i + 4);
  return make_uint4(packBf16(a.x, a.y), packBf16(a.z, a.w), packBf16(b.x, b.y), packBf16(b.z, b.w));
}

// gemmRowsBf16's shape: m16 tiles of rows, and the columns a block takes (8 warps: KSPLIT slices
// of K by 8 / KSPLIT groups of CG tiles of 8 columns).
template <int64 M>
constexpr int gemmRowTiles = (int)((M + 15) / 16);
template <int KSPLIT, int CG>
constexpr int gemmRowsColumns = 8 / KSPLIT * 8 * CG;

// A warp's sums of gemmRowsAccumulate given out: with one slice of K a block straight from its
// registers, else the slices' tiles summed in shared memory in slice order; emit(r, n, sum) for
// each row r < M and column n < N of the block's (column block `block`).
template <int64 M, int64 N, int KSPLIT, int RowTiles, int Columns, int CG, typename Emit>
__device__ __forceinline__ void gemmRowsEmit(const float (&acc)[CG][RowTiles][4], int64 block, int slice, int group,
                                             int g, int q, Emit emit) {
  if constexpr (KSPLIT == 1) {
    const int64 col0 = block * Columns + group * 8 * CG;
#pragma unroll
    for (int c = 0; c < CG; ++c)
#pragma unroll
      for (int i = 0; i < RowTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int64 r = 16 * i + 8 * (e / 2) + g, n = col0 + 8 * c + 2 * q + e % 2;
          if (r < M && n < N)
            emit(r, n, acc[c][i][e]);
        }
  } else {
    __shared__ float sums[KSPLIT][RowTiles * 16][Columns];
#pragma unroll
    for (int c = 0; c < CG; ++c)
#pragma unroll
      for (int i = 0; i < RowTiles; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          sums[slice][16 * i + 8 * (e / 2) + g][group * 8 * CG + 8 * c + 2 * q + e % 2] = acc[c][i][e];
    __syncthreads();
    for (int v = threadIdx.x; v < M * Columns; v += blockDim.x) {
      int r = v / Columns, c = v % Columns;
      int64 n = block * Columns + c;
      if (n >= N)
        continue;
      float sum = sums[0][r][c];
#pragma unroll
      for (int s = 1; s < KSPLIT; ++s) sum += sums[s][r][c];
      emit(r, n, sum);
    }
  }
}

// M <= 64 rows (m16 tiles, rows past M zero) of x [M, K] against w [N, K]: the sums over
// elements [kFirst, kFirst + Span) of K of column block `block`'s outputs, into each warp's acc
// (gemmRowsEmit gives them out); 256 threads. The block's 8 warps are KSPLIT slices of the span
// by 8 / KSPLIT groups of CG * 8 columns (a block takes 64 / KSPLIT * CG columns). Per 32
// elements of K, lane (g, q) loads 16 bytes of weight row g of each of its CG column tiles
// (elements 8q..8q+7: a tile's 8 rows in one 512-byte warp load) and 16 bytes of each x row
// g + 8i, and two m16n8k16 products a tile take them whole: the fragments' k slots (2q, 2q+1,
// 2q+8, 2q+9) hold elements 8q..8q+3 in the first product and 8q+4..8q+7 in the second, the same
// permutation of k for both operands, so the sum is the product's, with no shared memory or
// shuffle between. The rows of x a warp loads serve its CG tiles: a block reads all of x's
// span, so at 32 rows and more x's reads from L2 outweigh the weight's unless a block takes many
// columns. A lane holds the weights of 8 / CG steps of K at once and loads the next ones while
// these multiply. Every column's sum takes the same products in the same order whatever CG is.
// Prologue (the fused norm, which writes x) runs after the kernel awaits the one before it,
// before x is read.
template <int64 M, int64 N, int64 K, int64 Span, int KSPLIT, int CG, typename X, typename Prologue>
__device__ __forceinline__ void gemmRowsAccumulate(const X *x, const unsigned short *w, int64 block, int64 kFirst,
                                                   Prologue prologue, float (&acc)[CG][gemmRowTiles<M>][4]) {
  constexpr int Warps = 8, RowTiles = gemmRowTiles<M>, Columns = gemmRowsColumns<KSPLIT, CG>;
  constexpr int64 Steps = Span / KSPLIT / 32; // 32-element steps of K a warp takes
  constexpr int Group = 8 / CG;               // steps whose weights a lane holds at once
  static_assert(M <= 64 && Warps % KSPLIT == 0 && Span % (32 * KSPLIT) == 0, "9 to 64 rows, whole steps of K");
  static_assert(CG == 1 || CG == 2 || CG == 4 || CG == 8, "1, 2, 4 or 8 column tiles a warp");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int slice = warp % KSPLIT, group = warp / KSPLIT;
  const int64 col0 = block * Columns + group * 8 * CG;         // the warp's first column
  const int64 k0 = kFirst + slice * (Span / KSPLIT) + 8 * q; // the lane's first element of K
  const unsigned short *rows[CG];
  bool valid[CG];
#pragma unroll
  for (int c = 0; c < CG; ++c) {
    valid[c] = col0 + 8 * c + g < N;
    rows[c] = w + (valid[c] ? col0 + 8 * c + g : 0) * K + k0;
  }
  uint4 now[Group][CG], next[Group][CG];
  auto loadWeights = [&](uint4(&dst)[Group][CG], int64 first) {
#pragma unroll
    for (int j = 0; j < Group; ++j)
#pragma unroll
      for (int c = 0; c < CG; ++c)
        dst[j][c] = first + j < Steps && valid[c] ? *(const uint4 *)(rows[c] + 32 * (first + j)) : make_uint4(0, 0, 0, 0);
  };
  loadWeights(now, 0);
  awaitPreviousKernel();
  prologue();

  for (int64 first = 0; first < Steps; first += Group) {
    if (first + Group < Steps)
      loadWeights(next, first + Group);
#pragma unroll
    for (int j = 0; j < Group; ++j) {
      if (first + j >= Steps)
        break;
      const int64 k = k0 + 32 * (first + j);
      uint4 a[RowTiles][2]; // rows 16 i + g and 16 i + 8 + g
#pragma unroll
      for (int i = 0; i < RowTiles; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          int r = 16 * i + 8 * h + g;
          a[i][h] = r < M ? loadPairs8(x, r * K + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
      for (int i = 0; i < RowTiles; ++i) {
        const unsigned low[4] = {a[i][0].x, a[i][1].x, a[i][0].y, a[i][1].y};
        const unsigned high[4] = {a[i][0].z, a[i][1].z, a[i][0].w, a[i][1].w};
#pragma unroll
        for (int c = 0; c < CG; ++c) {
          mmaBf16(acc[c][i], low, now[j][c].x, now[j][c].y);
          mmaBf16(acc[c][i], high, now[j][c].z, now[j][c].w);
        }
      }
    }
    if (first + Group < Steps) {
#pragma unroll
      for (int j = 0; j < Group; ++j)
#pragma unroll
        for (int c = 0; c < CG; ++c) now[j][c] = next[j][c];
    }
  }
}

// out = x @ w^T (+ bias) (then the GELU) for M <= 64 rows, K a multiple of 32 * KSPLIT, a block
// per 64 / KSPLIT * CG columns (gemmRowsAccumulate over all of K); each output as writeProduct
// writes it.
template <int64 M, int64 N, int64 K, int KSPLIT, bool Bias, bool Gelu, int CG = 1, typename X, typename Out,
          typename Prologue = void (*)()>
__device__ void gemmRowsBf16(const X *x, const unsigned short *w, const float *bias, Out out, float *pre,
                             Prologue prologue = [] {}) {
  constexpr int RowTiles = gemmRowTiles<M>, Columns = gemmRowsColumns<KSPLIT, CG>;
  float acc[CG][RowTiles][4] = {};
  gemmRowsAccumulate<M, N, K, K, KSPLIT, CG>(x, w, blockIdx.x, 0, prologue, acc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  gemmRowsEmit<M, N, KSPLIT, RowTiles, Columns, CG>(acc, blockIdx.x, warp % KSPLIT, warp / KSPLIT, lane / 4, lane % 4,
                                                    [&](int64 r, int64 n, float sum) {
                                                      writeProduct<N, Bias, Gelu>(out, pre, bias, r, n, sum);
                                                    });
}

// gemmRowsBf16 with K split over Parts blocks a column block as well (block b: column block
// b / Parts, part b % Parts of K), for products whose columns are too few to give every
// multiprocessor a block once a block takes enough of them to read x seldom (fc2's shape: K
// four times N). Each block writes its part's sums to partial ([Parts, M, N] floats); the last
// block of a column block to finish (counted in done, a zeroed buffer of one counter a column
// block, which it zeroes again) sums the parts in part order (the same bits every run) and
// writes each output as writeProduct does.
// No lowering takes it: tests/bench/gemm_rows.cu times it alone, and the decode step was
// slower with it at 32 rows (BENCHMARKS.md, session 53).
template <int64 M, int64 N, int64 K, int KSPLIT, int CG, int Parts, bool Bias, bool Gelu, typename X, typename Out>
__device__ void gemmRowsPartsBf16(const X *x, const unsigned short *w, const float *bias, Out out, float *pre,
                                  float *partial, unsigned *done) {
  constexpr int RowTiles = gemmRowTiles<M>, Columns = gemmRowsColumns<KSPLIT, CG>;
  static_assert(K % Parts == 0, "whole parts of K");
  const int64 block = blockIdx.x / Parts, part = blockIdx.x % Parts;
  float acc[CG][RowTiles][4] = {};
  gemmRowsAccumulate<M, N, K, K / Parts, KSPLIT, CG>(x, w, block, part * (K / Parts), [] {}, acc);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  gemmRowsEmit<M, N, KSPLIT, RowTiles, Columns, CG>(acc, block, warp % KSPLIT, warp / KSPLIT, lane / 4, lane % 4,
                                                    [&](int64 r, int64 n, float sum) {
                                                      partial[(part * M + r) * N + n] = sum;
                                                    });
  __shared__ bool last;
  __threadfence(); // the part's sums visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done + block, 1u) == Parts - 1;
    if (last)
      done[block] = 0; // for the next launch
  }
  __syncthreads();
  if (!last)
    return;
  __threadfence();
  for (int v = threadIdx.x; v < M * Columns; v += blockDim.x) {
    int64 r = v / Columns, n = block * Columns + v % Columns;
    if (n >= N)
      continue;
    float sum = __ldcg(partial + r * N + n); // from L2: never a stale L1 line
#pragma unroll
    for (int p = 1; p < Parts; ++p) sum += __ldcg(partial + (p * M + r) * N + n);
    writeProduct<N, Bias, Gelu>(out, pre, bias, r, n, sum);
  }
}

// residual_norm_linear: out = act(norm(a + b) @ w^T (+ bias)) over M <= 8 rows of K features
// (act: the GELU, or SwiGLU of the product's [gate | up] halves, N the outputs)
// (M K <= 16384: their BF16 copy in 32 KB of shared memory), and sum = a + b. Each block takes
// the sum and the norm of every row into shared memory in BF16, the operand the product reads,
// as residualNorm's residualNormHeld takes them (rows of at most 1024 by a warp each, wider ones
// by the whole block in turn, as its wide rows), and block 0 writes the sums (the residual
// stream); then the product as gemvBf16 (or gemvBf16RowsStrided's grid with Strided), or with
// MmaKSplit as gemmRowsBf16 in that many slices of K. The same values as residual_norm, the product and the gelu one
// after the other: a decode step's norm costs no launch of its own.
template <bool Layer, int64 M, int64 N, int64 K, int C, int KS, bool Bias, bool Gelu, bool Swiglu, int MmaKSplit = 0,
          bool Strided = false, typename SumOut, typename Out>
__device__ void residualNormGemvBf16(const float *a, const float *b, const float *gamma, const float *beta,
                                     const unsigned short *w, const float *bias, SumOut sum, Out out, double eps) {
  static_assert(M <= 8 && M * K <= 16384 && K % 8 == 0, "a few rows whose BF16 copy fits in 32 KB");
  static_assert(RowInRegisters<K>::kByWarp || kWideNormThreads == 256, "the GEMV's 256 threads hold a wide row");
  __shared__ __align__(16) unsigned short normed[M * K];
  auto normalise = [&] {
    if constexpr (RowInRegisters<K>::kByWarp) {
      const int64 warp = threadIdx.x / 32;
      if (warp < M)
        residualNormHeld<Layer, K>(a + warp * K, b + warp * K, gamma, beta, sum + warp * K, blockIdx.x == 0,
                                   Bf16Out{normed + warp * K}, eps);
    } else {
#pragma unroll 1
      for (int64 m = 0; m < M; ++m)
        residualNormHeld<Layer, K>(a + m * K, b + m * K, gamma, beta, sum + m * K, blockIdx.x == 0,
                                   Bf16Out{normed + m * K}, eps);
    }
    __syncthreads();
  };
  if constexpr (MmaKSplit > 0)
    gemmRowsBf16<M, N, K, MmaKSplit, Bias, Gelu>((const unsigned short *)normed, w, bias, out, nullptr, normalise);
  else if constexpr (Strided)
    gemvBf16RowsStrided<M, N, K, C, KS, Bias, Gelu, Swiglu>(w, bias, out, normalise, (const unsigned short *)normed);
  else
    gemvBf16Rows<M, N, K, C, KS, Bias, Gelu, Swiglu>(w, bias, out, normalise, (const unsigned short *)normed);
}
