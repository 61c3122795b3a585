// tgc generate and eval: continue a prompt with a trained checkpoint; score greedy
// continuations of held-out arithmetic progressions.
#include "app/Generate.h"
#include "app/Tokenizer.h"
#include "models/GPTBuilder.h"
#include "support/Files.h"
#include "support/Limits.h"
#include "tools/tgc/Options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> Prompt("prompt", cl::desc("Token ids, separated by spaces or commas"),
                                   cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<std::string> PromptsFile("prompts", cl::desc("A file of prompts, one a line (token ids), generated in batches"),
                                        cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<std::string> TokenizerPath("tokenizer",
                                          cl::desc("The tokenizer for --prompt-text (a tokenizer.json; default: the "
                                                   "one the checkpoint carries)"),
                                          cl::value_desc("tokenizer.json"), cl::sub(generateCommand()),
                                          cl::cat(category()));
static cl::opt<int64_t> Tokens("tokens", cl::desc("How many tokens to generate"), cl::init(16),
                               cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<std::string> LogitsPath("logits",
                                       cl::desc("Also write the prompt's logits, every position's (float32 [length, "
                                                "vocab], NumPy's .npy), from the full forward pass: to compare with "
                                                "another framework (one prompt)"),
                                       cl::value_desc("logits.npy"), cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<bool> Stream("stream", cl::desc("Print each token as it is generated (one prompt)"),
                            cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<int64_t> Sequences("sequences", cl::desc("Held-out prompts to score"), cl::init(64),
                                  cl::sub(evalCommand()), cl::cat(category()));
static cl::opt<int64_t> PromptLength("prompt-length", cl::desc("Tokens given of each held-out progression"),
                                     cl::init(8), cl::sub(evalCommand()), cl::cat(category()));

/// Token ids separated by spaces or commas; `where` names the text in errors ("--prompt",
/// "prompts.txt:3").
llvm::Expected<std::vector<int32_t>> parsePrompt(llvm::StringRef text, int64_t vocab, const std::string &where) {
  llvm::SmallVector<llvm::StringRef, 16> parts;
  text.split(parts, ' ', -1, /*KeepEmpty=*/false);
  std::vector<int32_t> tokens;
  for (llvm::StringRef part : parts) {
    for (llvm::StringRef piece : llvm::split(part.trim(), ',')) {
      piece = piece.trim();
      if (piece.empty())
        continue;
      int64_t id = 0;
      if (piece.getAsInteger(10, id))
        return flagError(fmt::format("{}: '{}' is not a token id", where, escapeForMessage(piece)));
      if (id < 0 || id >= vocab)
        return flagError(fmt::format("{}: token {} is outside the vocabulary [0, {})", where, id, vocab));
      tokens.push_back(int32_t(id));
    }
  }
  if (tokens.empty())
    return flagError(fmt::format("{}: give at least one token id, e.g. \"5 12 19\"", where));
  return tokens;
}

/// The tokenizer --prompt-text goes through: --tokenizer's, or the one the checkpoint carries;
/// its ids must be the model's.
llvm::Expected<std::unique_ptr<Tokenizer>> promptTokenizer(const Checkpoint &checkpoint, int64_t vocab) {
  auto tokenizer = TokenizerPath.empty() ? checkpointTokenizer(checkpoint.meta, CheckpointPath)
                                         : llvm::Expected<std::unique_ptr<Tokenizer>>(loadTokenizer(TokenizerPath));
  if (!tokenizer)
    return tokenizer.takeError();
  if (!*tokenizer)
    return flagError(fmt::format("{}: the checkpoint carries no tokenizer: give --tokenizer tokenizer.json",
                                 CheckpointPath.getValue()));
  if ((*tokenizer)->vocabSize() > vocab)
    return flagError(fmt::format("the tokenizer's {} tokens do not fit the model's vocabulary of {}: another "
                                 "model's tokenizer?",
                                 (*tokenizer)->vocabSize(), vocab));
  return tokenizer;
}

/// The prompts of --prompt, of --prompt-text through `tokenizer`, or of each non-empty line of
/// --prompts.
llvm::Expected<std::vector<std::vector<int32_t>>> readPrompts(int64_t vocab, const Tokenizer *tokenizer) {
  if (Prompt.getNumOccurrences() + PromptsFile.getNumOccurrences() + PromptText.getNumOccurrences() != 1)
    return flagError("give the prompt as --prompt \"5 12 19\", as text (--prompt-text \"...\") or a file of prompts "
                     "as --prompts FILE (one of them)");
  if (PromptText.getNumOccurrences()) {
    auto tokens = tokenizer->encode(PromptText);
    if (!tokens)
      return flagError("--prompt-text: " + llvm::toString(tokens.takeError()));
    if (tokens->empty())
      return flagError("--prompt-text: give at least one character");
    return std::vector<std::vector<int32_t>>{*tokens};
  }
  if (Prompt.getNumOccurrences()) {
    auto tokens = parsePrompt(Prompt, vocab, "--prompt");
    if (!tokens)
      return tokens.takeError();
    return std::vector<std::vector<int32_t>>{*tokens};
  }
  auto text = readFileAtMost(PromptsFile, 64 << 20, "a prompts file");
  if (!text)
    return text.takeError();
  std::vector<std::vector<int32_t>> prompts;
  llvm::SmallVector<llvm::StringRef, 64> lines;
  (*text)->getBuffer().split(lines, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].trim().empty())
      continue;
    auto tokens = parsePrompt(lines[i], vocab, fmt::format("{}:{}", PromptsFile.getValue(), i + 1));
    if (!tokens)
      return tokens.takeError();
    prompts.push_back(std::move(*tokens));
  }
  if (prompts.empty())
    return flagError(fmt::format("{}: no prompts (one a line, token ids separated by spaces)", PromptsFile.getValue()));
  return prompts;
}

} // namespace

/// `t` ([rows, cols] fp32) as NumPy's .npy format 1.0: the magic, the header dict padded to a
/// multiple of 64 bytes, the little-endian values.
std::string npyOf(const Tensor &t) {
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", t.type.dim(0),
                                   t.type.dim(1));
  while ((10 + header.size() + 1) % 64)
    header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += char(header.size() & 0xff);
  out += char(header.size() >> 8);
  out += header;
  out.append(reinterpret_cast<const char *>(t.data.data()), t.data.size() * 4);
  return out;
}

