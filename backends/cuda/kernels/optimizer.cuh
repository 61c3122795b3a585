// The optimizer's kernels: gradient clipping's scale, the learning-rate schedule, AdamW, and
// the gradient norm over all gradients of the contiguous gradient buffer at once.
#pragma once

#include "ScalarMath.h"
#include "common.cuh"

// clip = min(1, maxNorm / (||g|| + 1e-6)); 1 when clipping is off; 0 when ||g|| is not finite,
// which tells adamw to skip the step (nothing changes), without the host looking.
template <bool Clip>
__device__ void clipScale(const float *sumSquares, float *clip, double maxNorm) {
  double norm = sqrt((double)sumSquares[0]);
  if (!isfinite(norm))
    clip[0] = 0.0f;
  else if (Clip)
    clip[0] = (float)fmin(1.0, maxNorm / (norm + 1e-6));
  else
    clip[0] = 1.0f;
}

// Linear warm-up, then cosine decay to min_lr. The settings come from memory (schedule: lr,
// min_lr, warmup, steps), so that programs that differ only in them share one compiled module.
__device__ void lrSchedule(const int *step, float *lr, const double *schedule) {
  lr[0] = (float)learningRate(schedule[0], schedule[1], schedule[2], schedule[3], step[0]);
}

// torch.optim.AdamW's arithmetic for one thread: the bias corrections in double once, each
// element's update in float. scale 0 is clip_scale's skip (the gradients are not finite): then
// nothing changes. The flat kernel and the FP8 weights' cast (QuantizeAdamW) share it, so the
// two give the same bits.
struct AdamWStep {
  float rate, scale, stepSize, bc2Sqrt, beta1, beta2, eps;
  __device__ AdamWStep(const float *lr, const float *clip, const int *step, double b1, double b2, float epsilon) {
    double bc1 = 1.0 - pow(b1, (double)step[0]), bc2 = 1.0 - pow(b2, (double)step[0]);
    rate = lr[0], scale = clip[0];
    stepSize = (float)(rate / bc1), bc2Sqrt = (float)sqrt(bc2);
    beta1 = (float)b1, beta2 = (float)b2, eps = epsilon;
  }
  __device__ bool skips() const { return scale == 0.0f; }
  // The decayed weight's multiplier (1 without weight decay).
  __device__ float decay(double weightDecay) const { return (float)(1.0 - (double)rate * weightDecay); }
  // Element (p, g, m, v): m and v updated in place, the new weight returned. Each operation
  // rounded on its own (no multiply-add contracted, as the CPU's): ptxas contracts a plain
  // multiply and add where its schedule allows, which differs from one kernel to another.
  __device__ float update(float param, float grad, float &m, float &v, float decay) const {
    float g = __fmul_rn(grad, scale), p = __fmul_rn(param, decay);
    m = __fadd_rn(m, __fmul_rn(1.0f - beta1, __fsub_rn(g, m)));
    v = __fadd_rn(__fmul_rn(v, beta2), __fmul_rn(__fmul_rn(1.0f - beta2, g), g));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), bc2Sqrt), eps);
    return __fsub_rn(p, __fmul_rn(stepSize, __fdiv_rn(m, denom)));
  }
};

// torch.optim.AdamW over Count elements (AdamWStep). The first Decayed elements have weight
// decay (the grouped launch over all parameters puts the decayed ones first; one parameter has
// Decayed = Count). ParamOut F32Bf16Out: the new parameters' BF16 copy too, which the next
// step's BF16 GEMMs read.
template <int64 Count, int64 Decayed, class ParamOut>
__device__ void adamw(const float *param, const float *grad, const float *m, const float *v, const float *lr,
                      const float *clip, const int *step, ParamOut newParam, float *newM, float *newV,
                      double beta1, double beta2, float eps, double weightDecay) {
  AdamWStep adam(lr, clip, step, beta1, beta2, eps);
  if (adam.skips()) {
    FOR_EACH_ELEMENT(i, Count) {
      newParam[i] = param[i];
      newM[i] = m[i];
      newV[i] = v[i];
    }
    return;
  }
  float decayed = adam.decay(weightDecay), kept = adam.decay(0.0);
  FOR_EACH_ELEMENT(i, Count) {
    float mi = m[i], vi = v[i];
    newParam[i] = adam.update(param[i], grad[i], mi, vi, i < Decayed ? decayed : kept);
    newM[i] = mi;
    newV[i] = vi;
  }
}

