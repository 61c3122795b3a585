// Softmax and log-softmax over the last axis, the causal softmax of scaled scores, and their
// gradients. One block of 256 threads per row; the max in float, the sum of exponentials in
// double, both in a fixed order.
#pragma once

#include "common.cuh"

// The max of value(j) over j < end, and the sum of exp(value(j) - max), for the whole block.
template <typename Value>
__device__ void rowMaxAndExpSum(int64 end, Value value, float &max, double &sum) {
  __shared__ double shared[256];
  __shared__ float sharedMax[256];
  max = __int_as_float(0xff800000);
  for (int j = threadIdx.x; j < end; j += blockDim.x) max = fmaxf(max, value(j));
  max = blockMax(max, sharedMax);
  sum = 0;
  for (int j = threadIdx.x; j < end; j += blockDim.x) sum += exp((double)value(j) - max);
  sum = blockSum(sum, shared);
}

template <bool Log, int64 D, typename Out>
__device__ void softmax(const float *x, Out out) {
  const float *row = x + (int64)blockIdx.x * D;
  auto dst = out + (int64)blockIdx.x * D;
  float max;
  double sum;
  rowMaxAndExpSum(D, [&](int j) { return row[j]; }, max, sum);
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    if (Log)
      dst[j] = (float)((double)row[j] - max - log(sum));
    else
      dst[j] = (float)(exp((double)row[j] - max) / sum);
  }
}

// softmax(scale * scores) over the keys up to each query of [..., T, T] scores (the row's
// query is row % T); the keys after it are neither read nor summed and come out 0: the bits of
// scale, causal_mask and softmax unfused.
template <int64 T, typename Out>
__device__ void maskedSoftmax(const float *x, Out out, float scale) {
  const float *row = x + (int64)blockIdx.x * T;
  auto dst = out + (int64)blockIdx.x * T;
  int visible = (int)(blockIdx.x % T) + 1; // keys up to the query
  auto scaled = [&](int j) { return row[j] * scale; };
  float max;
  double sum;
  rowMaxAndExpSum(visible, scaled, max, sum);
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    dst[j] = j < visible ? (float)(exp((double)scaled(j) - max) / sum) : 0.0f;
}

// The gradient of softmax (Log: of log-softmax) given its output y. Masked: the gradient of
// masked_softmax, 0 after the query, then times the scale.
template <bool Log, bool Masked, int64 D, typename Out>
__device__ void softmaxBackward(const float *dy, const float *y, Out dx, float scale) {
  __shared__ double shared[256];
  int64 base = (int64)blockIdx.x * D;
  int visible = Masked ? (int)(blockIdx.x % D) + 1 : 0;
  double partial = 0;
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    if (Log)
      partial += dy[base + j];
    else
      partial += (double)dy[base + j] * y[base + j];
  }
  double total = blockSum(partial, shared);
  for (int j = threadIdx.x; j < D; j += blockDim.x) {
    if (Log)
      dx[base + j] = (float)(dy[base + j] - exp((double)y[base + j]) * total);
    else if (Masked)
      dx[base + j] = j < visible ? (float)(y[base + j] * (dy[base + j] - total)) * scale : 0.0f;
    else
      dx[base + j] = (float)(y[base + j] * (dy[base + j] - total));
  }
}
