// Elementwise kernels: constants, arithmetic with a broadcast operand, activations and their
// gradients, the causal mask. Each runs a grid-stride loop over Count elements; Out is float *
// or a BF16 output wrapper (common.cuh).
#pragma once

#include "ScalarMath.h"
#include "common.cuh"

template <int64 Count, typename Out>
__device__ void fill(Out out, float value) {
  FOR_EACH_ELEMENT(i, Count) out[i] = value;
}

// Where Count (and a broadcast's Period) is a multiple of 4, the kernels below take four
// elements a thread, in 16-byte loads and stores: the same values, fewer memory transactions.

// out = x + y or x * y, y repeating every Period elements (a bias, a scale per feature).
template <bool Multiply, int64 Count, int64 Period, typename Out>
__device__ void binary(const float *x, const float *y, Out out) {
  auto apply = [](float a, float b) { return Multiply ? a * b : a + b; };
  if (Count % 4 == 0 && Period % 4 == 0) {
    FOR_EACH_ELEMENT(v, Count / 4) {
      float4 a = load4(x, 4 * v), b = load4(y, 4 * v % Period);
      store4(out, 4 * v, make_float4(apply(a.x, b.x), apply(a.y, b.y), apply(a.z, b.z), apply(a.w, b.w)));
    }
  } else {
    FOR_EACH_ELEMENT(i, Count) out[i] = apply(x[i], y[i % Period]);
  }
}

// rope (ir/Ops.def): pair p of Pairs is row p / Half's pair (i, i + Half), i = p % Half, at
// position t = row % Rows; table holds Rows * Half cosines, then the sines (ir/Rope.h's, as
// doubles). Each product and sum rounded on its own (no FMA): the CPU's bits.
template <int64 Pairs, int64 Half, int64 Rows, typename In>
__device__ void rope(const In *x, float *out, const double *table) {
  FOR_EACH_ELEMENT(p, Pairs) {
    int64 r = p / Half, i = p % Half;
    float a = elementValue(x[r * 2 * Half + i]), b = elementValue(x[r * 2 * Half + i + Half]);
    ropePair<Rows, Half, false>(a, b, table, r % Rows, i);
    out[r * 2 * Half + i] = a;
    out[r * 2 * Half + i + Half] = b;
  }
}

// rope at positions (a decode step's, or a prompt's continued): row r of sequence b = r /
// PerSequence is at position positions[b] + r % Rows of a table of Length positions; a position
// outside the table (which the CPU reports as an error) is left unrotated.
template <int64 Pairs, int64 Half, int64 Rows, int64 PerSequence, int64 Length, typename In>
__device__ void ropeAt(const In *x, const int *positions, float *out, const double *table) {
  FOR_EACH_ELEMENT(p, Pairs) {
    int64 r = p / Half, i = p % Half, t = positions[r / PerSequence] + r % Rows;
    float a = elementValue(x[r * 2 * Half + i]), b = elementValue(x[r * 2 * Half + i + Half]);
    if (t >= 0 && t < Length)
      ropePair<Length, Half, false>(a, b, table, t, i);
    out[r * 2 * Half + i] = a;
    out[r * 2 * Half + i + Half] = b;
  }
}

template <int64 Count, typename Out>
__device__ void scale(const float *x, Out out, float factor) {
  FOR_EACH_ELEMENT(i, Count) out[i] = x[i] * factor;
}

// x in fp32, or stored in BF16 (CudaProgram::bf16Rounding: an FP8 layer's pre-activation).
template <int64 Count, typename In, typename Out>
__device__ void gelu(const In *x, Out out) {
  if (Count % 4 == 0) {
    FOR_EACH_ELEMENT(v, Count / 4) {
      float4 a = load4(x, 4 * v);
      store4(out, 4 * v, make_float4(geluTanh(a.x), geluTanh(a.y), geluTanh(a.z), geluTanh(a.w)));
    }
  } else {
    FOR_EACH_ELEMENT(i, Count) out[i] = geluTanh(elementValue(x[i]));
  }
}

template <int64 Count, typename Out>
__device__ void silu(const float *x, Out out) {
  FOR_EACH_ELEMENT(i, Count) out[i] = x[i] / (1.0f + expf(-x[i]));
}

// swiglu (ir/Ops.def): h's rows [gate | up] of 2F -> silu(gate) * up, silu's and mul's
// arithmetic; h in fp32 or stored in BF16.
__device__ __forceinline__ float swigluValue(float g, float u) { return g / (1.0f + expf(-g)) * u; }
template <int64 Count, int64 F, typename In, typename Out>
__device__ void swiglu(const In *h, Out out) {
  if constexpr (F % 4 == 0) { // four outputs a thread: 16- (fp32) or 8-byte (BF16) loads of gate and up
    FOR_EACH_ELEMENT(v, Count / 4) {
      int64 i = 4 * v, at = i / F * 2 * F + i % F;
      float4 g = load4(h, at), u = load4(h, at + F);
      store4(out, i, make_float4(swigluValue(g.x, u.x), swigluValue(g.y, u.y), swigluValue(g.z, u.z),
                                 swigluValue(g.w, u.w)));
    }
  } else {
    FOR_EACH_ELEMENT(i, Count) {
      int64 at = i / F * 2 * F + i % F;
      out[i] = swigluValue(elementValue(h[at]), elementValue(h[at + F]));
    }
  }
}