// The source of an FP8 weight's cast that makes the AdamW update it casts (the flat kernel
// leaves that weight to it; lowering/AdamWCast.cpp): element i's moments and new weight written as
// adamw writes them, the new weight returned to be cast. fp8.cuh's quantizeBlocks reads each
// element once, through four(i) or (i), so each is updated once.
template <class ParamOut>
struct QuantizeAdamW {
  const float *param, *grad, *m, *v;
  ParamOut newParam;
  float *newM, *newV;
  AdamWStep adam;
  float decay;
  __device__ float operator()(int64 i) const {
    float mi = m[i], vi = v[i], p = adam.skips() ? param[i] : adam.update(param[i], grad[i], mi, vi, decay);
    newParam[i] = p;
    newM[i] = mi;
    newV[i] = vi;
    return p;
  }
  __device__ float4 four(int64 i) const {
    float4 p = load4(param, i), mi = load4(m, i), vi = load4(v, i);
    if (!adam.skips()) {
      float4 g = load4(grad, i);
      p = make_float4(adam.update(p.x, g.x, mi.x, vi.x, decay), adam.update(p.y, g.y, mi.y, vi.y, decay),
                      adam.update(p.z, g.z, mi.z, vi.z, decay), adam.update(p.w, g.w, mi.w, vi.w, decay));
    }
    store4(newParam, i, p);
    store4(newM, i, mi);
    store4(newV, i, vi);
    return p;
  }
};
template <class ParamOut>
__device__ QuantizeAdamW<ParamOut> quantizeAdamW(const float *param, const float *grad, const float *m, const float *v,
                                                 const float *lr, const float *clip, const int *step,
                                                 ParamOut newParam, float *newM, float *newV, double beta1,
                                                 double beta2, float eps, double weightDecay) {
  AdamWStep adam(lr, clip, step, beta1, beta2, eps);
  return {param, grad, m, v, newParam, newM, newV, adam, adam.decay(weightDecay)};
}

// The tensor whose blocks this block is among: `tensors` holds 4 doubles a tensor, the first
// block of each at field 3 (ascending).
template <int64 Tensors>
__device__ __forceinline__ int tensorOfBlock(const double *tensors) {
  int t = 0;
  for (int lo = 1, hi = Tensors - 1; lo <= hi;) { // the last tensor whose first block <= this one
    int mid = (lo + hi) / 2;
    if ((int64)tensors[4 * mid + 3] <= blockIdx.x) t = mid, lo = mid + 1; else hi = mid - 1;
  }
  return t;
}

// ZeRO's shards of Tensors parameters, one launch: tensor t's parameter at addresses[2t] and
// its shard at addresses[2t + 1] (the executor's table), `tensors` {count, part, first
// element, first block} for each (the constants): the shard's element i is the flattened
// parameter's element first + i, zero past its end, as the per-op shard (layout.cuh's pad).
template <int64 Tensors>
__device__ void shardTensors(const double *tensors, const unsigned long long *addresses) {
  const int t = tensorOfBlock<Tensors>(tensors);
  const float *x = (const float *)addresses[2 * t];
  float *out = (float *)addresses[2 * t + 1];
  const int64 count = (int64)tensors[4 * t], part = (int64)tensors[4 * t + 1], first = (int64)tensors[4 * t + 2];
  const int64 block = (int64)tensors[4 * t + 3], blocks = (t + 1 < Tensors ? (int64)tensors[4 * t + 7] : gridDim.x) - block;
  const int64 perBlock = (part + blocks - 1) / blocks, begin = (blockIdx.x - block) * perBlock;
  const int64 end = begin + perBlock < part ? begin + perBlock : part;
  for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x)
    out[i] = first + i < count ? x[first + i] : 0.0f;
}

