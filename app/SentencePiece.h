// SentencePiece tokenizers (Debian's libsentencepiece-dev), reached through tgc's plugin
// libtgc_sentencepiece.so (plugins/sentencepiece/), which tgc opens at run time: tgc builds and
// runs without SentencePiece, and says what is missing when a SentencePiece tokenizer is asked for.
#pragma once

#include "app/Tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>

namespace tgc {

/// How a checkpoint's metadata and a token cache's digest name a SentencePiece model: this prefix,
/// then the .model file's bytes in base64 (the metadata is JSON text).
inline constexpr llvm::StringLiteral kSentencePiecePrefix = "sentencepiece:";

/// The SentencePiece model whose serialized bytes (a .model file's) are `bytes` (`path` names it
/// in errors).
llvm::Expected<std::unique_ptr<Tokenizer>> parseSentencePiece(llvm::StringRef bytes, llvm::StringRef path);

struct SentencePieceTraining {
  int64_t vocab = 0;
  std::string modelType = "bpe"; // bpe | unigram
  /// Characters the pieces cover (SentencePiece's character_coverage); the rest are spelled by
  /// byte pieces.
  double characterCoverage = 0.9995;
};

/// Trains a SentencePiece model on the lines of the text file `corpus`, as a language model's
/// tokenizer wants it (Llama's settings): no normalization and no dummy prefix, so that decoding
/// gives back the text encoded, byte by byte; digits split; bytes no piece covers spelled by
/// byte pieces. Its serialized bytes, for a .model file.
llvm::Expected<std::string> trainSentencePiece(llvm::StringRef corpus, const SentencePieceTraining &training);

/// Whether SentencePiece can be reached (the plugin found and opened), or why not.
llvm::Error sentencePieceAvailable();

} // namespace tgc
