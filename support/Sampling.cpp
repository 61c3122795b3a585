#include "support/Sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tgc {

void packSampling(const SamplingParams &params, float sampling[3], int32_t seed[2]) {
  sampling[0] = params.temperature;
  sampling[1] = params.topP;
  sampling[2] = float(params.topK);
  seed[0] = int32_t(uint32_t(params.seed));
  seed[1] = int32_t(uint32_t(params.seed >> 32));
}

SamplingParams unpackSampling(const float sampling[3], const int32_t seed[2]) {
  SamplingParams params;
  params.temperature = sampling[0];
  params.topP = sampling[1];
  params.topK = samplingTopK(sampling[2], int64_t(1) << 62); // (0 for any k out of range)
  params.seed = uint64_t(uint32_t(seed[0])) | uint64_t(uint32_t(seed[1])) << 32;
  return params;
}

int32_t firstLargest(const float *values, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (values[i] > values[best] || (std::isnan(values[best]) && !std::isnan(values[i])))
      best = i;
  return int32_t(best);
}

namespace {

/// The largest key t such that the tokens of key >= t weigh at least `target` (a count where
/// `weights` is empty): walking the keys from the largest, the key at which the running weight
/// reaches it.
unsigned thresholdKey(const std::vector<unsigned> &keys, const std::vector<unsigned long long> &weights,
                      unsigned long long target) {
  std::vector<int64_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = int64_t(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return keys[a] > keys[b]; });
  unsigned long long running = 0;
  for (int64_t i : order) {
    running += weights.empty() ? 1 : weights[i];
    if (running >= target)
      return keys[i];
  }
  return 0;
}

} // namespace

int32_t sampleRow(const float *logits, int64_t vocab, const SamplingParams &params, int64_t row, int64_t counter) {
  int32_t best = firstLargest(logits, vocab);
  if (!(params.temperature > 0))
    return best;
  std::vector<unsigned> keys(vocab);
  for (int64_t i = 0; i < vocab; ++i)
    keys[i] = samplingKey(logits[i]);
  unsigned lowest = 0; // the smallest key kept
  if (params.topK > 0 && params.topK < vocab)
    lowest = thresholdKey(keys, {}, (unsigned long long)params.topK);
  std::vector<unsigned long long> weights(vocab, 0);
  unsigned long long total = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (keys[i] >= lowest)
      total += weights[i] = samplingWeight(logits[i], logits[best], params.temperature);
  if (total == 0) // no finite logit
    return best;
  if (params.topP < 1) {
    lowest = thresholdKey(keys, weights, samplingMassTarget(total, params.topP));
    total = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (keys[i] < lowest)
        weights[i] = 0;
      total += weights[i];
    }
  }
  unsigned long long draw = samplingDraw(params.seed, row, counter, total), running = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if ((running += weights[i]) > draw)
      return int32_t(i);
  return best; // (not reached: the draw is below the total)
}

} // namespace tgc
