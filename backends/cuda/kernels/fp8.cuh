// FP8 with delayed scaling (fp8.md): the quantize kernels and Transformer Engine's scale
// update. The conversions are cuda_fp8.h's (round to nearest even, saturating to the largest
// finite value), which the CPU interpreter matches bit for bit.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"
#include "elementwise.cuh"
#include "fp8_sources.cuh"

// max |x| that a NaN anywhere turns into NaN, as the CPU's amax does.
__device__ float amaxMerge(float a, float b) {
  return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// |v|'s bits: they order as the values do, a NaN's above all others (amaxBits).
__device__ __forceinline__ unsigned absBits(float v) { return __float_as_uint(v) & 0x7fffffffu; }
// The amax of a maximum of absBits: a NaN among them gives the NaN amaxMerge gives.
__device__ __forceinline__ float amaxOfBits(unsigned bits) {
  return bits > 0x7f800000u ? __int_as_float(0x7fc00000) : __uint_as_float(bits);
}
// maxBits and the absBits of four values, the largest.
__device__ __forceinline__ unsigned maxAbsBits(unsigned maxBits, float4 v) {
  return max(max(maxBits, max(absBits(v.x), absBits(v.y))), max(absBits(v.z), absBits(v.w)));
}

// Four scaled values as four FP8 bytes of one word, the first lowest (two conversions of a pair
// each: the same bytes as one at a time), saturating.
template <__nv_fp8_interpretation_t Format> __device__ __forceinline__ unsigned fp8Word(float4 s) {
  unsigned lo = __nv_cvt_float2_to_fp8x2(make_float2(s.x, s.y), __NV_SATFINITE, Format);
  unsigned hi = __nv_cvt_float2_to_fp8x2(make_float2(s.z, s.w), __NV_SATFINITE, Format);
  return lo | hi << 16;
}

// One thread's conversions: each value times the scale to FP8, saturating at `largest`, its
// max |value| (as bits: an integer maximum a value) and how many saturated kept as it goes.
template <__nv_fp8_interpretation_t Format>
struct Fp8Converter {
  float scale, largest;
  unsigned maxBits = 0;
  int saturated = 0;
  __device__ unsigned operator()(float v) {
    float scaled = v * scale;
    maxBits = max(maxBits, absBits(v));
    saturated += fabsf(scaled) > largest;
    return (unsigned)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, Format);
  }
  // Four values as four bytes of one word (fp8Word).
  __device__ unsigned operator()(float4 v) {
    float4 s = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
    maxBits = maxAbsBits(maxBits, v);
    saturated += (fabsf(s.x) > largest) + (fabsf(s.y) > largest) + (fabsf(s.z) > largest) + (fabsf(s.w) > largest);
    return fp8Word<Format>(s);
  }
};

__device__ float blockAmax(float value, float *shared) {
  return blockReduce(value, shared, [](float a, float b) { return amaxMerge(a, b); });
}

// scaleFromAmax (ScalarMath.h, the CPU's too): delayed scaling's scale from a history's amax, the
// old scale its fallback; current scaling's from the tensor's own, 1 its fallback.
__device__ __forceinline__ float currentScale(float amax, float largest, float marginScale) {
  return scaleFromAmax(amax, largest, marginScale, 1.0f);
}

// A quantize's totals over its blocks, kept in the op's persistent floats (zero when the
// executor allocates them) as unsigned words: used[0] is the scale_inv its bytes were made with
// (which its GEMMs and the read-back multiply by), then the blocks arrived, the amax so far, the
// saturated values so far, and under current scaling the tensor's amax launch 0 took. An amax
// is a maximum of |x| >= 0, whose bits order as its values (a NaN's above all), so atomicMax on
// the bits gives it in any order of the blocks, as the count's atomicAdd does: the same bits
// however the blocks run, and no pass over per-block entries.
// Under block scaling kUsedLargestScale holds the largest block scale so far (as bits: a
// positive float's order), and kUsedSaturated counts the values flushed to zero.
enum {
  kUsedArrived = 1,
  kUsedAmax = 2,
  kUsedSaturated = 3,
  kUsedCurrentAmax = 4,
  kUsedLargestScale = 5,
  kQuantizeUsedFloats = 6
};
__device__ __forceinline__ unsigned *quantizeWords(float *used) { return (unsigned *)used; }

