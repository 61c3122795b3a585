// Block-scaled FP8 (fp8_scaling: block, fp8.md): the cast that gives each 1 x 128 or 128 x 128
// block of a tensor its own power-of-two scale, and writes the scales where cuBLASLt's
// VEC128 / BLK128x128 modes read them. The CPU's blockQuantize (Fp8Scaling.h) is its reference.
#pragma once

#include "fp8.cuh"

// Block scaling's scale of a block whose amax is `amax` (blockScale, Fp8Scaling.h, the CPU's):
// largest / amax rounded down to a power of two (its mantissa cleared), FLT_MAX's where that is
// infinite, 1 where the amax is 0, inf or NaN.
__device__ __forceinline__ float blockScaleOf(float amax, float largest) {
  if (!isfinite(amax) || amax == 0.0f)
    return 1.0f;
  float scale = __fdiv_rn(largest, amax);
  if (isinf(scale))
    scale = 3.402823466e38f;
  return __uint_as_float(__float_as_uint(scale) & 0xFF800000u);
}

// Sixteen rows of four FP8 bytes (words[j]: row j, the first column lowest) as four columns of
// sixteen bytes (column k's rows in out[k], the first row lowest): transposeBytes8x4 twice.
__device__ __forceinline__ void transposeBytes16x4(const unsigned (&words)[16], uint4 (&out)[4]) {
  unsigned lo[4], hi[4], lo2[4], hi2[4];
  transposeBytes8x4(*(const unsigned(*)[8])words, lo, hi);
  transposeBytes8x4(*(const unsigned(*)[8])(words + 8), lo2, hi2);
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = make_uint4(lo[k], hi[k], lo2[k], hi2[k]);
}

// quantize {scaling="block"}: x [Rows, Cols] (Cols a multiple of 128; Rows too where a block or
// the transpose spans the rows) in tiles of 128 x 128, each block of 256 threads taking tiles b,
// b + Blocks, ... (the lowering gives each SM a few blocks). Warp w takes the tile's rows 16w to
// 16w + 15, lane l its columns 4l to 4l + 3: it loads its 16 x 4 values once, and the warp's max
// over a row gives that row's 1 x 128 block amax (one reduction across the lanes); under 128 x
// 128 blocks the tile's amax is the maximum over the warps. q's rows are written four bytes a
// lane (a warp a whole 128-byte row), the 1 x 128 scales as [Cols/128][Rows] and the 128 x 128
// ones as [Rows/128][ceil4(Cols/128)] (the layouts cuBLASLt reads, BENCHMARKS.md, session 32).
// With Transpose, qT [Cols, Rows] from the same registers: under 128 x 128 blocks q's bytes
// transposed (the block's scale at the transposed block); under 1 x 128 blocks each column's
// amax over the tile's 128 rows (the warps' maxima met in shared memory) scales the transpose's
// own 1 x 128 blocks, scalesT [Rows/128][Cols]. A lane transposes its sixteen rows of four bytes
// in registers and writes 16 bytes of each of four qT rows. The amax and saturation count are
// q's (the transpose's bytes are not counted again), into quantizeFinish once a block.
enum { kBlockCastThreads = 256 };
template <int64 Rows, int64 Cols, int64 BlockRows, int64 Blocks, __nv_fp8_interpretation_t Format, bool Transpose,
          typename Source>
