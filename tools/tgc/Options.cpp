#include "tools/tgc/Options.h"

#include "app/Tokenizer.h"
#include "app/Trainer.h"
#include "backends/cuda/CudaExecutor.h"
#include "models/ProgramInterface.h"
#include "support/BuildInfo.h"
#include "support/Error.h"
#include "transforms/Pass.h"

#include <cmath>
#include <fmt/format.h>
#include <map>

namespace tgc::cli {

cl::OptionCategory &category() {
  static cl::OptionCategory c("tgc options");
  return c;
}
// Function-local statics: the flags of every file name their subcommands during static
// initialisation, whatever the files' order.
cl::SubCommand &compileCommand() {
  static cl::SubCommand c("compile", "Build a model's IR, run the passes and print it");
  return c;
}
cl::SubCommand &optCommand() {
  static cl::SubCommand c("opt", "Parse IR text, run the given passes and print it");
  return c;
}
cl::SubCommand &runCommand() {
  static cl::SubCommand c("run", "Run one forward pass on a deterministic batch, print the loss");
  return c;
}
cl::SubCommand &infoCommand() {
  static cl::SubCommand c("info", "Show the GPU, the libraries and what this machine can run");
  return c;
}
cl::SubCommand &trainCommand() {
  static cl::SubCommand c("train", "Train a model; print the loss per step; save a checkpoint");
  return c;
}
cl::SubCommand &generateCommand() {
  static cl::SubCommand c("generate", "Continue a prompt with a trained checkpoint");
  return c;
}
cl::SubCommand &evalCommand() {
  static cl::SubCommand c("eval", "Score greedy continuations of held-out arithmetic prompts");
  return c;
}
cl::SubCommand &inspectCommand() {
  static cl::SubCommand c("inspect", "Show a checkpoint's FP8 scaling state");
  return c;
}
cl::SubCommand &reportCommand() {
  static cl::SubCommand c("report", "Draw a training log (and a bench) as one self-contained HTML page");
  return c;
}
cl::SubCommand &tokenizeCommand() {
  static cl::SubCommand c("tokenize", "Turn text into token ids through a tokenizer (a token file for --data), or back");
  return c;
}
cl::SubCommand &tokenizerCommand() {
  static cl::SubCommand c("tokenizer", "Train a SentencePiece tokenizer on a text file (tgc tokenizer train CORPUS)");
  return c;
}
cl::SubCommand &convertCommand() {
  static cl::SubCommand c("convert", "Convert a Hugging Face model folder to a tgc checkpoint, or back");
  return c;
}
cl::SubCommand &benchCommand() {
  static cl::SubCommand c("bench", "Train each precision for a few steps and compare step time and memory");
  return c;
}

cl::opt<std::string> ModelPath(cl::Positional, cl::desc("<model.yaml>"), cl::Required,
                                      cl::sub(compileCommand()), cl::sub(runCommand()), cl::sub(trainCommand()),
                                      cl::cat(category()));
cl::opt<std::string> CheckpointPath(cl::Positional, cl::desc("<checkpoint.safetensors>"),
                                           cl::Required, cl::sub(generateCommand()), cl::sub(evalCommand()),
                                           cl::sub(inspectCommand()), cl::cat(category()));
cl::list<std::string> DisablePass("disable-pass", cl::desc("Skip the named pass"),
                                         cl::CommaSeparated, cl::sub(compileCommand()), cl::sub(runCommand()),
                                         cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<int64_t> BatchSize("batch", cl::desc("Batch size (default: the model file's; generate: the prompts, up to 32)"),
                              cl::init(0), cl::sub(compileCommand()), cl::sub(runCommand()), cl::sub(trainCommand()),
                              cl::sub(benchCommand()), cl::sub(generateCommand()), cl::cat(category()));
cl::opt<uint64_t> Seed("seed", cl::desc("Seed of the init, the data and sampling (default: the model file's)"),
                              cl::sub(runCommand()), cl::sub(trainCommand()), cl::sub(generateCommand()),
                              cl::cat(category()));
cl::opt<std::string> Precision("precision",
                               cl::desc("auto | fp32 | bf16 | fp8 (default: the model file's; generate and eval: the "
                                        "checkpoint's)"),
                               cl::sub(compileCommand()), cl::sub(runCommand()), cl::sub(trainCommand()),
                               cl::sub(generateCommand()), cl::sub(evalCommand()), cl::cat(category()));
cl::opt<std::string> Fp8FormatFlag("fp8-format", cl::desc("hybrid | e4m3"), cl::sub(compileCommand()),
                                      cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<int64_t> Margin("margin", cl::desc("FP8 scale margin (scale / 2^margin)"),
                               cl::sub(compileCommand()), cl::sub(trainCommand()), cl::cat(category()));
cl::opt<int64_t> AmaxHistoryLen("amax-history-len", cl::desc("Length of the amax window"),
                                       cl::sub(compileCommand()), cl::sub(trainCommand()), cl::cat(category()));
cl::opt<std::string> AmaxAlgoFlag("amax-compute-algo", cl::desc("max | most_recent"),
                                     cl::sub(compileCommand()), cl::sub(trainCommand()), cl::cat(category()));
cl::opt<std::string> Fp8ScalingFlag("fp8-scaling",
                                   cl::desc("delayed (the amax history of earlier steps) | current (each tensor's own "
                                            "amax) | mixed (current for weights and gradients, delayed for activations) | block "
                                            "(1x128 and 128x128 blocks' own scales)"),
                                   cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()),
                                   cl::cat(category()));
cl::opt<int64_t> Fp8MinDim("fp8-min-dim",
                                  cl::desc("Under fp8, GEMMs with K or N below this stay BF16 (0: every eligible GEMM is FP8)"),
                                  cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<bool> Fp8Weights("fp8-weights",
                         cl::desc("Under fp8, keep each FP8 layer's weight and its transpose in FP8 between steps, "
                                  "made after AdamW (Transformer Engine's quantized_model_init); the optimizer keeps "
                                  "the fp32 master weights, and checkpoints them"),
                         cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<bool> Fp8Attention("fp8-attention",
                           cl::desc("Under fp8, run attention in FP8 (cuDNN's FP8 fused attention, Transformer "
                                    "Engine's fp8_dpa): q, k, v, dout and the probabilities with scaling state of "
                                    "their own; the GPU needs cuDNN 9"),
                           cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<bool> Fp8LmHead("fp8-lm-head",
                        cl::desc("Under fp8 and auto, the LM head's product may run in FP8 (the default unless the "
                                 "model file's keep_bf16 names lm_head); --fp8-lm-head=false keeps it BF16"),
                        cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<bool> Recompute("recompute",
                        cl::desc("The backward recomputes the fused layers' norms and activations, and under fp8 the transposes of the inputs it keeps anyway, instead of keeping the forward's (less memory, more time)"),
                        cl::sub(compileCommand()), cl::sub(optCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()),
                        cl::cat(category()));
cl::opt<std::string> Shard("shard",
                           cl::desc("none | optimizer | gradients: under data parallelism each rank keeps AdamW's "
                                    "moments of its 1/N of every parameter and updates only that, the parameters "
                                    "all-gathered after (ZeRO-1); gradients: each rank also keeps only its 1/N of "
                                    "each gradient, reduce-scattered instead of all-reduced (ZeRO-2; NCCL's on GPUs)"),
                           cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()),
                           cl::cat(category()));
cl::opt<std::string> GradReduce("grad-reduce",
                                cl::desc("fp32 | bf16: under data parallelism the gradients cross the ranks in BF16 "
                                         "(half the bytes; each rank's and the result rounded; NCCL's bfloat16 on GPUs)"),
                                cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()),
                                cl::cat(category()));
cl::opt<int64_t> RecomputeLayers("recompute-layers",
                                 cl::desc("--recompute in the first N layers only (h0 .. h{N-1}); the others keep the "
                                          "forward's values"),
                                 cl::sub(compileCommand()), cl::sub(optCommand()), cl::sub(trainCommand()),
                                 cl::sub(benchCommand()), cl::cat(category()));
cl::opt<double> MemoryBudget("memory-budget",
                             cl::desc("GiB the GPU plan may take: recompute as few layers as fit it (recompute: "
                                      "auto; tgc compile says which, and what each choice takes)"),
                             cl::sub(compileCommand()), cl::sub(trainCommand()), cl::sub(benchCommand()),
                             cl::cat(category()));
cl::opt<int64_t> Steps("steps", cl::desc("Training steps (default: the model file's)"),
                              cl::sub(trainCommand()), cl::sub(compileCommand()), cl::cat(category()));
cl::opt<double> LearningRate("lr", cl::desc("Peak learning rate (default: the model file's)"),
                                    cl::sub(trainCommand()), cl::sub(compileCommand()), cl::cat(category()));
cl::opt<std::string> DeviceFlag("device", cl::desc("auto | cpu | cuda"), cl::init("auto"),
                                   cl::sub(trainCommand()), cl::sub(generateCommand()), cl::sub(evalCommand()), cl::sub(benchCommand()),
                                   cl::cat(category()));

cl::opt<double> Temperature("temperature", cl::desc("Sample at this temperature (0: greedy)"), cl::init(0.0),
                            cl::sub(generateCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<int64_t> TopK("top-k", cl::desc("Sample among the k most likely tokens (0: all)"), cl::init(0),
                      cl::sub(generateCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<double> TopP("top-p", cl::desc("Sample among the most likely tokens that hold this probability (1: all)"),
                     cl::init(1.0), cl::sub(generateCommand()), cl::sub(benchCommand()), cl::cat(category()));

llvm::Expected<SamplingOptions> samplingFlags(uint64_t seed) {
  if (!(Temperature >= 0 && Temperature <= 100))
    return flagError("--temperature must be between 0 and 100");
  if (TopK < 0)
    return flagError("--top-k must be >= 0");
  if (!(TopP > 0 && TopP <= 1))
    return flagError("--top-p must be in (0, 1]");
  return SamplingOptions{Temperature, TopK, TopP, seed};
}

cl::opt<std::string> PromptText("prompt-text",
                                cl::desc("A prompt as text, through the tokenizer (generate: printed as text with its "
                                         "continuation; bench --generate: every sequence's, through the --weights "
                                         "checkpoint's tokenizer, instead of random tokens)"),
                                cl::sub(generateCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<std::string> DraftPath("draft",
                               cl::desc("Speculative decoding (greedy): this checkpoint, a smaller model of the same "
                                        "vocabulary, proposes --lookahead tokens a sequence that the model checks in "
                                        "one step; the tokens stay greedy decoding's"),
                               cl::value_desc("draft.safetensors"), cl::sub(generateCommand()), cl::sub(benchCommand()),
                               cl::cat(category()));
cl::opt<int64_t> Lookahead("lookahead", cl::desc("With --draft: the draft's tokens each step of the model checks"),
                           cl::init(4), cl::sub(generateCommand()), cl::sub(benchCommand()), cl::cat(category()));

llvm::Error checkDraftFlags(const SamplingOptions &sampling) {
  if (DraftPath.empty()) {
    if (Lookahead.getNumOccurrences() || DraftPath.getNumOccurrences())
      return flagError("--lookahead and --draft go with a draft checkpoint: give --draft draft.safetensors");
    return llvm::Error::success();
  }
  if (sampling.temperature > 0)
    return flagError("--draft decodes greedily (the tokens of plain greedy decoding): drop --temperature");
  if (Lookahead < 1 || Lookahead > 64)
    return flagError(fmt::format("--lookahead must be between 1 and 64, got {}", int64_t(Lookahead)));
  return llvm::Error::success();
}

llvm::Error attachDraft(Generator &generator, const SamplingOptions &sampling, const llvm::json::Object *modelMeta) {
  if (auto err = checkDraftFlags(sampling))
    return err;
  if (DraftPath.empty())
    return llvm::Error::success();
  auto trained = loadTrained(DraftPath);
  if (!trained)
    return trained.takeError();
  auto &[config, checkpoint] = *trained;
  // The same vocabulary in another tokenizer's ids would only be guessed wrong: refused.
  auto tokenizerOf = [](const llvm::json::Object *meta) {
    return meta ? meta->getString(kTokenizerMeta) : std::nullopt;
  };
  auto mine = tokenizerOf(modelMeta), theirs = tokenizerOf(&checkpoint.meta);
  if (mine && theirs && *mine != *theirs)
    return flagError(fmt::format("--draft {}: the draft carries another tokenizer than the model's: its token ids "
                                 "mean other text",
                                 DraftPath.getValue()));
  config.precision.recipe = generator.config().precision.recipe;
  // One error naming the draft's file.
  auto named = [](llvm::Error err) {
    std::string text = llvm::toString(std::move(err));
    llvm::StringRef rest(text);
    rest.consume_front("error: ");
    return makeError("error: --draft {}: {}", DraftPath.getValue(), rest.str());
  };
  auto draft = Generator::create(config, checkpoint.tensors, generator.batch(), generator.device());
  if (!draft)
    return named(draft.takeError());
  if (auto err = generator.setDraft(std::move(*draft), Lookahead))
    return named(std::move(err));
  return llvm::Error::success();
}

/// Prints one line for the error (control bytes escaped) and returns the exit code.
int report(llvm::Error err) {
  // Every path and name a message quotes, escaped once here (a second time changes nothing).
  std::string message = escapeForMessage(llvm::toString(std::move(err)));
  if (message.find("error: ") == std::string::npos)
    message = "error: " + message;
  llvm::errs() << "tgc: " << message << "\n";
  return 1;
}

llvm::Error flagError(const std::string &message) { return stringError(message); }

llvm::Error checkNotEmpty(std::initializer_list<const cl::opt<std::string> *> flags) {
  for (const cl::opt<std::string> *flag : flags)
    if (flag->getNumOccurrences() > 0 && flag->getValue().empty())
      return flagError(fmt::format("error: --{} needs a file name, got an empty one", flag->ArgStr.str()));
  return llvm::Error::success();
}

llvm::Expected<ModelConfig> loadConfig(llvm::StringRef path) {
  auto config = loadModelConfig(path);
  if (!config)
    return config.takeError();
  ConfigOverrides o;
  auto given = [](auto &flag) { return flag.getNumOccurrences() > 0; };
  if (given(BatchSize))
    o.batch = BatchSize;
  if (given(Steps))
    o.steps = Steps;
  if (given(LearningRate))
    o.lr = LearningRate;
  if (given(Seed))
    o.seed = Seed;
  if (given(Precision))
    o.recipe = Precision;
  if (given(Fp8FormatFlag))
    o.fp8Format = Fp8FormatFlag;
  if (given(AmaxAlgoFlag))
    o.amaxComputeAlgo = AmaxAlgoFlag;
  if (given(Fp8ScalingFlag))
    o.fp8Scaling = Fp8ScalingFlag;
  if (given(Margin))
    o.margin = Margin;
  if (given(Fp8MinDim))
    o.fp8MinDim = Fp8MinDim;
  if (given(AmaxHistoryLen))
    o.amaxHistoryLen = AmaxHistoryLen;
  if (given(Recompute))
    o.recompute = Recompute;
  if (given(RecomputeLayers))
    o.recomputeLayers = RecomputeLayers;
  if (given(MemoryBudget))
    o.memoryBudgetGiB = MemoryBudget;
  if (given(Fp8LmHead))
    o.fp8LmHead = Fp8LmHead;
  if (given(Fp8Weights))
    o.fp8Weights = Fp8Weights;
  if (given(Fp8Attention))
    o.fp8Attention = Fp8Attention;
  if (given(Shard))
    o.shard = Shard;
  if (given(GradReduce))
    o.gradReduce = GradReduce;
  if (auto err = applyOverrides(*config, o))
    return std::move(err);
  for (const std::string &name : DisablePass)
    if (!createPass(name))
      return flagError(fmt::format("--disable-pass: unknown pass '{}' (passes: {})", name,
                                   fmt::join(allPassNames(), ", ")));
  config->disabledPasses.assign(DisablePass.begin(), DisablePass.end());
  return config;
}

/// --device: auto takes the GPU when there is one (and this build can use it); an explicit
/// request the machine cannot serve is an error, not a downgrade.
llvm::Expected<Device> resolveDevice() {
  if (DeviceFlag == "cpu")
    return Device::cpu();
  if (DeviceFlag == "auto") {
    auto gpu = detectCudaDevice();
    if (!gpu) {
      llvm::consumeError(gpu.takeError());
      return Device::cpu();
    }
    return gpu;
  }
  if (DeviceFlag == "cuda") {
    auto gpu = detectCudaDevice();
    if (!gpu)
      return flagError("--device cuda: " + llvm::toString(gpu.takeError()).substr(std::string("error: no GPU: ").size()));
    return gpu;
  }
  return flagError("--device must be auto, cpu or cuda, got '" + DeviceFlag + "'");
}

cl::opt<bool> AllowNonFinite("allow-nonfinite", cl::desc("Read a checkpoint whose tensors hold NaN or Inf"),
                             cl::sub(generateCommand()), cl::sub(evalCommand()), cl::sub(trainCommand()),
                             cl::cat(category()));

/// A checkpoint and the model it was trained for.
llvm::Expected<std::pair<ModelConfig, Checkpoint>> loadTrained(llvm::StringRef path, bool requireFinite) {
  if (Precision.getNumOccurrences() && !parseRecipe(Precision))
    return flagError(fmt::format("--precision must be auto | fp32 | bf16 | fp8, got '{}'", Precision.getValue()));
  // Generation, evaluation and inspection never read the optimizer's moments (two thirds of a
  // checkpoint): they are not copied out of the file.
  auto checkpoint = readCheckpoint(path, [](llvm::StringRef name) { return !program::isOptimizerMoment(name); });
  if (!checkpoint)
    return checkpoint.takeError();
  if (requireFinite && !AllowNonFinite)
    if (auto err = checkFinite(*checkpoint, path))
      return std::move(err);
  auto config = checkpointModel(*checkpoint, path);
  if (!config)
    return config.takeError();
  if (Precision.getNumOccurrences()) // (generate and eval: another recipe than the checkpoint's)
    config->precision.recipe = *parseRecipe(Precision);
  return std::make_pair(std::move(*config), std::move(*checkpoint));
}

/// The FP8 scaling summary: one line per quantized tensor.
namespace {
/// A block scale, a power of two, as 2^k ("-" for none).
std::string powerOfTwo(float scale) {
  return scale > 0.0f ? fmt::format("2^{}", std::ilogb(scale)) : std::string("-");
}
} // namespace

void printFp8Summary(const std::vector<Fp8TensorSummary> &summary, llvm::raw_ostream &os) {
  // Under block scaling each block has its own scale: the table shows their range in the newest
  // step, and the values flushed to zero (none saturates).
  bool block = !summary.empty() && summary.front().blockScaled;
  if (block)
    os << fmt::format("  {:<30}{:<8}{:>26}  {:<40}{:>10}\n", "tensor", "format", "block scales (newest step)",
                      "amax history (newest first)", "flushed");
  else
    os << fmt::format("  {:<30}{:<8}{:>12}{:>12}  {:<40}{:>10}\n", "tensor", "format", "scale", "scale_inv",
                      "amax history (newest first)", "saturated");
  for (const Fp8TensorSummary &s : summary) {
    std::string amax;
    for (float a : s.newestAmax)
      amax += fmt::format("{}{:.4g}", amax.empty() ? "" : " ", a);
    std::string name = escapeForMessage(s.site + " " + s.role);
    if (block)
      os << fmt::format("  {:<30}{:<8}{:>26}  {:<40}{:>10.0f}\n", name, s.format,
                        powerOfTwo(s.smallestBlockScale) + " .. " + powerOfTwo(s.largestBlockScale), amax,
                        s.saturations);
    else
      os << fmt::format("  {:<30}{:<8}{:>12.5g}{:>12.5g}  {:<40}{:>10.0f}\n", name, s.format, s.scale, s.scaleInv,
                        amax, s.saturations);
  }
}

std::string deviceName(llvm::StringRef description) {
  return description.substr(0, description.find(", ")).str(); // without the kernel-cache note after its first comma
}

std::string deviceName(const Trainer &trainer) { return deviceName(trainer.executor().describe()); }

llvm::json::Object runDescription(const Trainer &trainer) {
  const ModelConfig &c = trainer.config();
  std::map<std::string, int64_t> counts; // sorted: the same text every run
  for (const Op *op : trainer.program().ops())
    ++counts[opInfo(op->kind()).name.str()];
  llvm::json::Object ops;
  for (const auto &[kind, count] : counts)
    ops[kind] = count;
  return llvm::json::Object{{"commit", buildCommit()},
                            {"model", c.name},
                            {"parameters", c.numParams()},
                            {"batch", c.train.batch},
                            {"seq_len", c.seqLen},
                            {"device", deviceName(trainer)},
                            {"recipe", recipeName(c.precision.recipe)},
                            {"ops", std::move(ops)}};
}

} // namespace tgc::cli
