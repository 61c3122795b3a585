#include "runtime/Data.h"

#include "runtime/Random.h"

#include <cmath>

namespace tgc {

bool ArithmeticData::isEvalPair(int64_t a, int64_t k) {
  return mix64(uint64_t(a) * 1000003ULL + uint64_t(k)) % 8 == 0;
}

std::vector<int32_t> ArithmeticData::sequence(int64_t a, int64_t k, int64_t length) const {
  std::vector<int32_t> seq(length);
  for (int64_t i = 0; i < length; ++i)
    seq[i] = int32_t((a + k * i) % vocab_);
  return seq;
}

Batch ArithmeticData::trainBatch(int64_t index, int64_t batchSize) const {
  Batch batch;
  batch.batch = batchSize;
  batch.seqLen = seqLen_;
  batch.tokens.reserve(batchSize * seqLen_);
  batch.targets.reserve(batchSize * seqLen_);
  Rng rng(mix64(seed_ ^ 0x5eed0da7aULL) + uint64_t(index) * 0x9e3779b97f4a7c15ULL);
  int64_t steps = config_.maxStep - config_.minStep + 1;
  for (int64_t b = 0; b < batchSize; ++b) {
    int64_t a = 0, k = 0;
    // Rejection keeps held-out pairs out of training; at most 1 in 8 is rejected. The bound
    // only guards degenerate configs in which every pair is held out.
    for (int tries = 0; tries < 1000; ++tries) {
      a = int64_t(rng.below(vocab_));
      k = config_.minStep + int64_t(rng.below(steps));
      if (!isEvalPair(a, k))
        break;
    }
    std::vector<int32_t> seq = sequence(a, k, seqLen_ + 1);
    batch.tokens.insert(batch.tokens.end(), seq.begin(), seq.end() - 1);
    batch.targets.insert(batch.targets.end(), seq.begin() + 1, seq.end());
  }
  return batch;
}

std::vector<std::pair<int64_t, int64_t>> ArithmeticData::evalPairs(int64_t count) const {
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (int64_t k = config_.minStep; k <= config_.maxStep; ++k)
    for (int64_t a = 0; a < vocab_; ++a)
      if (isEvalPair(a, k))
        pairs.push_back({a, k});
  // A seeded shuffle, then the first `count`.
  Rng rng(mix64(seed_ ^ 0xe7a1ULL));
  for (size_t i = pairs.size(); i > 1; --i)
    std::swap(pairs[i - 1], pairs[rng.below(i)]);
  if (int64_t(pairs.size()) > count)
    pairs.resize(count);
  return pairs;
}

double ArithmeticData::lossFloor() const {
  // Position 0 predicts token 1 knowing only token 0: the step is uniform over the range.
  // Every later position is determined. Averaged over seq_len positions.
  double steps = double(config_.maxStep - config_.minStep + 1);
  return std::log(steps) / double(seqLen_);
}

} // namespace tgc
