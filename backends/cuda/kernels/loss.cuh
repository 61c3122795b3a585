// Cross-entropy (fused log-softmax and NLL) and NLL loss over rows of logits, and their
// gradients: the mean over rows taken in row order, in double.
#pragma once

#include "softmax.cuh"

// Launch 0, one block per row: logsumexp(row) - row[target] into scratch (doubles).
template <int64 Vocab>
__device__ void crossEntropyRows(const float *logits, const int *targets, float *scratch) {
  const float *row = logits + (int64)blockIdx.x * Vocab;
  float max;
  double sum;
  rowMaxAndExpSum(Vocab, [&](int j) { return row[j]; }, max, sum);
  if (threadIdx.x == 0)
    ((double *)scratch)[blockIdx.x] = (double)max + log(sum) - row[targets[blockIdx.x]];
}

// Launch 1, one block: the mean of the rows' losses.
template <int64 Rows>
__device__ void crossEntropyMean(float *loss, const float *scratch) {
  __shared__ double shared[256];
  double sum = 0;
  for (int64 r = threadIdx.x; r < Rows; r += blockDim.x) sum += ((const double *)scratch)[r];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) loss[0] = (float)(sum / Rows);
}

// dlogits = (softmax(row) - onehot(target)) * dloss / Rows, one block per row.
template <int64 Vocab, int64 Rows, typename Out>
__device__ void crossEntropyBackward(const float *dloss, const float *logits, const int *targets, Out dlogits) {
  int64 base = (int64)blockIdx.x * Vocab;
  const float *row = logits + base;
  float max;
  double sum;
  rowMaxAndExpSum(Vocab, [&](int j) { return row[j]; }, max, sum);
  double logSum = (double)max + log(sum);
  double g = (double)dloss[0] / Rows;
  int target = targets[blockIdx.x];
  for (int j = threadIdx.x; j < Vocab; j += blockDim.x)
    dlogits[base + j] = (float)((exp((double)row[j] - logSum) - (j == target ? 1.0 : 0.0)) * g);
}

// -mean(logp[r, target[r]]), one block.
template <int64 Vocab, int64 Count>
__device__ void nllLoss(const float *logp, const int *targets, float *loss) {
  __shared__ double shared[256];
  double sum = 0;
  for (int64 r = threadIdx.x; r < Count; r += blockDim.x) sum -= logp[r * Vocab + targets[r]];
  sum = blockSum(sum, shared);
  if (threadIdx.x == 0) loss[0] = (float)(sum / Count);
}

template <int64 Vocab, int64 Count, int64 Elements, typename Out>
__device__ void nllLossBackward(const float *dloss, const float *logp, const int *targets, Out dlogp) {
  FOR_EACH_ELEMENT(i, Elements)
    dlogp[i] = (i % Vocab == targets[i / Vocab]) ? (float)(-(double)dloss[0] / Count) : 0.0f;
}
