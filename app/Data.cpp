#include "app/Data.h"
#include "support/Error.h"

#include "support/Random.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/xxhash.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

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
  auto fail = [&](const std::string &message) { return fileError(path, "{}", message); };
  // Windows are drawn anywhere in the file: its size must be known, so a device or a pipe
  // (which could also never end) is refused rather than read.
  llvm::sys::fs::file_status status;
  if (std::error_code ec = llvm::sys::fs::status(path, status))
    return fail("cannot read: " + ec.message());
  if (status.type() != llvm::sys::fs::file_type::regular_file)
    return fail("not a regular file (a device, a pipe or a folder): training data must be a file of known size");
  auto data = std::make_unique<TokenFileData>();
  if (std::error_code ec = llvm::sys::fs::openFileForRead(path, data->fd_))
    return fail("cannot read: " + ec.message());
  data->path_ = path.str();
  data->bytes_ = status.getSize();
  data->vocab_ = vocab;
  data->seqLen_ = seqLen;
  data->seed_ = seed;
  if (auto err = data->readLayout(vocab))
    return fail(llvm::toString(std::move(err)));
  if (int64_t(data->tokens_) < seqLen + 1)
    return fail(fmt::format("{} tokens, fewer than one training window of seq_len + 1 = {}", data->tokens_,
                            seqLen + 1));
  if (auto err = data->scan())
    return std::move(err);
  const char *kind = data->width_ == 1 ? "bytes" : data->width_ == 2 ? "uint16 ids" : "uint32 ids";
  data->description_ =
      fmt::format("{} ({} tokens, {}{})", path.str(), data->tokens_, data->llmc_ ? "llm.c " : "", kind);
  return std::move(data);
}

namespace {

/// The bytes a token of a raw token file (no header) takes, by its name: .u16 (and .tokens) 2,
/// .u32 4, anything else 1, text read a byte a token.
int rawTokenWidth(llvm::StringRef path) {
  llvm::StringRef ext = llvm::sys::path::extension(path);
  return ext == ".u16" || ext == ".tokens" ? 2 : ext == ".u32" ? 4 : 1;
}

} // namespace

llvm::Error TokenFileData::readLayout(int64_t vocab) {
  llvm::StringRef ext = llvm::sys::path::extension(path_);
  if (ext == ".bin") { // llm.c's: 256 int32s (magic, version, token count, ...), then the tokens
    constexpr uint64_t kHeader = 256 * 4;
    int32_t header[3] = {};
    if (bytes_ < kHeader || ::pread(fd_, header, sizeof(header), 0) != ssize_t(sizeof(header)))
      return stringError(fmt::format("{} bytes, shorter than llm.c's 1024-byte header (.bin is llm.c's token file; "
                                     "raw token files end in .u16 or .u32)",
                                     bytes_));
    // The formats llm.c writes (dev/data/data_common.py): GPT-2's and Llama 3's.
    if (header[0] == 20240520 && header[1] == 1)
      width_ = 2;
    else if (header[0] == 20240801 && header[1] == 7)
      width_ = 4;
    else
      return stringError(fmt::format("not an llm.c token file: magic {} version {} (llm.c writes 20240520 version 1, "
                                     "uint16, and 20240801 version 7, uint32; raw token files end in .u16 or .u32)",
                                     header[0], header[1]));
    if (header[2] < 0 || kHeader + uint64_t(header[2]) * width_ != bytes_)
      return stringError(fmt::format("its llm.c header says {} tokens of {} bytes, and the file holds {} bytes after "
                                     "the header{}",
                                     header[2], width_, bytes_ - kHeader,
                                     kHeader + uint64_t(std::max(header[2], 0)) * width_ > bytes_ ? " (cut short?)"
                                                                                                 : ""));
    llmc_ = true;
    offset_ = kHeader;
    tokens_ = uint64_t(header[2]);
    return llvm::Error::success();
  }
  width_ = rawTokenWidth(path_);
  if (width_ == 1 && vocab < 256)
    return stringError(fmt::format("byte-level text needs a vocabulary of at least 256, the model has {} "
                                   "(token files end in .bin for llm.c's, .u16 or .u32)",
                                   vocab));
  if (bytes_ % width_)
    return stringError(fmt::format("a uint{} token file's size is a multiple of {}, got {} bytes", 8 * width_, width_,
                                   bytes_));
  tokens_ = bytes_ / width_;
  return llvm::Error::success();
}