// AdamW over Tensors tensors that lie apart (ZeRO's shards), one launch: tensor t's parameter,
// gradient, moments and new parameter at addresses[5t .. 5t + 4] (the executor's table; the
// moments updated in place), and `tensors` {count, elements per block, decayed (0 or 1), first
// block} for each (the constants). Each block updates a range of one tensor with the per-op
// adamw's arithmetic, so the same bits.
template <int64 Tensors>
__device__ void adamwTensors(const float *lr, const float *clip, const int *step, const double *tensors,
                             const unsigned long long *addresses, double beta1, double beta2, float eps,
                             double weightDecay) {
  const int t = tensorOfBlock<Tensors>(tensors);
  const float *param = (const float *)addresses[5 * t], *grad = (const float *)addresses[5 * t + 1];
  float *m = (float *)addresses[5 * t + 2], *v = (float *)addresses[5 * t + 3], *newParam = (float *)addresses[5 * t + 4];
  const int64 count = (int64)tensors[4 * t], perBlock = (int64)tensors[4 * t + 1];
  const int64 begin = (blockIdx.x - (int64)tensors[4 * t + 3]) * perBlock;
  const int64 end = begin + perBlock < count ? begin + perBlock : count;
  AdamWStep adam(lr, clip, step, beta1, beta2, eps);
  const float decay = adam.decay(tensors[4 * t + 2] != 0.0 ? weightDecay : 0.0);
  for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) {
    if (adam.skips()) {
      newParam[i] = param[i];
      continue;
    }
    float mi = m[i], vi = v[i];
    newParam[i] = adam.update(param[i], grad[i], mi, vi, decay);
    m[i] = mi;
    v[i] = vi;
  }
}

// The gradient norm's sums of squares over Tensors gradients, the chain of adds that follows
// them taken in one kernel. `tensors` holds, for each gradient in the order the adds take it,
// {offset, count, elements per block, first block} (as doubles: the executor's constants): the
// offset into the gradient buffer `grads`, or where the gradients lie apart (ZeRO's shards)
// none, each at its entry of `addresses` (the executor's table). Launch 0: each block sums the
// squares of a contiguous range of one gradient, as sumSquaresPartials does for that gradient
// alone.
template <int64 Tensors>
__device__ void gradNormPartials(const float *grads, float *scratch, const double *tensors,
                                 const unsigned long long *addresses = nullptr) {
  __shared__ double shared[256];
  double *partial = (double *)scratch;
  const int t = tensorOfBlock<Tensors>(tensors);
  const float *x = addresses ? (const float *)addresses[t] : grads + (int64)tensors[4 * t];
  int64 count = (int64)tensors[4 * t + 1], perBlock = (int64)tensors[4 * t + 2];
  int64 begin = (blockIdx.x - (int64)tensors[4 * t + 3]) * perBlock, end = begin + perBlock < count ? begin + perBlock : count;
  double sum = 0;
  for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) sum += (double)x[i] * x[i];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Launch 1, one block: each gradient's sum of its partials, then the adds, in float.
template <int64 Tensors, int64 Blocks>
__device__ void gradNormTotal(float *out, const float *scratch, const double *tensors) {
  __shared__ double shared[256];
  const double *partial = (const double *)scratch;
  float total = 0.0f;
  for (int t = 0; t < Tensors; ++t) {
    int64 first = (int64)tensors[4 * t + 3], blocks = (t + 1 < Tensors ? (int64)tensors[4 * (t + 1) + 3] : Blocks) - first;
    double sum = 0;
    for (int64 i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[first + i];
    sum = blockSum(sum, shared);
    total = t == 0 ? (float)sum : total + (float)sum;
  }
  if (threadIdx.x == 0) out[0] = total;
}
