// FP8 with delayed scaling (fp8.md): the quantize kernels and Transformer Engine's scale
// update. The conversions are cuda_fp8.h's (round to nearest even, saturating to the largest
// finite value), which the CPU interpreter matches bit for bit.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"
#include "elementwise.cuh"
#include "layout.cuh"

// What a quantize converts, read at element i (one value, or four from a multiple of 4): x,
// gelu(x) under activation="gelu" (fuse-gelu-quantize: fc2's input from fc1's pre-activation), or
// gelu_backward(x, h) under activation="gelu_backward" (fc1's output gradient from its GELU's);
// each operand in fp32 or stored in BF16 (float or unsigned short).
template <typename In>
struct QuantizeX {
  const In *x;
  __device__ float operator()(int64 i) const { return elementValue(x[i]); }
  __device__ float4 four(int64 i) const { return load4(x, i); }
};
template <typename In>
struct QuantizeGelu {
  const In *x;
  __device__ float operator()(int64 i) const { return geluTanh(elementValue(x[i])); }
  __device__ float4 four(int64 i) const {
    float4 v = load4(x, i);
    return make_float4(geluTanh(v.x), geluTanh(v.y), geluTanh(v.z), geluTanh(v.w));
  }
};
template <typename Dy, typename In>
struct QuantizeGeluGradient {
  const Dy *dy;
  const In *h;
  __device__ float operator()(int64 i) const { return geluTanhGradient(elementValue(dy[i]), elementValue(h[i])); }
  __device__ float4 four(int64 i) const {
    float4 d = load4(dy, i), v = load4(h, i);
    return make_float4(geluTanhGradient(d.x, v.x), geluTanhGradient(d.y, v.y), geluTanhGradient(d.z, v.z),
                       geluTanhGradient(d.w, v.w));
  }
};
template <typename In>
__device__ QuantizeX<In> quantizeX(const In *x) { return {x}; }
template <typename In>
__device__ QuantizeGelu<In> quantizeGelu(const In *x) { return {x}; }
template <typename Dy, typename In>
__device__ QuantizeGeluGradient<Dy, In> quantizeGeluGradient(const Dy *dy, const In *h) { return {dy, h}; }

// max |x| that a NaN anywhere turns into NaN, as the CPU's amax does.
__device__ float amaxMerge(float a, float b) {
  return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// One thread's conversions: each value times the scale to FP8, saturating at `largest`, its
// max |value| and how many saturated kept as it goes.
template <__nv_fp8_interpretation_t Format>
struct Fp8Converter {
  float scale, largest, localMax = 0.0f;
  int saturated = 0;
  __device__ unsigned operator()(float v) {
    float scaled = v * scale;
    localMax = amaxMerge(localMax, fabsf(v));
    saturated += fabsf(scaled) > largest;
    return (unsigned)__nv_cvt_float_to_fp8(scaled, __NV_SATFINITE, Format);
  }
  // Four values as four bytes of one word, the first lowest.
  __device__ unsigned operator()(float4 v) {
    unsigned a = (*this)(v.x), b = (*this)(v.y), c = (*this)(v.z), d = (*this)(v.w);
    return a | b << 8 | c << 16 | d << 24;
  }
};

__device__ float blockAmax(float value, float *shared) {
  return blockReduce(value, shared, [](float a, float b) { return amaxMerge(a, b); });
}

// (largest / amax) / 2^margin where amax is finite and > 0 (FLT_MAX for an infinite quotient),
// else `fallback` (the CPU's scaleFromAmax): delayed scaling's scale from a history's amax, the
// old scale its fallback; current scaling's from the tensor's own, 1 its fallback.
__device__ __forceinline__ float scaleFromAmax(float amax, float largest, float marginScale, float fallback) {
  if (!isfinite(amax) || amax <= 0.0f)
    return fallback;
  float s = (largest / amax) / marginScale;
  return isinf(s) ? __int_as_float(0x7f7fffff) : s;
}
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
enum { kUsedArrived = 1, kUsedAmax = 2, kUsedSaturated = 3, kUsedCurrentAmax = 4, kQuantizeUsedFloats = 5 };
__device__ __forceinline__ unsigned *quantizeWords(float *used) { return (unsigned *)used; }

// The tensor's amax launch 0 of current scaling took (read past L1: other blocks wrote it).
__device__ __forceinline__ float currentAmax(float *used) {
  return __uint_as_float(__ldcg(quantizeWords(used) + kUsedCurrentAmax));
}

// Launch 0 of a quantize under current scaling: each block's max |x| over the range
// quantizeBlocks gives it, into the tensor's (kUsedCurrentAmax). x: a QuantizeX, QuantizeGelu or
// QuantizeGeluGradient (as for the kernels below).
template <int64 Count, int64 PerBlock, typename Source>
__device__ void quantizeAmaxBlocks(Source x, float *used) {
  __shared__ float sharedMax[256];
  int64 begin = blockIdx.x * PerBlock, end = begin + PerBlock < Count ? begin + PerBlock : Count;
  float localMax = 0.0f;
  if (Count % 4 == 0 && PerBlock % 4 == 0) {
    for (int64 i = begin / 4 + threadIdx.x; i < end / 4; i += blockDim.x) {
      float4 v = x.four(4 * i);
      localMax = amaxMerge(amaxMerge(localMax, fabsf(v.x)),
                           amaxMerge(fabsf(v.y), amaxMerge(fabsf(v.z), fabsf(v.w))));
    }
  } else {
    for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) localMax = amaxMerge(localMax, fabsf(x(i)));
  }
  localMax = blockAmax(localMax, sharedMax);
  if (threadIdx.x == 0)
    atomicMax(quantizeWords(used) + kUsedCurrentAmax, __float_as_uint(localMax));
}

