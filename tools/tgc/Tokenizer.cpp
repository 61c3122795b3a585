// tgc tokenizer train: a SentencePiece tokenizer trained on a text file (through tgc's
// SentencePiece plugin, app/SentencePiece.h), written as a .model file that tgc tokenize, tgc
// train --tokenizer and the checkpoints it travels in read.
#include "app/SentencePiece.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <fmt/format.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> Action(cl::Positional, cl::desc("<train>"), cl::Required, cl::sub(tokenizerCommand()),
                                   cl::cat(category()));
static cl::opt<std::string> Corpus(cl::Positional, cl::desc("<corpus.txt>"), cl::Required,
                                   cl::sub(tokenizerCommand()), cl::cat(category()));
static cl::opt<int64_t> Vocab("vocab", cl::desc("The tokenizer's pieces (its ids 0 to N - 1), 260 to 1048576"),
                              cl::value_desc("N"), cl::Required, cl::sub(tokenizerCommand()), cl::cat(category()));
static cl::opt<std::string> ModelOut("o", cl::desc("Where to write the tokenizer (a SentencePiece .model file)"),
                                     cl::value_desc("tok.model"), cl::Required, cl::sub(tokenizerCommand()),
                                     cl::cat(category()));
static cl::opt<std::string> ModelType("model-type", cl::desc("bpe (the default) | unigram"), cl::init("bpe"),
                                      cl::sub(tokenizerCommand()), cl::cat(category()));
const double kCoverage = SentencePieceTraining().characterCoverage;
const std::string kCoverageHelp = fmt::format("The share of the corpus's characters that get pieces of their own, "
                                              "0.98 to 1 (the rest are spelled in byte pieces; default {})",
                                              kCoverage);
static cl::opt<double> Coverage("character-coverage", cl::desc(kCoverageHelp), cl::init(kCoverage),
                                cl::sub(tokenizerCommand()), cl::cat(category()));

} // namespace

int runTokenizer() {
  if (Action != "train")
    return report(flagError(fmt::format("tokenizer {}: the action is train (tgc tokenizer train CORPUS --vocab N -o "
                                        "tok.model)",
                                        Action.getValue())));
  if (auto err = checkNotEmpty({&ModelOut}))
    return report(std::move(err));
  if (auto err = checkDistinctFiles({{"the corpus", Corpus}, {"-o", ModelOut}}))
    return report(std::move(err));
  // 256 byte pieces and SentencePiece's <unk>, <s> and </s>, and room for a merge.
  if (Vocab < 260 || Vocab > (int64_t(1) << 20))
    return report(flagError(fmt::format("--vocab {}: from 260 (the 256 byte pieces, <unk>, <s>, </s> and one "
                                        "more) to 1048576",
                                        Vocab.getValue())));
  if (!(Coverage >= 0.98 && Coverage <= 1)) // (SentencePiece's trainer's range)
    return report(flagError(fmt::format("--character-coverage {}: from 0.98 to 1", Coverage.getValue())));
  if (!llvm::sys::fs::is_regular_file(Corpus))
    return report(fileError(Corpus, "not a readable file"));
  SentencePieceTraining training;
  training.vocab = Vocab;
  training.modelType = ModelType;
  training.characterCoverage = Coverage;
  auto model = trainSentencePiece(Corpus, training);
  if (!model)
    return report(model.takeError());
  if (auto err = writeFileAtomically(ModelOut, *model))
    return report(std::move(err));
  auto tokenizer = parseSentencePiece(*model, ModelOut);
  if (!tokenizer)
    return report(tokenizer.takeError());
  llvm::errs() << fmt::format("{}: {} ({} bytes), trained on {}\n", ModelOut.getValue(), (*tokenizer)->describe(),
                              model->size(), Corpus.getValue());
  return 0;
}

} // namespace tgc::cli