// The tensor's amax launch 0 of current scaling took (read past L1: other blocks wrote it).
__device__ __forceinline__ float currentAmax(float *used) {
  return amaxOfBits(__ldcg(quantizeWords(used) + kUsedCurrentAmax));
}

// Over the warp, then the block (blockDim.x a multiple of 32): the largest of one value a thread,
// and the sum of one count a thread, given to thread 0. `shared` holds two words a warp.
__device__ __forceinline__ unsigned warpMaxBits(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, v);
#else
  for (int offset = 16; offset > 0; offset >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
#endif
}
__device__ __forceinline__ unsigned warpCount(unsigned v) {
#if __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, v);
#else
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
#endif
}
__device__ void blockMaxAndCount(unsigned &maxBits, unsigned &count, unsigned (*shared)[2]) {
  maxBits = warpMaxBits(maxBits);
  count = warpCount(count);
  if (threadIdx.x % 32 == 0)
    shared[threadIdx.x / 32][0] = maxBits, shared[threadIdx.x / 32][1] = count;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < (int)blockDim.x / 32; ++w) maxBits = max(maxBits, shared[w][0]), count += shared[w][1];
}

// Launch 0 of a quantize under current scaling: each block's max |x| over the range
// quantizeBlocks gives it, into the tensor's (kUsedCurrentAmax, as absBits). x: a QuantizeX,
// QuantizeGelu or QuantizeGeluGradient (as for the kernels below).
template <int64 Count, int64 PerBlock, typename Source>
__device__ void quantizeAmaxBlocks(Source x, float *used) {
  __shared__ unsigned shared[32][2];
  int64 begin = blockIdx.x * PerBlock, end = begin + PerBlock < Count ? begin + PerBlock : Count;
  unsigned maxBits = 0, none = 0;
  if (Count % 4 == 0 && PerBlock % 4 == 0) {
    for (int64 i = begin / 4 + threadIdx.x; i < end / 4; i += blockDim.x) {
      maxBits = maxAbsBits(maxBits, x.four(4 * i));
    }
  } else {
    for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) maxBits = max(maxBits, absBits(x(i)));
  }
  blockMaxAndCount(maxBits, none, shared);
  if (threadIdx.x == 0)
    atomicMax(quantizeWords(used) + kUsedCurrentAmax, maxBits);
}

// The end of every block of a quantize's converting launch: its saturation count (and, unless
// current scaling's launch 0 took the amax, its amax as absBits) into the totals; then the last
// of the Blocks blocks to arrive writes the tensor's amax and count, and the scale_inv used
// (under current scaling 1 / the scale of the amax), and sets the totals back to zero for the
// next launch: one launch a quantize, no kernel of one block after it.
// Block: the block's largest block scale (as bits, thread 0's) joins kUsedLargestScale, and the
// tensor's is written after its amax (amax[1]).
template <int64 Blocks, bool Current, bool Block = false>
__device__ void quantizeFinish(unsigned maxBits, int saturated, const float *scaleInv, float *amax,
                               float *saturations, float *used, float largest, float marginScale,
                               unsigned largestScaleBits = 0) {
  __shared__ unsigned shared[32][2];
  __shared__ bool last;
  unsigned *words = quantizeWords(used), count = (unsigned)saturated;
  blockMaxAndCount(maxBits, count, shared);
  if (threadIdx.x == 0) {
    if (!Current)
      atomicMax(words + kUsedAmax, maxBits);
    if (Block)
      atomicMax(words + kUsedLargestScale, largestScaleBits);
    atomicAdd(words + kUsedSaturated, count);
    __threadfence(); // the totals are complete for the last block before this one counts itself
    last = atomicAdd(words + kUsedArrived, 1u) == (unsigned)(Blocks - 1);
  }
  __syncthreads();
  if (!last || threadIdx.x != 0)
    return;
  __threadfence();
  float tensorAmax = amaxOfBits(__ldcg(words + (Current ? kUsedCurrentAmax : kUsedAmax)));
  amax[0] = tensorAmax;
  if (Block)
    amax[1] = __uint_as_float(__ldcg(words + kUsedLargestScale));
  saturations[0] = (float)__ldcg(words + kUsedSaturated);
  used[0] = Current ? 1.0f / currentScale(tensorAmax, largest, marginScale) : scaleInv[0];
  for (int k = kUsedArrived; k < kQuantizeUsedFloats; ++k) words[k] = 0;
}