// The end of every block of a quantize's converting launch: its saturation count (and, unless
// current scaling's launch 0 took the amax, its amax) into the totals; then the last of the
// Blocks blocks to arrive writes the tensor's amax and count, and the scale_inv used (under
// current scaling 1 / the scale of the amax), and sets the totals back to zero for the next
// launch: one launch a quantize, no kernel of one block after it.
template <int64 Blocks, bool Current>
__device__ void quantizeFinish(float localMax, int saturated, const float *scaleInv, float *amax,
                               float *saturations, float *used, float largest, float marginScale) {
  __shared__ double shared[256];
  __shared__ float sharedMax[256];
  __shared__ bool last;
  unsigned *words = quantizeWords(used);
  if (!Current)
    localMax = blockAmax(localMax, sharedMax);
  double total = blockSum((double)saturated, shared);
  if (threadIdx.x == 0) {
    if (!Current)
      atomicMax(words + kUsedAmax, __float_as_uint(localMax));
    atomicAdd(words + kUsedSaturated, (unsigned)total);
    __threadfence(); // the totals are complete for the last block before this one counts itself
    last = atomicAdd(words + kUsedArrived, 1u) == (unsigned)(Blocks - 1);
  }
  __syncthreads();
  if (!last || threadIdx.x != 0)
    return;
  __threadfence();
  float tensorAmax = __uint_as_float(__ldcg(words + (Current ? kUsedCurrentAmax : kUsedAmax)));
  amax[0] = tensorAmax;
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
  quantizeFinish<Blocks, Current>(convert.localMax, convert.saturated, scaleInv, amax, saturations, used, largest,
                                  marginScale);
}

// quantize {transpose=true}, launch 0 (delayed scaling; launch 1 under current scaling): x as
// [Rows, Cols] (multiples of 16) to FP8 in q and, transposed, in qT [Cols, Rows], from one read
// of x (Transformer Engine's cast-transpose). 64 x 64 tiles, Tiles in all and TilesC across the
// columns, which each of Blocks blocks takes in turn (the lowering gives each block one): each thread converts sixteen values of a
// row into one 16-byte store of q and of the tile in shared memory, whose columns then go out as
// rows of qT, sixteen bytes a store (transposeBytes' pattern). Then, as quantizeBlocks,
// quantizeFinish. With ColumnSums (bias_grad) each tile's fp32 values go through shared memory
// too, and one thread a column sums its 64 rows in row order into partials (doubles,
// [tile row][column]) as geluBackwardColumnSums sums a chunk of 64 rows; columnSumTotals adds the
// tile rows after. 256 threads.
template <int64 Rows, int64 Cols, int64 Tiles, int64 TilesC, int64 Blocks, __nv_fp8_interpretation_t Format,
          bool Current = false, bool ColumnSums = false, typename Source>
__device__ void quantizeTransposeBlocks(Source x, const float *scale, unsigned char *q, unsigned char *qT,
                                        const float *scaleInv, float *amax, float *saturations, float *used,
                                        float largest, float marginScale = 1.0f, float *partials = nullptr) {
  __shared__ __align__(16) unsigned char tile[64][80];
  __shared__ float values[ColumnSums ? 64 : 1][ColumnSums ? 65 : 1]; // (65: a column's reads in all banks)
  float s = Current ? currentScale(currentAmax(used), largest, marginScale) : scale[0];
  Fp8Converter<Format> convert{s, largest};
  int row = threadIdx.x / 4, part = threadIdx.x % 4; // 64 rows of four 16-element parts
  for (int64 t = blockIdx.x; t < Tiles; t += Blocks) {
    int64 tileR = t / TilesC, tileC = t % TilesC;
    int64 r = tileR * 64 + row, c = tileC * 64 + part * 16;
    if (r < Rows && c < Cols) {
      float4 v[4];
      uint4 packed;
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = x.four(r * Cols + c + 4 * k);
      packed.x = convert(v[0]);
      packed.y = convert(v[1]);
      packed.z = convert(v[2]);
      packed.w = convert(v[3]);
      *(uint4 *)(q + r * Cols + c) = packed;
      *(uint4 *)&tile[row][part * 16] = packed;
      if constexpr (ColumnSums) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float *out = &values[row][part * 16 + 4 * k];
          out[0] = v[k].x, out[1] = v[k].y, out[2] = v[k].z, out[3] = v[k].w;
        }
      }
    }
    __syncthreads();
    int64 outRow = tileC * 64 + row, outCol = tileR * 64 + part * 16; // row: an input column
    if (outRow < Cols && outCol < Rows)
      *(uint4 *)(qT + outRow * Rows + outCol) = tileColumn16(tile, row, part * 16);
    if constexpr (ColumnSums) {
      int64 column = tileC * 64 + threadIdx.x;
      if (threadIdx.x < 64 && column < Cols) {
        int64 rows = Rows - tileR * 64 < 64 ? Rows - tileR * 64 : 64;
        double sum = 0;
        for (int k = 0; k < rows; ++k) sum += values[k][threadIdx.x];
        ((double *)partials)[tileR * Cols + column] = sum;
      }
    }
    __syncthreads(); // (the next tile overwrites this one)
  }
  quantizeFinish<Blocks, Current>(convert.localMax, convert.saturated, scaleInv, amax, saturations, used, largest,
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
                          float *newSaturations, float largest, float marginScale) {
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
  }
}
