// Training data: deterministic arithmetic progressions token_i = (a + k*i) mod vocab, or windows
// of a byte-level text file or of a uint16 token file. Batch i is a pure function of (seed, i),
// so a resumed run continues the same stream from its data position.
#pragma once

#include "models/ModelConfig.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tgc {

struct Batch {
  int64_t batch = 0, seqLen = 0;
  std::vector<int32_t> tokens;  // [batch, seqLen]
  std::vector<int32_t> targets; // [batch, seqLen]: the next token of each position
};

class DataSource {
public:
  virtual ~DataSource() = default;
  /// Batch number `index` of the training stream.
  virtual Batch trainBatch(int64_t index, int64_t batchSize) const = 0;
  virtual std::string describe() const = 0;
  /// The lowest loss a perfect model reaches on average, if known (else 0).
  virtual double lossFloor() const { return 0; }
  /// A digest of what the stream is drawn from (a file's bytes), which a checkpoint keeps so
  /// that a resumed run reads the same data; empty where describe() says it all.
  virtual std::string digest() const { return ""; }
};

class ArithmeticData : public DataSource {
public:
  ArithmeticData(int64_t vocab, int64_t seqLen, DataConfig config, uint64_t seed)
      : vocab_(vocab), seqLen_(seqLen), config_(config), seed_(seed) {}
  std::string describe() const override;

  /// One pair in eight is held out for evaluation: training never draws it. The rule depends
  /// on (a, k) alone, so it is the same whatever the seed.
  static bool isEvalPair(int64_t a, int64_t k);
  /// Batch number `index` of the training stream: a pure function of (seed, index), so a
  /// resumed run continues the same stream from its data position.
  Batch trainBatch(int64_t index, int64_t batchSize) const override;
  /// `count` held-out (a, k) pairs, drawn deterministically.
  std::vector<std::pair<int64_t, int64_t>> evalPairs(int64_t count) const;
  /// The first `length` tokens of the progression (a, k).
  std::vector<int32_t> sequence(int64_t a, int64_t k, int64_t length) const;

  /// Loss no model can beat on average: the first token and the step are unpredictable.
  double lossFloor() const override;

private:
  int64_t vocab_, seqLen_;
  DataConfig config_;
  uint64_t seed_;
};

/// Random windows of seq_len + 1 tokens from a token sequence in a file, mapped into memory
/// and decoded a window at a time (a file larger than the memory trains as well as a small one).
class TokenFileData : public DataSource {
public:
  /// `.bin`, `.u16` and `.tokens` files hold little-endian uint16 token ids; anything else is
  /// text, one token per byte (vocab >= 256).
  static llvm::Expected<std::unique_ptr<TokenFileData>> open(llvm::StringRef path, int64_t vocab,
                                                             int64_t seqLen, uint64_t seed);
  Batch trainBatch(int64_t index, int64_t batchSize) const override;
  std::string describe() const override { return description_; }
  /// xxHash64 of the file's bytes, in hex: computed at the first call (a save, a resume).
  std::string digest() const override;

private:
  int32_t token(uint64_t i) const {
    const unsigned char *bytes = reinterpret_cast<const unsigned char *>(buffer_->getBufferStart());
    return u16_ ? int32_t(bytes[2 * i]) | (int32_t(bytes[2 * i + 1]) << 8) : int32_t(bytes[i]);
  }

  std::unique_ptr<llvm::MemoryBuffer> buffer_; // the file, mapped
  bool u16_ = false;
  uint64_t tokens_ = 0;
  int64_t seqLen_ = 0;
  uint64_t seed_ = 0;
  std::string description_;
  mutable std::string digest_;
};

} // namespace tgc
