// tgc tokenize: text through a tokenizer into ids (printed, or a token file that tgc train
// --data reads), or ids back into text.
#include "app/Tokenizer.h"
#include "support/Files.h"
#include "support/Limits.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/Path.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> TokenizerFile(cl::Positional, cl::desc("<tokenizer.json | tok.model>"), cl::Required,
                                          cl::sub(tokenizeCommand()), cl::cat(category()));
static cl::opt<std::string> InputFile(cl::Positional, cl::desc("<text file | ids file with --decode>"), cl::Required,
                                      cl::sub(tokenizeCommand()), cl::cat(category()));
static cl::opt<std::string> TokensOut("o",
                                      cl::desc("Write the ids as a token file instead of printing them: .u16 or .u32 "
                                               "(little-endian ids, which tgc train --data reads)"),
                                      cl::value_desc("tokens.u32"), cl::sub(tokenizeCommand()), cl::cat(category()));
static cl::opt<bool> Decode("decode", cl::desc("The file holds ids (separated by spaces or lines): print their text"),
                            cl::sub(tokenizeCommand()), cl::cat(category()));

int decodeIds(const Tokenizer &tokenizer, llvm::StringRef text) {
  std::vector<int32_t> ids;
  llvm::SmallVector<llvm::StringRef, 0> parts;
  text.split(parts, ' ', -1, false);
  for (llvm::StringRef part : parts)
    for (llvm::StringRef piece : llvm::split(part, '\n')) {
      piece = piece.trim();
      int64_t id = 0;
      if (piece.empty())
        continue;
      if (piece.getAsInteger(10, id) || id < 0 || id > INT32_MAX)
        return report(flagError(fmt::format("{}: '{}' is not a token id", InputFile.getValue(), escapeForMessage(piece))));
      ids.push_back(int32_t(id));
    }
  auto decoded = tokenizer.decode(ids);
  if (!decoded)
    return report(fileError(InputFile, "{}", llvm::toString(decoded.takeError())));
  llvm::outs() << *decoded;
  return 0;
}

} // namespace

int runTokenize() {
  if (auto err = checkNotEmpty({&TokensOut}))
    return report(std::move(err));
  if (auto err = checkDistinctFiles({{"the tokenizer", TokenizerFile}, {"the input", InputFile}, {"-o", TokensOut}}))
    return report(std::move(err));
  llvm::StringRef ext = llvm::sys::path::extension(TokensOut);
  if (!TokensOut.empty() && ext != ".u16" && ext != ".u32")
    return report(flagError(fmt::format("-o {}: a token file is named .u16 or .u32 (its ids' width)",
                                        TokensOut.getValue())));
  auto tokenizer = loadTokenizer(TokenizerFile);
  if (!tokenizer)
    return report(tokenizer.takeError());
  auto text = readFileAtMost(InputFile, uint64_t(4) << 30, "a text file");
  if (!text)
    return report(text.takeError());
  if (Decode)
    return decodeIds(**tokenizer, (*text)->getBuffer());
  auto ids = (*tokenizer)->encode((*text)->getBuffer());
  if (!ids)
    return report(fileError(InputFile, "{}", llvm::toString(ids.takeError())));
  if (TokensOut.empty()) {
    llvm::outs() << fmt::format("{}\n", fmt::join(*ids, " "));
    return 0;
  }
  if (ext == ".u16" && (*tokenizer)->vocabSize() > 65536)
    return report(flagError(fmt::format("-o {}: the tokenizer's {} ids do not fit 16 bits: name it .u32",
                                        TokensOut.getValue(), (*tokenizer)->vocabSize())));
  std::string bytes;
  for (int32_t id : *ids)
    for (int b = 0; b < (ext == ".u16" ? 2 : 4); ++b)
      bytes += char((uint32_t(id) >> (8 * b)) & 0xff);
  if (auto err = writeFileAtomically(TokensOut, bytes))
    return report(std::move(err));
  llvm::errs() << fmt::format("{}: {} tokens ({})\n", TokensOut.getValue(), ids->size(), (*tokenizer)->describe());
  return 0;
}

} // namespace tgc::cli