// Launch 0 (delayed scaling; launch 1 under current scaling): each of Blocks blocks converts a
// contiguous range of PerBlock elements to FP8 (x * scale, saturating at `largest`), then
// quantizeFinish. Current: the scale is currentScale of the tensor's amax, which launch 0 took.
template <int64 Count, int64 PerBlock, int64 Blocks, __nv_fp8_interpretation_t Format, bool Current = false,
          typename Source>
__device__ void quantizeBlocks(Source x, const float *scale, unsigned char *q, const float *scaleInv, float *amax,
                               float *saturations, float *used, float largest, float marginScale = 1.0f) {
  int64 begin = blockIdx.x * PerBlock, end = begin + PerBlock < Count ? begin + PerBlock : Count;
  float s = Current ? currentScale(currentAmax(used), largest, marginScale) : scale[0];
  Fp8Converter<Format> convert{s, largest};
  if (Count % 4 == 0 && PerBlock % 4 == 0) { // four elements a load, four bytes a store
    for (int64 i = begin / 4 + threadIdx.x; i < end / 4; i += blockDim.x) {
      ((unsigned *)q)[i] = convert(x.four(4 * i));
    }
  } else {
    for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) q[i] = (unsigned char)convert(x(i));
  }
  quantizeFinish<Blocks, Current>(convert.maxBits, convert.saturated, scaleInv, amax, saturations, used, largest,
                                  marginScale);
}

// Eight rows of four FP8 bytes (words[j]: row j, the first column lowest) as four columns of
// eight bytes (column k's rows 0-3 in lo[k], 4-7 in hi[k], the first row lowest).
__device__ __forceinline__ void transposeBytes8x4(const unsigned (&words)[8], unsigned (&lo)[4], unsigned (&hi)[4]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const unsigned *w = words + 4 * half;
    unsigned *out = half ? hi : lo;
    unsigned ab01 = __byte_perm(w[0], w[1], 0x5140), ab23 = __byte_perm(w[0], w[1], 0x7362); // a0 b0 a1 b1, a2 b2 a3 b3
    unsigned cd01 = __byte_perm(w[2], w[3], 0x5140), cd23 = __byte_perm(w[2], w[3], 0x7362);
    out[0] = __byte_perm(ab01, cd01, 0x5410); // a0 b0 c0 d0
    out[1] = __byte_perm(ab01, cd01, 0x7632);
    out[2] = __byte_perm(ab23, cd23, 0x5410);
    out[3] = __byte_perm(ab23, cd23, 0x7632);
  }
}

// quantize {transpose=true}, launch 0 (delayed scaling; launch 1 under current scaling): x as
// [Rows, Cols] (multiples of 16) to FP8 in q and, transposed, in qT [Cols, Rows], from one read
// of x (Transformer Engine's cast-transpose). 64 x 64 tiles, Tiles in all and TilesC across the
// columns; block b takes tiles b, b + Blocks, ... (the lowering gives each SM a few blocks), with
// the next tile's loads in flight while it converts one. Each of its 128 threads takes eight
// rows of four columns: it converts them into eight words of q, transposes the bytes in its
// registers (transposeBytes8x4) and writes four 8-byte pieces of qT's rows, so that a warp's
// stores fill whole 32-byte sectors of q and of qT and no shared memory is needed. With
// ColumnSums (bias_grad) each tile's columns are summed over its 64 rows into partials (doubles,
// [tile row][column]): each thread its eight rows in row order, then the four threads' sums of a
// warp's 32 rows in row order, then rows 32-63's after rows 0-31's (doubles: the same bits as one
// pass down the 64 rows wherever the sums are exact, as at gpt-1.3b's shapes); columnSumTotals
// adds the tile rows after. Then, as quantizeBlocks, quantizeFinish.
enum { kQuantizeTransposeThreads = 128 };
template <int64 Rows, int64 Cols, int64 Tiles, int64 TilesC, int64 Blocks, __nv_fp8_interpretation_t Format,
          bool Current = false, bool ColumnSums = false, typename Source>
