// Kernels that move elements without arithmetic: transposes (of floats, or of FP8 bytes),
// concatenation, slices and zero padding along one axis.
#pragma once

#include "common.cuh"

// [..., Rows, Cols] -> [..., Cols, Rows] through shared memory in 32 x 32 tiles, so that reads
// and writes both run along rows. One block per tile; TilesC tiles across a matrix's columns,
// Tiles tiles a matrix. 256 threads.
template <typename T, int64 Rows, int64 Cols, int64 Tiles, int64 TilesC, typename Out>
__device__ void transposeLastTwo(const T *x, Out out) {
  __shared__ T tile[32][33];
  int64 b = blockIdx.x / Tiles, tileR = (blockIdx.x % Tiles) / TilesC, tileC = blockIdx.x % TilesC;
  const T *src = x + b * Rows * Cols;
  auto dst = out + b * Rows * Cols;
  int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int j = ty; j < 32; j += 8) {
    int64 r = tileR * 32 + j, c = tileC * 32 + tx;
    if (r < Rows && c < Cols) tile[j][tx] = src[r * Cols + c];
  }
  __syncthreads();
  for (int j = ty; j < 32; j += 8) {
    int64 c = tileC * 32 + j, r = tileR * 32 + tx;
    if (r < Rows && c < Cols) dst[c * Rows + r] = tile[tx][j];
  }
}

// FP8 bytes [..., Rows, Cols] -> [..., Cols, Rows] (Rows and Cols multiples of 16) in 64 x 64
// tiles, sixteen bytes a load and a store (the 32 x 32 tiles above move one byte a thread).
// One block of 256 threads per tile; TilesC tiles across a matrix's columns, Tiles a matrix.
template <int64 Rows, int64 Cols, int64 Tiles, int64 TilesC>
__device__ void transposeBytes(const unsigned char *x, unsigned char *out) {
  __shared__ __align__(16) unsigned char tile[64][80];
  int64 b = blockIdx.x / Tiles, tileR = (blockIdx.x % Tiles) / TilesC, tileC = blockIdx.x % TilesC;
  const unsigned char *src = x + b * Rows * Cols;
  unsigned char *dst = out + b * Rows * Cols;
  int row = threadIdx.x / 4, part = threadIdx.x % 4; // 64 rows of four 16-byte parts
  int64 r = tileR * 64 + row, c = tileC * 64 + part * 16;
  if (r < Rows && c < Cols) *(uint4 *)&tile[row][part * 16] = *(const uint4 *)(src + r * Cols + c);
  __syncthreads();
  int64 outRow = tileC * 64 + row, outCol = tileR * 64 + part * 16; // row: an input column
  if (outRow < Cols && outCol < Rows) {
    unsigned w[4];
    for (int k = 0; k < 4; ++k)
      w[k] = tile[part * 16 + 4 * k][row] | tile[part * 16 + 4 * k + 1][row] << 8 |
             tile[part * 16 + 4 * k + 2][row] << 16 | (unsigned)tile[part * 16 + 4 * k + 3][row] << 24;
    *(uint4 *)(dst + outRow * Rows + outCol) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Any other permutation: out[o] = x[offset(o)]. ExtentsAndStrides lists, for each output
// dimension from the first, its extent and the input stride it walks.
template <typename T, int64 Count, int64... ExtentsAndStrides, typename Out>
__device__ void permute(const T *x, Out out) {
  constexpr int64 dims[] = {ExtentsAndStrides...};
  constexpr int rank = sizeof...(ExtentsAndStrides) / 2;
  FOR_EACH_ELEMENT(i, Count) {
    int64 rest = i, offset = 0;
#pragma unroll
    for (int d = rank - 1; d >= 0; --d) {
      offset += (rest % dims[2 * d]) * dims[2 * d + 1];
      rest /= dims[2 * d];
    }
    out[i] = x[offset];
  }
}

// out's axis holds the operands' extents of it one after another; Inner elements follow the
// axis, Along is its extent in the output.
template <int64 Count, int64 Inner, int64 Along, int64... Extents, typename Out, typename... Parts>
__device__ void concat(Out out, const Parts *...parts) {
  constexpr int64 extents[] = {Extents...};
  const float *x[] = {parts...};
  FOR_EACH_ELEMENT(i, Count) {
    int64 inner = i % Inner, along = (i / Inner) % Along, outer = i / (Inner * Along);
    int64 start = 0;
#pragma unroll
    for (int k = 0; k < int(sizeof...(Extents)); ++k) {
      if (k + 1 == int(sizeof...(Extents)) || along < start + extents[k]) {
        out[i] = x[k][(outer * extents[k] + along - start) * Inner + inner];
        break;
      }
      start += extents[k];
    }
  }
}

// out = x[..., Start : Start + OutExtent, ...] along an axis of InExtent.
template <int64 Count, int64 Inner, int64 OutExtent, int64 InExtent, int64 Start, typename Out>
__device__ void slice(const float *x, Out out) {
  FOR_EACH_ELEMENT(i, Count) {
    int64 inner = i % Inner, along = (i / Inner) % OutExtent, outer = i / (Inner * OutExtent);
    out[i] = x[(outer * InExtent + along + Start) * Inner + inner];
  }
}

// x placed at Start of an axis of OutExtent, zeros around it.
template <int64 Count, int64 Inner, int64 OutExtent, int64 InExtent, int64 Start, typename Out>
__device__ void pad(const float *x, Out out) {
  FOR_EACH_ELEMENT(i, Count) {
    int64 inner = i % Inner, along = (i / Inner) % OutExtent, outer = i / (Inner * OutExtent);
    int64 source = along - Start;
    out[i] = (source >= 0 && source < InExtent) ? x[(outer * InExtent + source) * Inner + inner] : 0.0f;
  }
}
