// Training data: deterministic arithmetic progressions token_i = (a + k*i) mod vocab.
#pragma once

#include "models/ModelConfig.h"

#include <cstdint>
#include <vector>

namespace tgc {

struct Batch {
  int64_t batch = 0, seqLen = 0;
  std::vector<int32_t> tokens;  // [batch, seqLen]
  std::vector<int32_t> targets; // [batch, seqLen]: the next token of each position
};

class ArithmeticData {
public:
  ArithmeticData(int64_t vocab, int64_t seqLen, DataConfig config, uint64_t seed)
      : vocab_(vocab), seqLen_(seqLen), config_(config), seed_(seed) {}

  /// One pair in eight is held out for evaluation: training never draws it. The rule depends
  /// on (a, k) alone, so it is the same whatever the seed.
  static bool isEvalPair(int64_t a, int64_t k);
  /// Batch number `index` of the training stream: a pure function of (seed, index), so a
  /// resumed run continues the same stream from its data position.
  Batch trainBatch(int64_t index, int64_t batchSize) const;
  /// `count` held-out (a, k) pairs, drawn deterministically.
  std::vector<std::pair<int64_t, int64_t>> evalPairs(int64_t count) const;
  /// The first `length` tokens of the progression (a, k).
  std::vector<int32_t> sequence(int64_t a, int64_t k, int64_t length) const;

  /// Loss no model can beat on average: the first token and the step are unpredictable.
  double lossFloor() const;

private:
  int64_t vocab_, seqLen_;
  DataConfig config_;
  uint64_t seed_;
};

} // namespace tgc