__device__ void quantizeTransposeBlocks(Source x, const float *scale, unsigned char *q, unsigned char *qT,
                                        const float *scaleInv, float *amax, float *saturations, float *used,
                                        float largest, float marginScale = 1.0f, float *partials = nullptr) {
  static_assert(Rows % 16 == 0 && Cols % 16 == 0, "the lowering checks both sides");
  __shared__ double lowerSums[ColumnSums ? 2 : 1][ColumnSums ? 64 : 1]; // rows 32-63's, two tiles apart
  float s = Current ? currentScale(currentAmax(used), largest, marginScale) : scale[0];
  Fp8Converter<Format> convert{s, largest};
  // Warps 0 and 1 take rows 0-31, 2 and 3 rows 32-63; in a warp, eight threads across 32
  // columns and four down 32 rows.
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int column = 4 * (lane % 8 + 8 * (warp % 2)), firstRow = 8 * (lane / 8 + 4 * (warp / 2));
  typename Source::Raw raw[8];
  auto load = [&](int64 t) {
    int64 r = t / TilesC * 64 + firstRow, c = t % TilesC * 64 + column;
    if (r < Rows && c < Cols) { // (eight rows and four columns all in, or all out: sides of 16)
#pragma unroll
      for (int j = 0; j < 8; ++j) raw[j] = x.raw((r + j) * Cols + c);
    }
  };
  int parity = 0;
  if (blockIdx.x < Tiles)
    load(blockIdx.x);
  for (int64 t = blockIdx.x; t < Tiles; t += Blocks, parity ^= 1) {
    int64 tileR = t / TilesC, r = tileR * 64 + firstRow, c = t % TilesC * 64 + column;
    bool inside = r < Rows && c < Cols;
    float4 v[8];
    if (inside) {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = x.value(raw[j]);
    }
    if (t + Blocks < Tiles)
      load(t + Blocks); // in flight while this tile is converted and stored
    if (inside) {
      unsigned words[8], lo[4], hi[4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        words[j] = convert(v[j]);
        if (q) // (null where the program reads only the transpose: CudaProgram::transposeOnly)
          *(unsigned *)(q + (r + j) * Cols + c) = words[j];
      }
      transposeBytes8x4(words, lo, hi);
#pragma unroll
      for (int k = 0; k < 4; ++k) *(uint2 *)(qT + (c + k) * Rows + r) = make_uint2(lo[k], hi[k]);
    }
    if constexpr (ColumnSums) {
      // Each column's 64 rows in row order: a thread's eight, then (lanes 8 apart) the four
      // threads of a warp's 32 rows, then rows 32-63's after rows 0-31's.
      double sums[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        double sum = 0;
        if (inside) {
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += (double)(&v[j].x)[k];
        }
        double s1 = __shfl_down_sync(0xffffffffu, sum, 8), s2 = __shfl_down_sync(0xffffffffu, sum, 16),
               s3 = __shfl_down_sync(0xffffffffu, sum, 24);
        sums[k] = ((sum + s1) + s2) + s3; // (lanes 0-7: their column's 32 rows)
      }
      if (warp >= 2 && lane < 8) {
#pragma unroll
        for (int k = 0; k < 4; ++k) lowerSums[parity][column + k] = sums[k];
      }
      __syncthreads(); // (two buffers: the next tile's writes go to the other)
      if (warp < 2 && lane < 8 && c < Cols) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          ((double *)partials)[tileR * Cols + c + k] = sums[k] + lowerSums[parity][column + k];
      }
    }
  }
  quantizeFinish<Blocks, Current>(convert.maxBits, convert.saturated, scaleInv, amax, saturations, used, largest,
                                  marginScale);
}

