#include "app/Data.h"
#include "support/Error.h"

#include "support/Random.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/xxhash.h"

#include <cmath>
#include <fmt/format.h>

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

std::string ArithmeticData::describe() const {
  return fmt::format("arithmetic progressions (a + k*i) mod {}, k in [{}, {}]", vocab_,
                     config_.minStep, config_.maxStep);
}

llvm::Expected<std::unique_ptr<TokenFileData>>
TokenFileData::open(llvm::StringRef path, int64_t vocab, int64_t seqLen, uint64_t seed) {
  auto fail = [&](const std::string &message) {
    return makeError("{}: error: {}", path.str().c_str(), message.c_str());
  };
  // Windows are drawn anywhere in the file: its size must be known, so a device or a pipe
  // (which could also never end) is refused rather than read.
  llvm::sys::fs::file_status status;
  if (std::error_code ec = llvm::sys::fs::status(path, status))
    return fail("cannot read: " + ec.message());
  if (status.type() != llvm::sys::fs::file_type::regular_file)
    return fail("not a regular file (a device, a pipe or a folder): training data must be a file of known size");
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return fail("cannot read: " + buffer.getError().message());
  auto data = std::make_unique<TokenFileData>();
  data->buffer_ = std::move(*buffer);
  data->seqLen_ = seqLen;
  data->seed_ = seed;
  llvm::StringRef bytes = data->buffer_->getBuffer();
  llvm::StringRef ext = llvm::sys::path::extension(path);
  data->u16_ = ext == ".bin" || ext == ".u16" || ext == ".tokens";
  if (data->u16_) {
    if (bytes.size() % 2)
      return fail(fmt::format("a uint16 token file must have an even size, got {} bytes", bytes.size()));
    data->tokens_ = bytes.size() / 2;
    for (uint64_t i = 0; i < data->tokens_; ++i) // one pass over the mapping, nothing kept
      if (int32_t id = data->token(i); id >= vocab)
        return fail(fmt::format("token {} at index {} is outside the model's vocabulary of {}", id, i, vocab));
  } else {
    if (vocab < 256)
      return fail(fmt::format("byte-level text needs a vocabulary of at least 256, the model has {} "
                              "(token files end in .bin, .u16 or .tokens)", vocab));
    data->tokens_ = bytes.size();
  }
  if (int64_t(data->tokens_) < seqLen + 1)
    return fail(fmt::format("{} tokens, fewer than one training window of seq_len + 1 = {}", data->tokens_,
                            seqLen + 1));
  data->description_ = fmt::format("{} ({} tokens, {})", path.str(), data->tokens_,
                                   data->u16_ ? "uint16 ids" : "bytes");
  return std::move(data);
}

Batch TokenFileData::trainBatch(int64_t index, int64_t batchSize) const {
  Batch batch;
  batch.batch = batchSize;
  batch.seqLen = seqLen_;
  Rng rng(mix64(seed_ ^ 0x7e47f11eULL) + uint64_t(index) * 0x9e3779b97f4a7c15ULL);
  uint64_t windows = tokens_ - uint64_t(seqLen_);
  for (int64_t b = 0; b < batchSize; ++b) {
    uint64_t start = rng.below(windows);
    for (int64_t i = 0; i < seqLen_; ++i) {
      batch.tokens.push_back(token(start + uint64_t(i)));
      batch.targets.push_back(token(start + uint64_t(i) + 1));
    }
  }
  return batch;
}

double ArithmeticData::lossFloor() const {
  // Position 0 predicts token 1 knowing only token 0: the step is uniform over the range.
  // Every later position is determined. Averaged over seq_len positions.
  double steps = double(config_.maxStep - config_.minStep + 1);
  return std::log(steps) / double(seqLen_);
}

std::string TokenFileData::digest() const {
  if (digest_.empty())
    digest_ = fmt::format("{:016x}", llvm::xxHash64(buffer_->getBuffer()));
  return digest_;
}

} // namespace tgc