int runGenerate() {
  if (auto err = checkNotEmpty({&PromptsFile}))
    return report(std::move(err));
  if (auto err = checkNotEmpty({&LogitsPath, &TokenizerPath}))
    return report(std::move(err));
  if (auto err = checkNotEmpty({&DraftPath}))
    return report(std::move(err));
  if (auto err = checkDistinctFiles(
          {{"the checkpoint", CheckpointPath}, {"--prompts", PromptsFile}, {"--logits", LogitsPath},
           {"--tokenizer", TokenizerPath}}))
    return report(std::move(err));
  if (Tokens < 1 || Tokens > 100000)
    return report(flagError(fmt::format("--tokens must be between 1 and 100000, got {}", int64_t(Tokens))));
  auto options = samplingFlags(Seed.getNumOccurrences() ? uint64_t(Seed) : 0);
  if (!options)
    return report(options.takeError());
  if (BatchSize.getNumOccurrences() && (BatchSize < 1 || BatchSize > 4096))
    return report(flagError("--batch must be between 1 and 4096"));
  auto trained = loadTrained(CheckpointPath);
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  std::unique_ptr<Tokenizer> tokenizer; // text in and out (--prompt-text)
  if (PromptText.getNumOccurrences()) {
    auto loaded = promptTokenizer(checkpoint, config.vocab);
    if (!loaded)
      return report(loaded.takeError());
    tokenizer = std::move(*loaded);
  }
  auto prompts = readPrompts(config.vocab, tokenizer.get());
  if (!prompts)
    return report(prompts.takeError());
  if (Stream && prompts->size() > 1)
    return report(flagError("--stream prints one sequence's tokens as they come: give one prompt (--prompt)"));
  for (size_t i = 0; i < prompts->size(); ++i)
    if (int64_t((*prompts)[i].size()) > config.seqLen)
      return report(flagError(fmt::format("prompt {} has {} tokens; the model's window (seq_len) is {}", i + 1,
                                          (*prompts)[i].size(), config.seqLen)));
  int64_t batch = BatchSize.getNumOccurrences() ? int64_t(BatchSize)
                                                : std::min<int64_t>(int64_t(prompts->size()), 32);
  auto generator = Generator::create(config, checkpoint.tensors, batch, *device);
  if (!generator)
    return report(generator.takeError());
  if (auto err = attachDraft(**generator, *options, &checkpoint.meta))
    return report(std::move(err));
  if (!LogitsPath.empty()) {
    if (prompts->size() != 1)
      return report(flagError("--logits writes one prompt's logits: give one prompt (--prompt)"));
    auto logits = (*generator)->promptLogits(prompts->front());
    if (!logits)
      return report(logits.takeError());
    if (auto err = writeFileAtomically(LogitsPath, npyOf(*logits)))
      return report(std::move(err));
  }
  // Ids, or with --prompt-text their bytes as the tokenizer gives them back.
  auto show = [&](llvm::ArrayRef<int32_t> ids, bool first) -> std::string {
    if (!tokenizer)
      return fmt::format("{}{}", first ? "" : " ", fmt::join(ids, " "));
    auto text = tokenizer->decode(ids);
    return text ? *text : "<" + llvm::toString(text.takeError()) + ">";
  };
  TokenCallback stream;
  if (Stream && tokenizer) // the text goes on from the prompt's
    llvm::outs() << PromptText;
  if (Stream)
    stream = [&](int64_t step, const std::vector<int32_t> &tokens) {
      llvm::outs() << show({tokens[0]}, step == 0);
      llvm::outs().flush();
    };
  GenerationStats total;
  for (size_t first = 0; first < prompts->size(); first += size_t(batch)) {
    std::vector<std::vector<int32_t>> group(prompts->begin() + first,
                                            prompts->begin() + std::min(prompts->size(), first + size_t(batch)));
    auto out = (*generator)->generate(group, Tokens, *options, stream);
    if (!out)
      return report(out.takeError());
    for (const auto &tokens : *out)
      llvm::outs() << (Stream ? "" : tokenizer ? PromptText + show(tokens, true) : show(tokens, true)) << "\n";
    total += (*generator)->stats();
  }
  // Speed on stderr, so that stdout stays the tokens.
  int64_t decoded = total.generatedTokens - (total.cached ? total.sequences : 0);
  llvm::errs() << fmt::format("generated {} tokens for {} prompt{} on {}\n", total.generatedTokens, total.sequences,
                              total.sequences == 1 ? "" : "s", (*generator)->describe());
  if (total.cached)
    llvm::errs() << fmt::format("  prompt:   {} tokens in {:.2f} ms ({:.0f} tokens/s), the first new token with them\n",
                                total.promptTokens, 1e3 * total.prefillSeconds,
                                total.promptTokens / std::max(total.prefillSeconds, 1e-9));
  else
    llvm::errs() << "  past seq_len: the full program recomputed each window (no KV cache)\n";
  if (total.decodeSteps)
    llvm::errs() << fmt::format("  decode:   {} tokens in {:.2f} ms ({:.0f} tokens/s, {:.3f} ms a step of {} sequences)\n",
                                decoded, 1e3 * total.decodeSeconds, decoded / std::max(total.decodeSeconds, 1e-9),
                                1e3 * total.decodeSeconds / total.decodeSteps, batch);
  if (total.verifySteps)
    llvm::errs() << fmt::format("  speculative: {} of {} drafted tokens kept ({:.1f}%), {:.2f} tokens a sequence "
                                "each step of the model (lookahead {})\n",
                                total.acceptedTokens, total.draftedTokens,
                                100.0 * total.acceptedTokens / std::max<int64_t>(total.draftedTokens, 1),
                                double(decoded) / std::max<int64_t>(total.sequences, 1) / total.decodeSteps,
                                (*generator)->lookahead());
  return 0;
}