// quantize {transpose=true, activation="swiglu_backward"} where SwiGLU's F is a multiple of 64
// (no bias gradient): the cast-transpose above over dh [Rows, 2F], each block taking a tile of
// the gate half and the tile F columns on (the up half's) together. Both gradients read the same
// dy and gate, the gate's the up too: loaded once for the two (QuantizeSwigluGradient's tiles
// each load their own), the same values (swigluGateGradient, swigluUpGradient) and bytes. Tiles
// and TilesC count the gate half's tiles; then, as quantizeTransposeBlocks, quantizeFinish.
template <int64 Rows, int64 F, int64 Tiles, int64 TilesC, int64 Blocks, __nv_fp8_interpretation_t Format,
          bool Current = false, typename Dy, typename In>
__device__ void quantizeTransposeSwigluGradient(const Dy *dy, const In *h, const float *scale, unsigned char *q,
                                                unsigned char *qT, const float *scaleInv, float *amax,
                                                float *saturations, float *used, float largest,
                                                float marginScale = 1.0f) {
  static_assert(Rows % 16 == 0 && F % 64 == 0, "whole tiles in each half");
  constexpr int64 Cols = 2 * F;
  float s = Current ? currentScale(currentAmax(used), largest, marginScale) : scale[0];
  Fp8Converter<Format> convert{s, largest};
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32; // (the threads as quantizeTransposeBlocks')
  int column = 4 * (lane % 8 + 8 * (warp % 2)), firstRow = 8 * (lane / 8 + 4 * (warp / 2));
  Four<Dy> d[8];
  Four<In> g[8], u[8];
  auto load = [&](int64 t) {
    int64 r = t / TilesC * 64 + firstRow, c = t % TilesC * 64 + column;
    if (r < Rows) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        d[j] = Four<Dy>::at(dy, (r + j) * F + c);
        g[j] = Four<In>::at(h, (r + j) * Cols + c);
        u[j] = Four<In>::at(h, (r + j) * Cols + F + c);
      }
    }
  };
  if (blockIdx.x < Tiles)
    load(blockIdx.x);
  for (int64 t = blockIdx.x; t < Tiles; t += Blocks) {
    int64 r = t / TilesC * 64 + firstRow, c = t % TilesC * 64 + column;
    bool inside = r < Rows;
    unsigned gateWords[8], upWords[8];
    if (inside) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float4 dv = d[j].value(), gv = g[j].value(), uv = u[j].value();
        gateWords[j] = convert(make_float4(swigluGateGradient(dv.x, gv.x, uv.x), swigluGateGradient(dv.y, gv.y, uv.y),
                                           swigluGateGradient(dv.z, gv.z, uv.z), swigluGateGradient(dv.w, gv.w, uv.w)));
        upWords[j] = convert(make_float4(swigluUpGradient(dv.x, gv.x), swigluUpGradient(dv.y, gv.y),
                                         swigluUpGradient(dv.z, gv.z), swigluUpGradient(dv.w, gv.w)));
      }
    }
    if (t + Blocks < Tiles)
      load(t + Blocks); // in flight while this tile pair is stored
    if (inside) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const unsigned *words = half ? upWords : gateWords;
        int64 col = c + half * F;
        unsigned lo[4], hi[4], rowsOf[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          rowsOf[j] = words[j];
          *(unsigned *)(q + (r + j) * Cols + col) = words[j];
        }
        transposeBytes8x4(rowsOf, lo, hi);
#pragma unroll
        for (int k = 0; k < 4; ++k) *(uint2 *)(qT + (col + k) * Rows + r) = make_uint2(lo[k], hi[k]);
      }
    }
  }
  quantizeFinish<Blocks, Current>(convert.maxBits, convert.saturated, scaleInv, amax, saturations, used, largest,
                                  marginScale);
}

