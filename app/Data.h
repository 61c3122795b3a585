// Training data: deterministic arithmetic progressions token_i = (a + k*i) mod vocab, or windows
// of a byte-level text file or of a uint16 token file. Batch i is a pure function of (seed, i),
// so a resumed run continues the same stream from its data position.
#pragma once

#include "models/ModelConfig.h"

#include "llvm/Support/Error.h"
#include "llvm/ADT/ArrayRef.h"

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
  /// Batch number `index` of the training stream; an error where its source can no longer be
  /// read (a file that shrank during the run).
  virtual llvm::Expected<Batch> batch(int64_t index, int64_t batchSize) const = 0;
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
  Batch trainBatch(int64_t index, int64_t batchSize) const;
  llvm::Expected<Batch> batch(int64_t index, int64_t batchSize) const override {
    return trainBatch(index, batchSize);
  }
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

/// Whether TokenFileData reads `path` as text, a token a byte (not a token file by its name).
bool isByteText(llvm::StringRef path);

/// Random windows of seq_len + 1 tokens from a token sequence in a file, read a window at a time
/// (a file larger than the memory trains as well as a small one). Read, not mapped: a file cut
/// short during the run is an error at the next batch, where a mapping would end in SIGBUS.
class TokenFileData : public DataSource {
public:
  /// `.bin` is llm.c's token file (its 1024-byte header, then uint16 or uint32 ids, as the
  /// header says); `.u16` and `.tokens` files hold little-endian uint16 ids, `.u32` uint32 ids;
  /// anything else is text, one token per byte (vocab >= 256).
  static llvm::Expected<std::unique_ptr<TokenFileData>> open(llvm::StringRef path, int64_t vocab,
                                                             int64_t seqLen, uint64_t seed);
  llvm::Expected<Batch> batch(int64_t index, int64_t batchSize) const override;
  std::string describe() const override { return description_; }
  /// The file's bytes by xxHash64 (of the xxHash64s of its 16 MiB pieces), in hex, from the
  /// pass over the file that open() makes.
  std::string digest() const override { return digest_; }
  ~TokenFileData() override;

private:
  /// Reads tokens [first, first + out.size()) into `out`, each checked against the vocabulary.
  llvm::Error readTokens(uint64_t first, llvm::MutableArrayRef<int32_t> out) const;
  /// One pass over the file: every token checked, the digest computed.
  llvm::Error scan();
  /// Where the tokens are and how wide, from the extension (and llm.c's header).
  llvm::Error readLayout(int64_t vocab);

  int fd_ = -1;
  std::string path_;
  bool llmc_ = false;
  uint64_t width_ = 1, offset_ = 0; // bytes a token; where the first is
  uint64_t bytes_ = 0, tokens_ = 0;
  int64_t vocab_ = 0, seqLen_ = 0;
  uint64_t seed_ = 0;
  std::string description_, digest_;
};

} // namespace tgc
