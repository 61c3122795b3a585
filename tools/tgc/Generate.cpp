// tgc generate and eval: continue a prompt with a trained checkpoint; score greedy
// continuations of held-out arithmetic progressions.
#include "app/Generate.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> Prompt("prompt", cl::desc("Token ids, separated by spaces or commas"),
                                   cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<int64_t> Tokens("tokens", cl::desc("How many tokens to generate"), cl::init(16),
                               cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<double> Temperature("temperature", cl::desc("0 is greedy"), cl::init(0.0),
                                   cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<int64_t> TopK("top-k", cl::desc("Sample among the k most likely tokens (0: all)"),
                             cl::init(0), cl::sub(generateCommand()), cl::cat(category()));
static cl::opt<int64_t> Sequences("sequences", cl::desc("Held-out prompts to score"), cl::init(64),
                                  cl::sub(evalCommand()), cl::cat(category()));
static cl::opt<int64_t> PromptLength("prompt-length", cl::desc("Tokens given of each held-out progression"),
                                     cl::init(8), cl::sub(evalCommand()), cl::cat(category()));

llvm::Expected<std::vector<int32_t>> parsePrompt(llvm::StringRef text, int64_t vocab) {
  llvm::SmallVector<llvm::StringRef, 16> parts;
  text.split(parts, ' ', -1, /*KeepEmpty=*/false);
  std::vector<int32_t> tokens;
  for (llvm::StringRef part : parts) {
    for (llvm::StringRef piece : llvm::split(part, ',')) {
      if (piece.empty())
        continue;
      int64_t id = 0;
      if (piece.getAsInteger(10, id))
        return flagError(fmt::format("--prompt: '{}' is not a token id", escapeForMessage(piece)));
      if (id < 0 || id >= vocab)
        return flagError(fmt::format("--prompt: token {} is outside the vocabulary [0, {})", id, vocab));
      tokens.push_back(int32_t(id));
    }
  }
  if (tokens.empty())
    return flagError("--prompt: give at least one token id, e.g. --prompt \"5 12 19\"");
  return tokens;
}

} // namespace

int runGenerate() {
  if (Tokens < 1 || Tokens > 100000)
    return report(flagError(fmt::format("--tokens must be between 1 and 100000, got {}", int64_t(Tokens))));
  if (!(Temperature >= 0 && Temperature <= 100))
    return report(flagError("--temperature must be between 0 and 100"));
  if (TopK < 0)
    return report(flagError("--top-k must be >= 0"));
  auto trained = loadTrained(CheckpointPath);
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  auto prompt = parsePrompt(Prompt, config.vocab);
  if (!prompt)
    return report(prompt.takeError());
  auto generator = Generator::create(config, checkpoint.tensors, 1, *device);
  if (!generator)
    return report(generator.takeError());
  SamplingOptions options{Temperature, TopK, Seed.getNumOccurrences() ? uint64_t(Seed) : 0};
  auto out = (*generator)->generate({*prompt}, Tokens, options);
  if (!out)
    return report(out.takeError());
  llvm::outs() << fmt::format("{}\n", fmt::join((*out)[0], " "));
  return 0;
}

int runEval() {
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