// Transformer Engine's delayed-scaling update, one block: the producer's amax into the current
// slot, the amax over the window (Max; NaN where any is) or the most recent one taken before
// the roll, the roll, and scale = (largest / amax) / 2^margin (the old scale kept when the amax
// is 0, inf or NaN). The history is usually updated in place (the step assigns it), so each
// thread reads the entries it moves before any thread writes. The same bits as one thread
// walking the window (a maximum does not depend on the order).
enum { kFp8UpdateThreads = 256 };
template <int64 Length, bool Max>
__device__ void fp8Update(const float *history, const float *scale, const float *amax, const float *saturations,
                          const float *saturated, float *newHistory, float *newScale, float *newScaleInv,
                          float *newSaturations, float largest, float marginScale,
                          float *newLargestBlockScale = nullptr) {
  __shared__ float sharedMax[kFp8UpdateThreads / 32];
  constexpr int kPer = (int)((Length + kFp8UpdateThreads - 1) / kFp8UpdateThreads);
  float current = amax[0], windowMax = threadIdx.x == 0 ? current : 0.0f;
  if (Max)
    for (int64 i = 1 + threadIdx.x; i < Length; i += kFp8UpdateThreads) windowMax = amaxMerge(windowMax, history[i]);
  float moved[kPer];
  for (int k = 0; k < kPer; ++k) {
    int64 i = threadIdx.x + (int64)k * kFp8UpdateThreads;
    moved[k] = i + 1 < Length ? history[i + 1] : 0.0f;
  }
  windowMax = blockAmax(windowMax, sharedMax); // (its barriers: every read above is done)
  for (int k = 0; k < kPer; ++k) {
    int64 i = threadIdx.x + (int64)k * kFp8UpdateThreads;
    if (i < Length) newHistory[i] = i == 0 ? 0.0f : i + 1 < Length ? moved[k] : current;
  }
  if (threadIdx.x == 0) {
    float s = scaleFromAmax(Max ? windowMax : current, largest, marginScale, scale[0]);
    newScale[0] = s;
    newScaleInv[0] = 1.0f / s;
    newSaturations[0] = saturations[0] + saturated[0];
    if (newLargestBlockScale) // a block-scaled quantize's amax pair: its largest block scale
      newLargestBlockScale[0] = amax[1];
  }
}

// Block scaling (fp8_scaling: block): each 1 x 128 or 128 x 128 block its own power-of-two scale,
// written where cuBLASLt's VEC128 / BLK128x128 modes read them; the CPU's blockQuantize
// (Fp8Scaling.h) is the reference.
//
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

// How many of four values, nonzero, became the FP8 zero (either sign) in `word` (the first
// lowest): what block scaling loses. (A NaN's code is not zero; an infinity saturates.)
__device__ __forceinline__ int flushedIn(unsigned word, float4 v) {
  return ((word & 0x7Fu) == 0 && v.x != 0.0f) + ((word & 0x7F00u) == 0 && v.y != 0.0f) +
         ((word & 0x7F0000u) == 0 && v.z != 0.0f) + ((word & 0x7F000000u) == 0 && v.w != 0.0f);
}