TokenFileData::~TokenFileData() {
  if (fd_ >= 0)
    ::close(fd_);
}

llvm::Error TokenFileData::scan() {
  const uint64_t kPieceTokens = (uint64_t(16) << 20) / width_; // 16 MiB of the file
  std::vector<int32_t> tokens;
  std::string pieceDigests;
  for (uint64_t first = 0; first < tokens_; first += kPieceTokens) {
    tokens.resize(size_t(std::min(kPieceTokens, tokens_ - first)));
    if (auto err = readTokens(first, tokens))
      return err;
    // The digest of the bytes: tokens are the bytes decoded, so their values are hashed.
    uint64_t piece = llvm::xxHash64(llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t *>(tokens.data()),
                                                            tokens.size() * sizeof(int32_t)));
    pieceDigests.append(reinterpret_cast<const char *>(&piece), sizeof(piece));
  }
  digest_ = fmt::format("{:016x}", llvm::xxHash64(pieceDigests));
  return llvm::Error::success();
}

llvm::Error TokenFileData::readTokens(uint64_t first, llvm::MutableArrayRef<int32_t> out) const {
  const uint64_t width = width_, offset = offset_ + first * width, size = out.size() * width;
  std::vector<unsigned char> bytes(size);
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd_, bytes.data() + done, size - done, off_t(offset + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return fileError(path_, "reading bytes {}-{} failed: {}", offset, offset + size, std::strerror(errno));
    if (n == 0) {
      struct stat now {};
      std::string sizeNow = ::fstat(fd_, &now) == 0 ? fmt::format("{} bytes now", now.st_size) : "shorter now";
      return fileError(path_, "the file is {}, {} when the run began: it was cut short while training read it (byte "
                              "{} is gone)",
                       sizeNow, bytes_, offset + done);
    }
    done += uint64_t(n);
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t id = 0; // little-endian, `width` bytes
    for (uint64_t b = 0; b < width; ++b)
      id |= uint64_t(bytes[width * i + b]) << (8 * b);
    if (id >= uint64_t(vocab_))
      return fileError(path_, "token {} at index {} is outside the model's vocabulary of {}", id, first + i, vocab_);
    out[i] = int32_t(id);
  }
  return llvm::Error::success();
}

llvm::Expected<Batch> TokenFileData::batch(int64_t index, int64_t batchSize) const {
  Batch batch;
  batch.batch = batchSize;
  batch.seqLen = seqLen_;
  Rng rng(mix64(seed_ ^ 0x7e47f11eULL) + uint64_t(index) * 0x9e3779b97f4a7c15ULL);
  uint64_t windows = tokens_ - uint64_t(seqLen_);
  std::vector<int32_t> window(size_t(seqLen_ + 1));
  for (int64_t b = 0; b < batchSize; ++b) {
    if (auto err = readTokens(rng.below(windows), window))
      return std::move(err);
    batch.tokens.insert(batch.tokens.end(), window.begin(), window.end() - 1);
    batch.targets.insert(batch.targets.end(), window.begin() + 1, window.end());
  }
  return batch;
}

double ArithmeticData::lossFloor() const {
  // Position 0 predicts token 1 knowing only token 0: the step is uniform over the range.
  // Every later position is determined. Averaged over seq_len positions.
  double steps = double(config_.maxStep - config_.minStep + 1);
  return std::log(steps) / double(seqLen_);
}

bool isByteText(llvm::StringRef path) {
  return rawTokenWidth(path) == 1 && llvm::sys::path::extension(path) != ".bin";
}

} // namespace tgc
