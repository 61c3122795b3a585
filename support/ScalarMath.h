// Scalar math that the CPU reference and the GPU's kernels must compute alike, written once:
// the host includes it as C++ (backends/cpu), NVRTC compiles the same text into the kernels
// (backends/cuda/kernels/*.cuh include it; cmake/EmbedKernels.cmake embeds it with them). The
// operations and their order are the same on both sides; the libraries' tanhf and cos are each
// side's own, which may differ by an ulp (the GPU tests bound what that moves).
#pragma once

#if defined(__CUDACC__)
#define TGC_SM_FN __device__ __forceinline__
#define TGC_SM_CALLED_FN __device__ // a function the compiler inlines or calls as it sees fit
#define TGC_SM_TANHF(x) tanhf(x)
#define TGC_SM_COS(x) cos(x)
#define TGC_SM_ISFINITE(x) isfinite(x)
#define TGC_SM_ISINF(x) isinf(x)
#define TGC_SM_FLT_MAX __int_as_float(0x7f7fffff)
#define TGC_SM_FMIN(a, b) fmin(a, b)
#else
#include <cfloat>
#include <cmath>
#define TGC_SM_FN inline
#define TGC_SM_CALLED_FN inline
#define TGC_SM_TANHF(x) std::tanh(x) // the float overload: tanhf
#define TGC_SM_COS(x) std::cos(x)
#define TGC_SM_ISFINITE(x) std::isfinite(x)
#define TGC_SM_ISINF(x) std::isinf(x)
#define TGC_SM_FLT_MAX FLT_MAX
#define TGC_SM_FMIN(a, b) std::fmin(a, b)
#endif

#if !defined(__CUDACC__)
namespace tgc {
#endif

/// GELU with the tanh approximation, as GPT-2 and Transformer Engine use, and its gradient, each
/// from the tanh of its argument (geluTanhInner): where both are needed of the same x (the CPU's
/// fused MLP gradient) the tanh is computed once.
TGC_SM_FN float geluTanhInner(float x) {
  const float c = 0.7978845608028654f; // sqrt(2 / pi)
  return TGC_SM_TANHF(c * (x + 0.044715f * x * x * x));
}
TGC_SM_FN float geluTanhOf(float x, float t) { return 0.5f * x * (1.0f + t); }
/// d/dx of the GELU at x (whose geluTanhInner is t), times dy.
TGC_SM_FN float geluTanhGradientOf(float dy, float x, float t) {
  const float c = 0.7978845608028654f;
  float du = c * (1.0f + 3.0f * 0.044715f * x * x);
  return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
TGC_SM_CALLED_FN float geluTanh(float x) { return geluTanhOf(x, geluTanhInner(x)); }
TGC_SM_FN float geluTanhGradient(float dy, float x) { return geluTanhGradientOf(dy, x, geluTanhInner(x)); }

/// The FP8 scale of an amax (fp8.md): (largest / amax) / marginScale (2^margin) where amax is
/// finite and > 0, FLT_MAX for an infinite quotient, else `fallback`: delayed scaling's scale
/// from a history's amax keeps the old scale, current scaling's from the tensor's own takes 1.
TGC_SM_FN float scaleFromAmax(float amax, float largest, float marginScale, float fallback) {
  if (!TGC_SM_ISFINITE(amax) || amax <= 0.0f)
    return fallback;
  float s = (largest / amax) / marginScale;
  return TGC_SM_ISINF(s) ? TGC_SM_FLT_MAX : s;
}

/// The learning rate at 1-based `step`: linear warm-up to `lr` over `warmup` steps, then a
/// cosine decay to `minLr` at `steps` (lr_schedule; every argument a whole number but the rates).
TGC_SM_FN double learningRate(double lr, double minLr, double warmup, double steps, double step) {
  if (warmup > 0 && step <= warmup)
    return lr * step / warmup;
  if (steps <= warmup)
    return lr;
  double progress = TGC_SM_FMIN(1.0, (step - warmup) / (steps - warmup));
  return minLr + 0.5 * (lr - minLr) * (1.0 + TGC_SM_COS(3.141592653589793 * progress));
}

#if !defined(__CUDACC__)
} // namespace tgc
#endif
