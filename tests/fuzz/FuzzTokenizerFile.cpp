// libFuzzer target: the tokenizer file reader (tokenizer.json: byte-level BPE and its added
// tokens), on any bytes. A finding is a crash, a hang or a sanitizer report, in the reader or
// in encoding and decoding a fixed text with what it accepted.
#include "app/Tokenizer.h"

#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef bytes(reinterpret_cast<const char *>(data), size);
  auto tokenizer = tgc::parseTokenizer(bytes, "fuzz-tokenizer.json");
  if (!tokenizer) {
    llvm::consumeError(tokenizer.takeError());
    return 0;
  }
  // Text that touches merges, spaces, newlines, multi-byte characters and the end-of-text token.
  auto ids = (*tokenizer)->encode("the then  there\n\ncafé <|endoftext|> ∑x");
  if (!ids) {
    llvm::consumeError(ids.takeError());
    return 0;
  }
  auto text = (*tokenizer)->decode(*ids);
  if (!text)
    llvm::consumeError(text.takeError());
  return 0;
}