int runEval() {
  if (auto err = checkDistinctFiles({{"the checkpoint", CheckpointPath}}))
    return report(std::move(err));
  auto trained = loadTrained(CheckpointPath);
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  if (PromptLength < 2 || PromptLength >= config.seqLen)
    return report(flagError(fmt::format("--prompt-length must be between 2 and seq_len - 1 = {}",
                                        config.seqLen - 1)));
  if (Sequences < 1 || Sequences > 100000)
    return report(flagError("--sequences must be between 1 and 100000"));
  int64_t batch = std::min<int64_t>(Sequences, 64);
  auto generator = Generator::create(config, checkpoint.tensors, batch, *device);
  if (!generator)
    return report(generator.takeError());
  auto result = evaluateArithmetic(**generator, config, Sequences, PromptLength, batch);
  if (!result)
    return report(result.takeError());
  llvm::outs() << fmt::format("model {}, {} held-out progressions, {} prompt tokens, {} generated "
                              "each (greedy), on {}\n",
                              config.name, result->sequences, PromptLength.getValue(),
                              config.seqLen - PromptLength, (*generator)->describe());
  llvm::outs() << fmt::format("tokens correct:    {:.2f}% ({} of {})\n", 100 * result->tokenAccuracy(),
                              result->correctTokens, result->tokens);
  llvm::outs() << fmt::format("sequences correct: {:.2f}% ({} of {})\n",
                              100 * result->sequenceAccuracy(), result->correctSequences,
                              result->sequences);
  return 0;
}

} // namespace tgc::cli
