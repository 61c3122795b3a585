#include "support/Sampling.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tgc {

namespace {

/// The first largest logit (NaN never wins; a row of NaN gives 0).
int32_t firstLargest(const float *logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i])))
      best = i;
  return int32_t(best);
}

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