__device__ void quantizeBlockScaled(Source x, const float *scaleInv, unsigned char *q, unsigned char *qT, float *amax,
                                    float *saturations, float *used, float *scales, float *scalesT, float largest) {
  static_assert(Cols % 128 == 0 && (BlockRows == 1 || BlockRows == 128), "Infer's block-scaling rules");
  static_assert(!(Transpose || BlockRows == 128) || Rows % 128 == 0, "whole tiles down the rows");
  constexpr int64 kTilesC = Cols / 128, kTiles = (Rows + 127) / 128 * kTilesC;
  constexpr int64 kPadded = (kTilesC + 3) / 4 * 4, kPaddedT = (Rows / 128 + 3) / 4 * 4;
  constexpr bool kColumnBlocks = Transpose && BlockRows == 1;
  __shared__ unsigned warpBits[8][kColumnBlocks ? 128 : 1]; // each warp's maxima: its tile's or columns'
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Fp8Converter<Format> convert{1.0f, largest};
  for (int64 t = blockIdx.x; t < kTiles; t += Blocks) {
    int64 tileR = t / kTilesC, tileC = t % kTilesC, r0 = tileR * 128 + 16 * warp, c = tileC * 128 + 4 * lane;
    typename Source::Raw raw[16];
#pragma unroll
    for (int j = 0; j < 16; ++j)
      if (r0 + j < Rows)
        raw[j] = x.raw((r0 + j) * Cols + c);
    unsigned rowBits[16], columnBits[4] = {0, 0, 0, 0}, allBits = 0;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float4 v = r0 + j < Rows ? x.value(raw[j]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      unsigned b[4] = {absBits(v.x), absBits(v.y), absBits(v.z), absBits(v.w)};
      rowBits[j] = max(max(b[0], b[1]), max(b[2], b[3]));
      allBits = max(allBits, rowBits[j]);
#pragma unroll
      for (int k = 0; k < 4; ++k) columnBits[k] = max(columnBits[k], b[k]);
    }
    constexpr bool kShared = BlockRows == 128 || kColumnBlocks;
    if (kShared)
      __syncthreads(); // the tile before has read warpBits
    if constexpr (BlockRows == 128) {
      allBits = warpMaxBits(allBits);
      if (lane == 0)
        warpBits[warp][0] = allBits;
    } else if constexpr (kColumnBlocks) {
#pragma unroll
      for (int k = 0; k < 4; ++k) warpBits[warp][4 * lane + k] = columnBits[k];
    }
    if (kShared)
      __syncthreads();
    float tileScale = 1.0f;
    if constexpr (BlockRows == 128) {
#pragma unroll
      for (int w = 0; w < 8; ++w) allBits = max(allBits, warpBits[w][0]);
      tileScale = blockScaleOf(amaxOfBits(allBits), largest);
    }
    unsigned words[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      if (r0 + j >= Rows)
        continue;
      float s = BlockRows == 128 ? tileScale : blockScaleOf(amaxOfBits(warpMaxBits(rowBits[j])), largest);
      convert.scale = s;
      words[j] = convert(x.value(raw[j]));
      *(unsigned *)(q + (r0 + j) * Cols + c) = words[j];
      if (BlockRows == 1 && lane == j)
        scales[tileC * Rows + r0 + j] = 1.0f / s;
    }
    if (BlockRows == 128 && threadIdx.x == 0) {
      scales[tileR * kPadded + tileC] = 1.0f / tileScale;
      if (Transpose)
        scalesT[tileC * kPaddedT + tileR] = 1.0f / tileScale;
    }
    if constexpr (Transpose) {
      if constexpr (kColumnBlocks) { // the transpose's own blocks: each column's scale
        float s[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          unsigned bits = 0;
#pragma unroll
          for (int w = 0; w < 8; ++w) bits = max(bits, warpBits[w][4 * lane + k]);
          s[k] = blockScaleOf(amaxOfBits(bits), largest);
        }
        Fp8Converter<Format> columns{1.0f, largest}; // (not counted: q's bytes are)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          float4 v = x.value(raw[j]);
          unsigned word = 0;
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            columns.scale = s[k];
            word |= columns((&v.x)[k]) << (8 * k);
          }
          words[j] = word;
        }
        if (warp == 0)
          *(float4 *)(scalesT + tileR * Cols + c) = make_float4(1.0f / s[0], 1.0f / s[1], 1.0f / s[2], 1.0f / s[3]);
      }
      uint4 columnBytes[4];
      transposeBytes16x4(words, columnBytes);
#pragma unroll
      for (int k = 0; k < 4; ++k) *(uint4 *)(qT + (c + k) * Rows + r0) = columnBytes[k];
    }
  }
  quantizeFinish<Blocks, false>(convert.maxBits, convert.saturated, scaleInv, amax, saturations, used, largest, 1.0f);
}
