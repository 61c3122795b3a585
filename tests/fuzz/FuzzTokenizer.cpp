// libFuzzer target: the byte-level BPE tokenizer (app/Tokenizer.h) on any bytes as text. A
// finding is a crash, a hang, a sanitizer report, text that is valid UTF-8 and does not come
// back from decode(encode(text)) as it was, or invalid UTF-8 that encodes without an error.
#include "app/Tokenizer.h"
#include "support/Unicode.h"

#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

/// A byte-level tokenizer.json: the 256 byte characters, merges over them (a few joins of
/// common pairs, and joins of joins), <|endoftext|> added.
std::string fixture() {
  std::string vocab, merges;
  uint32_t next = 256;
  std::vector<std::string> chars;
  for (uint32_t b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    std::string c;
    tgc::appendUtf8(printable ? b : next++, c);
    chars.push_back(c);
  }
  auto quoted = [](const std::string &s) { return "\"" + (s == "\"" ? "\\\"" : s == "\\" ? "\\\\" : s) + "\""; };
  for (size_t i = 0; i < chars.size(); ++i)
    vocab += (i ? ", " : "") + quoted(chars[i]) + ": " + std::to_string(i);
  const char *pairs[][2] = {{"t", "h"}, {"th", "e"}, {"Ġ", "t"}, {"Ġt", "he"}, {"i", "n"}, {"e", "r"}, {"Ġ", "Ġ"},
                            {"ĠĠ", "ĠĠ"}, {"Ã", "©"}, {"Ċ", "Ċ"}};
  int id = 256;
  for (auto &p : pairs) {
    vocab += ", " + quoted(std::string(p[0]) + p[1]) + ": " + std::to_string(id++);
    merges += std::string(merges.empty() ? "" : ", ") + "\"" + p[0] + " " + p[1] + "\"";
  }
  return "{\"added_tokens\": [{\"id\": " + std::to_string(id) + ", \"content\": \"<|endoftext|>\"}], "
         "\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {" + vocab +
         "}, \"merges\": [" + merges + "]}}";
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static std::unique_ptr<tgc::Tokenizer> tokenizer = [] {
    auto t = tgc::parseTokenizer(fixture(), "fixture.json");
    if (!t)
      std::abort(); // the fixture itself
    return std::move(*t);
  }();
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  auto decoded = tgc::decodeUtf8(text);
  bool valid = bool(decoded);
  if (!valid)
    llvm::consumeError(decoded.takeError());
  auto ids = tokenizer->encode(text);
  if (!ids) {
    llvm::consumeError(ids.takeError());
    if (valid)
      std::abort();
    return 0;
  }
  if (!valid)
    std::abort();
  auto back = tokenizer->decode(*ids);
  if (!back || *back != text)
    std::abort();
  return 0;
}
