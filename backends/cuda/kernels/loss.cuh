// Cross-entropy (fused log-softmax and NLL) and NLL loss over rows of logits, and their
// gradients: the mean over rows taken in row order, in double; a row's log-sum-exp in float.
#pragma once

#include "common.cuh"

// A row's max and its sum of exp(x - max), taken online in one read of the row (each thread
// rescales its sum when its max grows; four elements a load where rows are 16-byte aligned),
// then combined over the block in a fixed tree: the same bits on every run.
struct MaxExpSum {
  float max, sum;
};
__device__ MaxExpSum combineMaxExpSum(MaxExpSum a, MaxExpSum b) {
  float max = fmaxf(a.max, b.max);
  if (max == __int_as_float(0xff800000))
    return a;
  return {max, a.sum * expf(a.max - max) + b.sum * expf(b.max - max)};
}
__device__ __forceinline__ MaxExpSum shuffleXor(MaxExpSum value, int offset) {
  return {shuffleXor(value.max, offset), shuffleXor(value.sum, offset)};
}
__device__ __forceinline__ void addToMaxExpSum(MaxExpSum &acc, float4 x) {
  float max = fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w));
  if (max > acc.max) {
    acc.sum *= expf(acc.max - max);
    acc.max = max;
  }
  acc.sum += (expf(x.x - acc.max) + expf(x.y - acc.max)) + (expf(x.z - acc.max) + expf(x.w - acc.max));
}
// Rows of logits in fp32, or in BF16 where the GEMM that writes them stores them so
// (CudaProgram::bf16Rounding): four a load (common.cuh's load4) where rows are aligned.
template <int64 Vocab, typename In>
__device__ MaxExpSum rowMaxExpSum(const In *row) {
  __shared__ MaxExpSum shared[256];
  MaxExpSum acc = {__int_as_float(0xff800000), 0.0f};
  const float inf = __int_as_float(0xff800000);
  if (Vocab % 4 == 0) {
    for (int j = threadIdx.x; j < Vocab / 4; j += blockDim.x) addToMaxExpSum(acc, load4(row, 4 * j));
  } else {
    for (int j = threadIdx.x; j < Vocab; j += blockDim.x)
      addToMaxExpSum(acc, make_float4(elementValue(row[j]), inf, inf, inf));
  }
  return blockReduce(acc, shared, combineMaxExpSum);
}

// Launch 0, one block per row: logsumexp(row) - row[target] into scratch (doubles).
template <int64 Vocab, typename In>
__device__ void crossEntropyRows(const In *logits, const int *targets, float *scratch) {
  const In *row = logits + (int64)blockIdx.x * Vocab;
  MaxExpSum total = rowMaxExpSum<Vocab>(row);
  if (threadIdx.x == 0)
    ((double *)scratch)[blockIdx.x] =
        (double)total.max + log((double)total.sum) - elementValue(row[targets[blockIdx.x]]);
}

// Launch 0 of an FP8 head's gradient quantize (fuse-cross-entropy-quantize), one block per row:
// the row's loss into scratch as crossEntropyRows writes it, and its log-sum-exp, as
// crossEntropyBackward takes it, into lse (the quantize's cast-transpose reads it).
template <int64 Vocab, typename In>
__device__ void crossEntropyRowsAndLse(const In *logits, const int *targets, float *scratch, float *lse) {
  const In *row = logits + (int64)blockIdx.x * Vocab;
  MaxExpSum total = rowMaxExpSum<Vocab>(row);
  if (threadIdx.x == 0) {
    double logSum = (double)total.max + log((double)total.sum);
    ((double *)scratch)[blockIdx.x] = logSum - elementValue(row[targets[blockIdx.x]]);
    lse[blockIdx.x] = (float)logSum;
  }
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

// One row's dlogits = (softmax(row) - onehot(target)) * g, from the row's log-sum-exp: four
// values a load and a store where rows are 16-byte aligned.
template <int64 Vocab, typename In, typename Out>
__device__ void crossEntropyRowGradient(const In *row, int target, float logSum, float g, Out out) {
  if (Vocab % 4 == 0) {
    for (int j = threadIdx.x; j < Vocab / 4; j += blockDim.x) {
      float4 x = load4(row, 4 * j);
      int k = 4 * j;
      store4(out, k, make_float4((expf(x.x - logSum) - (k == target ? 1.0f : 0.0f)) * g,
                                 (expf(x.y - logSum) - (k + 1 == target ? 1.0f : 0.0f)) * g,
                                 (expf(x.z - logSum) - (k + 2 == target ? 1.0f : 0.0f)) * g,
                                 (expf(x.w - logSum) - (k + 3 == target ? 1.0f : 0.0f)) * g));
    }
  } else {
    for (int j = threadIdx.x; j < Vocab; j += blockDim.x)
      out[j] = (expf(elementValue(row[j]) - logSum) - (j == target ? 1.0f : 0.0f)) * g;
  }
}

// dlogits = (softmax(row) - onehot(target)) * dloss / Rows, one block per row: the row read
// twice (its log-sum-exp, then the gradient), written once.
template <int64 Vocab, int64 Rows, typename In, typename Out>
__device__ void crossEntropyBackward(const float *dloss, const In *logits, const int *targets, Out dlogits) {
  int64 base = (int64)blockIdx.x * Vocab;
  const In *row = logits + base;
  MaxExpSum total = rowMaxExpSum<Vocab>(row);
  float logSum = (float)((double)total.max + log((double)total.sum));
  crossEntropyRowGradient<Vocab>(row, targets[blockIdx.x], logSum, (float)((double)dloss[0] / Rows), dlogits + base);
}

// Launch 0 of the loss with its gradient (fuse-cross-entropy-grad), one block per row: the
// row's loss into scratch as crossEntropyRows writes it, and its dlogits as
// crossEntropyBackward writes them, from one log-sum-exp (the same bits as the two kernels).
template <int64 Vocab, int64 Rows, typename In, typename Out>
__device__ void crossEntropyRowsWithGradient(const In *logits, const int *targets, const float *dloss, Out dlogits,
                                             float *scratch) {
  int64 base = (int64)blockIdx.x * Vocab;
  const In *row = logits + base;
  MaxExpSum total = rowMaxExpSum<Vocab>(row);
  int target = targets[blockIdx.x];
  if (threadIdx.x == 0)
    ((double *)scratch)[blockIdx.x] = (double)total.max + log((double)total.sum) - elementValue(row[target]);
  float logSum = (float)((double)total.max + log((double)total.sum));
  crossEntropyRowGradient<Vocab>(row, target, logSum, (float)((double)dloss[0] / Rows), dlogits + base);
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
