// The sources a quantize converts (fp8.cuh's kernels take one): x, or x through the activation
// or gradient the quantize applies as it reads (GELU, SwiGLU, their gradients, the loss's
// gradient of the logits), each operand read in fp32 or BF16, four elements a load, computed as
// the elementwise and loss kernels compute them (the same bits).
#pragma once

#include "common.cuh"
#include "elementwise.cuh"

// Four consecutive elements as one load brings them (at(x, i), i a multiple of 4): a float4, or
// four BF16 values in 8 bytes; value() gives them as floats.
template <typename T>
struct Four;
template <>
struct Four<float> {
  float4 v;
  __device__ static Four at(const float *x, int64 i) { return {*(const float4 *)(x + i)}; }
  __device__ float4 value() const { return v; }
};
template <>
struct Four<unsigned short> {
  uint2 v;
  __device__ static Four at(const unsigned short *x, int64 i) { return {*(const uint2 *)(x + i)}; }
  __device__ float4 value() const { return bf16Four(v); }
};

// What a quantize converts, read at element i (one value, or four from a multiple of 4): x,
// gelu(x) under activation="gelu" (fuse-gelu-quantize: fc2's input from fc1's pre-activation), or
// gelu_backward(x, h) under activation="gelu_backward" (fc1's output gradient from its GELU's;
// SwiGLU's the same below);
// each operand in fp32 or stored in BF16 (float or unsigned short). raw(i) loads four elements
// and value(raw) computes them, so that a kernel can have the next loads in flight while it
// converts what it has.
template <typename In>
struct QuantizeX {
  const In *x;
  using Raw = Four<In>;
  __device__ float operator()(int64 i) const { return elementValue(x[i]); }
  __device__ Raw raw(int64 i) const { return Raw::at(x, i); }
  __device__ float4 value(const Raw &r) const { return r.value(); }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
template <typename In>
struct QuantizeGelu {
  const In *x;
  using Raw = Four<In>;
  __device__ float operator()(int64 i) const { return geluTanh(elementValue(x[i])); }
  __device__ Raw raw(int64 i) const { return Raw::at(x, i); }
  __device__ float4 value(const Raw &r) const {
    float4 v = r.value();
    return make_float4(geluTanh(v.x), geluTanh(v.y), geluTanh(v.z), geluTanh(v.w));
  }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
template <typename Dy, typename In>
struct QuantizeGeluGradient {
  const Dy *dy;
  const In *h;
  struct Raw {
    Four<Dy> d;
    Four<In> h;
  };
  __device__ float operator()(int64 i) const { return geluTanhGradient(elementValue(dy[i]), elementValue(h[i])); }
  __device__ Raw raw(int64 i) const { return {Four<Dy>::at(dy, i), Four<In>::at(h, i)}; }
  __device__ float4 value(const Raw &r) const {
    float4 d = r.d.value(), v = r.h.value();
    return make_float4(geluTanhGradient(d.x, v.x), geluTanhGradient(d.y, v.y), geluTanhGradient(d.z, v.z),
                       geluTanhGradient(d.w, v.w));
  }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
// swiglu(h) at element i of [rows, F] under activation="swiglu" (fc2's input from fc1's h
// [rows, 2F]: gate and up, i's row's halves), as elementwise.cuh's swiglu computes it.
template <int64 F, typename In>
struct QuantizeSwiglu {
  const In *h;
  struct Raw {
    Four<In> g, u;
  };
  __device__ static int64 gateAt(int64 i) { return i / F * 2 * F + i % F; }
  __device__ float operator()(int64 i) const {
    return swigluValue(elementValue(h[gateAt(i)]), elementValue(h[gateAt(i) + F]));
  }
  __device__ Raw raw(int64 i) const { return {Four<In>::at(h, gateAt(i)), Four<In>::at(h, gateAt(i) + F)}; }
  __device__ float4 value(const Raw &r) const {
    float4 g = r.g.value(), u = r.u.value();
    return make_float4(swigluValue(g.x, u.x), swigluValue(g.y, u.y), swigluValue(g.z, u.z), swigluValue(g.w, u.w));
  }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
// swiglu_backward(dy, h) at element i of [rows, 2F] under activation="swiglu_backward" (fc1's
// output gradient): the gate half's from dy, gate and up, the up half's from dy and gate, as
// elementwise.cuh's swigluBackward computes them (four elements lie in one half: F % 4 == 0).
template <int64 F, typename Dy, typename In>
struct QuantizeSwigluGradient {
  const Dy *dy;
  const In *h;
  struct Raw {
    Four<Dy> d;
    Four<In> g, u;
    bool up;
  };
  __device__ float operator()(int64 i) const {
    int64 r = i / (2 * F), c = i % (2 * F), j = c < F ? c : c - F;
    float d = elementValue(dy[r * F + j]), g = elementValue(h[r * 2 * F + j]);
    return c < F ? swigluGateGradient(d, g, elementValue(h[r * 2 * F + j + F])) : swigluUpGradient(d, g);
  }
  __device__ Raw raw(int64 i) const {
    int64 r = i / (2 * F), c = i % (2 * F), j = c < F ? c : c - F;
    Raw out;
    out.up = c >= F;
    out.d = Four<Dy>::at(dy, r * F + j);
    out.g = Four<In>::at(h, r * 2 * F + j);
    if (!out.up) // (the up half's gradient reads no up)
      out.u = Four<In>::at(h, r * 2 * F + j + F);
    return out;
  }
  __device__ float4 value(const Raw &r) const {
    float4 d = r.d.value(), g = r.g.value();
    if (r.up)
      return make_float4(swigluUpGradient(d.x, g.x), swigluUpGradient(d.y, g.y), swigluUpGradient(d.z, g.z),
                         swigluUpGradient(d.w, g.w));
    float4 u = r.u.value();
    return make_float4(swigluGateGradient(d.x, g.x, u.x), swigluGateGradient(d.y, g.y, u.y),
                       swigluGateGradient(d.z, g.z, u.z), swigluGateGradient(d.w, g.w, u.w));
  }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
// The loss's gradient of logits x ([rows, Cols], fp32 or BF16) at element i: (exp(x - lse) -
// onehot(target)) * g, lse the row's log-sum-exp (launch 0 of the quantize took it), g = dloss
// / rows: what loss.cuh's crossEntropyRowGradient writes, the same bits (the LM head's FP8
// output gradient, fuse-cross-entropy-quantize). raw(i) loads the four logits with their row's
// lse and target.
template <int64 Cols, typename In>
struct QuantizeCrossEntropyGradient {
  const In *x;
  const float *lse;
  const int *targets;
  float g;
  struct Raw {
    Four<In> v;
    float lse;
    int target, column;
  };
  __device__ float operator()(int64 i) const {
    int64 r = i / Cols;
    return (expf(elementValue(x[i]) - lse[r]) - (i % Cols == targets[r] ? 1.0f : 0.0f)) * g;
  }
  __device__ Raw raw(int64 i) const {
    int64 r = i / Cols;
    return {Four<In>::at(x, i), lse[r], targets[r], (int)(i % Cols)};
  }
  __device__ float4 value(const Raw &r) const {
    float4 v = r.v.value();
    int k = r.target - r.column; // the target's place among the four, if it is one of them
    return make_float4((expf(v.x - r.lse) - (k == 0 ? 1.0f : 0.0f)) * g, (expf(v.y - r.lse) - (k == 1 ? 1.0f : 0.0f)) * g,
                       (expf(v.z - r.lse) - (k == 2 ? 1.0f : 0.0f)) * g, (expf(v.w - r.lse) - (k == 3 ? 1.0f : 0.0f)) * g);
  }
  __device__ float4 four(int64 i) const { return value(raw(i)); }
};
template <int64 Cols, int64 Rows, typename In>
__device__ QuantizeCrossEntropyGradient<Cols, In> quantizeCrossEntropyGradient(const In *x, const float *lse,
                                                                              const int *targets, const float *dloss) {
  return {x, lse, targets, (float)((double)dloss[0] / Rows)};
}
template <typename In>
__device__ QuantizeX<In> quantizeX(const In *x) { return {x}; }
template <typename In>
__device__ QuantizeGelu<In> quantizeGelu(const In *x) { return {x}; }
template <typename Dy, typename In>
__device__ QuantizeGeluGradient<Dy, In> quantizeGeluGradient(const Dy *dy, const In *h) { return {dy, h}; }
template <int64 F, typename In>
__device__ QuantizeSwiglu<F, In> quantizeSwiglu(const In *h) { return {h}; }
template <int64 F, typename Dy, typename In>
__device__ QuantizeSwigluGradient<F, Dy, In> quantizeSwigluGradient(const Dy *dy, const In *h) { return {dy, h}; }