// A block's scale as bits for the largest so far, where its amax is finite and nonzero (a block
// of zeros, infinities or NaNs takes the fallback scale 1, which is no scale of its values).
__device__ __forceinline__ unsigned largestScaleBits(unsigned bits, float amax, float scale) {
  return isfinite(amax) && amax > 0.0f ? max(bits, __float_as_uint(scale)) : bits;
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
// b + Blocks, ... (the lowering gives each SM two blocks). Warp w takes the tile's rows 16w to
// 16w + 15, lane l its columns 4l to 4l + 3: it loads its 16 x 4 values once and keeps them (a
// GELU or its gradient is computed once an element), and the warp's max over a row gives that
// row's 1 x 128 block amax (one reduction across the lanes), whose scale lane j of the warp
// computes for row j and the lanes share; under 128 x 128 blocks the tile's amax is the maximum
// over the warps. q's rows are written four bytes a lane (a warp a whole 128-byte row), the
// 1 x 128 scales as [Cols/128][Rows] and the 128 x 128 ones as [Rows/128][ceil4(Cols/128)] (the
// layouts cuBLASLt reads, BENCHMARKS.md, session 32). With Transpose, qT [Cols, Rows] from the
// same registers: under 128 x 128 blocks q's bytes transposed (the block's scale at the
// transposed block); under 1 x 128 blocks each column's amax over the tile's 128 rows (the warps'
// maxima met in shared memory) scales the transpose's own 1 x 128 blocks, scalesT
// [Rows/128][Cols] (converted two values at a time, uncounted). A lane transposes its sixteen
// rows of four bytes in registers and writes 16 bytes of each of four qT rows. The amax, the
// values flushed to zero and the largest block scale are q's (the transpose's bytes are not
// counted again), into quantizeFinish once a block. With ColumnSums (bias_grad) each tile's
// columns are summed over its 128 rows into partials (doubles, [tile row][column]): each lane
// its sixteen rows in row order, then the warps' sums in warp order (exact wherever the sums
// are, as the per-tensor cast-transpose's); columnSumTotals adds the tile rows after.
// quantizeBlockScaled's column sums of a 128 x 128 tile: each warp's sixteen rows' (its lanes'
// four columns each) met in shared memory, added in warp order into out[0..127].
__device__ __forceinline__ void blockColumnSums(const double (&sums)[4], double *out, int warp, int lane) {
  __shared__ double warpSums[8][128];
  __syncthreads(); // the tile before has read warpSums
#pragma unroll
  for (int k = 0; k < 4; ++k) warpSums[warp][4 * lane + k] = sums[k];
  __syncthreads();
  if (threadIdx.x < 128) {
    double total = warpSums[0][threadIdx.x];
#pragma unroll
    for (int w = 1; w < 8; ++w) total += warpSums[w][threadIdx.x];
    out[threadIdx.x] = total;
  }
}

// quantizeBlockScaled's transpose under 1 x 128 blocks: the lane's sixteen rows of four values
// (v), each of its four columns scaled by the column's amax over the tile's 128 rows (the warps'
// maxima in warpBits), as sixteen words of four bytes (not counted: q's bytes are); returns the
// four columns' scale_inv.
template <__nv_fp8_interpretation_t Format>
__device__ __forceinline__ float4 columnBlockWords(const float4 (&v)[16], const unsigned (*warpBits)[128], int lane,
                                                   float largest, unsigned (&words)[16]) {
  float s[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    unsigned bits = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) bits = max(bits, warpBits[w][4 * lane + k]);
    s[k] = blockScaleOf(amaxOfBits(bits), largest);
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
    words[j] = fp8Word<Format>(make_float4(v[j].x * s[0], v[j].y * s[1], v[j].z * s[2], v[j].w * s[3]));
  return make_float4(1.0f / s[0], 1.0f / s[1], 1.0f / s[2], 1.0f / s[3]);
}

enum { kBlockCastThreads = 256 };
template <int64 Rows, int64 Cols, int64 BlockRows, int64 Blocks, __nv_fp8_interpretation_t Format, bool Transpose,
          bool ColumnSums = false, typename Source>
__device__ void quantizeBlockScaled(Source x, const float *scaleInv, unsigned char *q, unsigned char *qT, float *amax,
                                    float *saturations, float *used, float *scales, float *scalesT, float largest,
                                    float *partials = nullptr) {
  static_assert(Cols % 128 == 0 && (BlockRows == 1 || BlockRows == 128), "Infer's block-scaling rules");
  static_assert(!(Transpose || BlockRows == 128) || Rows % 128 == 0, "whole tiles down the rows");
  constexpr int64 kTilesC = Cols / 128, kTiles = (Rows + 127) / 128 * kTilesC;
  constexpr int64 kPadded = (kTilesC + 3) / 4 * 4, kPaddedT = (Rows / 128 + 3) / 4 * 4;
  constexpr bool kColumnBlocks = Transpose && BlockRows == 1;
  constexpr bool kWhole = Rows % 128 == 0; // (every row of every tile inside)
  __shared__ unsigned warpBits[8][kColumnBlocks ? 128 : 1]; // each warp's maxima: its tile's or columns'
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Fp8Converter<Format> convert{1.0f, largest};
  int flushed = 0;
  unsigned largestBits = 0; // of the scales this lane computed (a warp's maximum at the end)
  for (int64 t = blockIdx.x; t < kTiles; t += Blocks) {
    int64 tileR = t / kTilesC, tileC = t % kTilesC, r0 = tileR * 128 + 16 * warp, c = tileC * 128 + 4 * lane;
    float4 v[16];
    {
      typename Source::Raw raw[16];
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (kWhole || r0 + j < Rows)
          raw[j] = x.raw((r0 + j) * Cols + c);
#pragma unroll
      for (int j = 0; j < 16; ++j)
        v[j] = kWhole || r0 + j < Rows ? x.value(raw[j]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    unsigned columnBits[4] = {0, 0, 0, 0}, allBits = 0, myRowBits = 0; // myRowBits: row `lane`'s
    double columnSums[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      unsigned b[4] = {absBits(v[j].x), absBits(v[j].y), absBits(v[j].z), absBits(v[j].w)};
      unsigned rowBits = max(max(b[0], b[1]), max(b[2], b[3]));
      allBits = max(allBits, rowBits);
#pragma unroll
      for (int k = 0; k < 4; ++k) columnBits[k] = max(columnBits[k], b[k]);
      if constexpr (BlockRows == 1) {
        rowBits = warpMaxBits(rowBits);
        if (lane == j)
          myRowBits = rowBits;
      }
      if constexpr (ColumnSums)
        columnSums[0] += v[j].x, columnSums[1] += v[j].y, columnSums[2] += v[j].z, columnSums[3] += v[j].w;
    }
    if constexpr (ColumnSums)
      blockColumnSums(columnSums, (double *)partials + tileR * Cols + tileC * 128, warp, lane);
    constexpr bool kShared = BlockRows == 128 || kColumnBlocks; // (1 x 128 blocks of q alone share nothing)
    if constexpr (kShared)
      __syncthreads(); // the tile before has read warpBits
    if constexpr (BlockRows == 128) {
      allBits = warpMaxBits(allBits);
      if (lane == 0)
        warpBits[warp][0] = allBits;
    } else if constexpr (kColumnBlocks) {
#pragma unroll
      for (int k = 0; k < 4; ++k) warpBits[warp][4 * lane + k] = columnBits[k];
    }
    if constexpr (kShared)
      __syncthreads();
    float tileScale = 1.0f, rowScale = 1.0f; // rowScale: row `lane`'s, lanes 0-15
    if constexpr (BlockRows == 128) {
#pragma unroll
      for (int w = 0; w < 8; ++w) allBits = max(allBits, warpBits[w][0]);
      tileScale = blockScaleOf(amaxOfBits(allBits), largest);
      largestBits = largestScaleBits(largestBits, amaxOfBits(allBits), tileScale);
    } else if (lane < 16 && (kWhole || r0 + lane < Rows)) {
      rowScale = blockScaleOf(amaxOfBits(myRowBits), largest);
      largestBits = largestScaleBits(largestBits, amaxOfBits(myRowBits), rowScale);
      scales[tileC * Rows + r0 + lane] = 1.0f / rowScale;
    }
    unsigned words[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      float s = BlockRows == 128 ? tileScale : __shfl_sync(0xffffffffu, rowScale, j);
      if (!kWhole && r0 + j >= Rows)
        continue;
      convert.scale = s;
      words[j] = convert(v[j]);
      flushed += flushedIn(words[j], v[j]);
      if (q) // (null where the program reads only the transpose: CudaProgram::transposeOnly)
        *(unsigned *)(q + (r0 + j) * Cols + c) = words[j];
    }
    if (BlockRows == 128 && threadIdx.x == 0) {
      scales[tileR * kPadded + tileC] = 1.0f / tileScale;
      if (Transpose)
        scalesT[tileC * kPaddedT + tileR] = 1.0f / tileScale;
    }
    if constexpr (Transpose) {
      if constexpr (kColumnBlocks) { // the transpose's own blocks: each column's scale
        float4 inverses = columnBlockWords<Format>(v, warpBits, lane, largest, words);
        if (warp == 0)
          *(float4 *)(scalesT + tileR * Cols + c) = inverses;
      }
      uint4 columnBytes[4];
      transposeBytes16x4(words, columnBytes);
#pragma unroll
      for (int k = 0; k < 4; ++k) *(uint4 *)(qT + (c + k) * Rows + r0) = columnBytes[k];
    }
  }
  largestBits = warpMaxBits(largestBits);
  __shared__ unsigned warpLargest[kBlockCastThreads / 32];
  if (lane == 0)
    warpLargest[warp] = largestBits;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kBlockCastThreads / 32; ++w) largestBits = max(largestBits, warpLargest[w]);
  quantizeFinish<Blocks, false, true>(convert.maxBits, flushed, scaleInv, amax, saturations, used, largest, 1.0f,
                                      largestBits);
}