// Its gradient: dh's gate half silu_backward(dy * up, gate), its up half dy * silu(gate); dy
// and h in fp32 or stored in BF16.
__device__ __forceinline__ float swigluGateGradient(float d, float g, float u) {
  float s = 1.0f / (1.0f + expf(-g));
  return d * u * s * (1.0f + g * (1.0f - s));
}
__device__ __forceinline__ float swigluUpGradient(float d, float g) { return d * (g / (1.0f + expf(-g))); }
template <int64 Count, int64 F, typename Dy, typename In, typename Out>
__device__ void swigluBackward(const Dy *dy, const In *h, Out dh) {
  if constexpr (F % 4 == 0) { // four elements of dy a thread, as swiglu
    FOR_EACH_ELEMENT(v, Count / 4) {
      int64 i = 4 * v, at = i / F * 2 * F + i % F;
      float4 g = load4(h, at), u = load4(h, at + F), d = load4(dy, i);
      store4(dh, at, make_float4(swigluGateGradient(d.x, g.x, u.x), swigluGateGradient(d.y, g.y, u.y),
                                 swigluGateGradient(d.z, g.z, u.z), swigluGateGradient(d.w, g.w, u.w)));
      store4(dh, at + F, make_float4(swigluUpGradient(d.x, g.x), swigluUpGradient(d.y, g.y),
                                     swigluUpGradient(d.z, g.z), swigluUpGradient(d.w, g.w)));
    }
  } else {
    FOR_EACH_ELEMENT(i, Count) {
      int64 at = i / F * 2 * F + i % F;
      float g = elementValue(h[at]), u = elementValue(h[at + F]), d = elementValue(dy[i]);
      dh[at] = swigluGateGradient(d, g, u);
      dh[at + F] = swigluUpGradient(d, g);
    }
  }
}

template <int64 Count, typename In, typename Out>
__device__ void geluBackward(const float *dy, const In *x, Out dx) {
  if (Count % 4 == 0) {
    FOR_EACH_ELEMENT(v, Count / 4) {
      float4 d = load4(dy, 4 * v), a = load4(x, 4 * v);
      store4(dx, 4 * v,
             make_float4(geluTanhGradient(d.x, a.x), geluTanhGradient(d.y, a.y), geluTanhGradient(d.z, a.z),
                         geluTanhGradient(d.w, a.w)));
    }
  } else {
    FOR_EACH_ELEMENT(i, Count) dx[i] = geluTanhGradient(dy[i], elementValue(x[i]));
  }
}

// geluBackward over [Rows, Columns], with the column sums of dx over chunks of Chunk rows into
// scratch (doubles, [chunk][column]), each summed in row order as reduce.cuh's
// columnSumPartials sums them; columnSumTotals then adds the chunks. PER (4 or 1) consecutive
// columns a thread, ColumnBlocks blocks across the columns for each chunk.
template <int64 Columns, int64 Rows, int PER, int64 ColumnBlocks, int64 Chunk, typename In, typename Out>
__device__ void geluBackwardColumnSums(const float *dy, const In *x, Out dx, float *scratch) {
  double *partial = (double *)scratch;
  int64 chunk = blockIdx.x / ColumnBlocks;
  int64 column = PER * ((blockIdx.x % ColumnBlocks) * blockDim.x + threadIdx.x);
  if (column >= Columns) return;
  double sums[PER] = {};
  for (int64 r = chunk * Chunk; r < Rows && r < (chunk + 1) * Chunk; ++r) {
    int64 i = r * Columns + column;
    if constexpr (PER == 4) {
      float4 d = load4(dy, i), a = load4(x, i);
      float4 g = make_float4(geluTanhGradient(d.x, a.x), geluTanhGradient(d.y, a.y), geluTanhGradient(d.z, a.z),
                             geluTanhGradient(d.w, a.w));
      store4(dx, i, g);
      sums[0] += g.x; sums[1] += g.y; sums[2] += g.z; sums[3] += g.w;
    } else {
      float g = geluTanhGradient(dy[i], elementValue(x[i]));
      dx[i] = g;
      sums[0] += g;
    }
  }
#pragma unroll
  for (int k = 0; k < PER; ++k) partial[chunk * Columns + column + k] = sums[k];
}

template <int64 Count, typename Out>
__device__ void siluBackward(const float *dy, const float *x, Out dx) {
  FOR_EACH_ELEMENT(i, Count) {
    float s = 1.0f / (1.0f + expf(-x[i]));
    dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

// [..., T, T] scores with the keys after each query replaced by `fill`.
template <int64 Count, int64 T, typename Out>
__device__ void causalMask(const float *scores, Out out, float fill) {
  FOR_EACH_ELEMENT(i, Count) {
    int64 key = i % T, query = (i / T) % T;
    out[i] = key > query ? fill : scores[i];
  }
}
