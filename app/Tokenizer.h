// Text to token ids and back. Hugging Face's tokenizer.json of a byte-level BPE (GPT-2's: its
// pre-tokenizer's pattern, its byte-to-character map, its merges and added tokens), as the
// `tokenizers` library encodes and decodes; SentencePiece models (app/SentencePiece.h); bytes.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tgc {

class Tokenizer {
public:
  virtual ~Tokenizer() = default;
  /// The ids of `text`, which must be valid UTF-8 (an error names the first byte that is not).
  virtual llvm::Expected<std::vector<int32_t>> encode(llvm::StringRef text) const = 0;
  /// The bytes of `ids` (a token may end inside a character: the bytes are as they come), or
  /// an error naming an id outside the vocabulary.
  virtual llvm::Expected<std::string> decode(llvm::ArrayRef<int32_t> ids) const = 0;
  /// One more than the largest id it gives.
  virtual int64_t vocabSize() const = 0;
  virtual std::string describe() const = 0;
  /// The text it was parsed from (a tokenizer.json's, or kByteTokenizer): what a checkpoint
  /// carries, and what a token cache's name digests.
  const std::string &source() const { return source_; }

private:
  friend llvm::Expected<std::unique_ptr<Tokenizer>> parseTokenizer(llvm::StringRef, llvm::StringRef);
  std::string source_;
};

/// The byte tokenizer's name (as a tokenizer's text, or as a path: --tokenizer bytes): token b
/// is byte b, what tgc train --data reads a text file as without a tokenizer.
inline constexpr llvm::StringLiteral kByteTokenizer = "bytes";

/// The tokenizer `bytes` describe (`path` names it in errors): a tokenizer.json whose model is
/// a byte-level BPE, a SentencePiece model (a .model file's bytes, or a checkpoint's
/// kSentencePiecePrefix form: app/SentencePiece.h), or kByteTokenizer.
llvm::Expected<std::unique_ptr<Tokenizer>> parseTokenizer(llvm::StringRef bytes, llvm::StringRef path);
llvm::Expected<std::unique_ptr<Tokenizer>> loadTokenizer(llvm::StringRef path);

/// Where a checkpoint's metadata keeps the text of the tokenizer its model reads and writes.
inline constexpr llvm::StringLiteral kTokenizerMeta = "tokenizer";
/// The tokenizer a checkpoint's metadata carries (`path` names the checkpoint in errors), or
/// null where it carries none.
llvm::Expected<std::unique_ptr<Tokenizer>> checkpointTokenizer(const llvm::json::Object &meta, llvm::StringRef path);

/// The token file of the text file `textPath` through `tokenizer`: made once, beside the text,
/// named by a digest of both (`TEXT.tok-HASH.u32`), and found there by later runs; its path.
llvm::Expected<std::string> tokenCache(llvm::StringRef textPath, const Tokenizer &tokenizer);

/// GPT-2's pre-tokenization of `text` (code points) into words: the pattern
/// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, each word as
/// [begin, end) of `text`.
std::vector<std::pair<size_t, size_t>> gpt2Words(llvm::ArrayRef<uint32_t> text);

} // namespace tgc
