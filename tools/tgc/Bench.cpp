// tgc bench: trains each precision for a few steps and compares step time, throughput and
// memory on one device.
#include "app/Generate.h"
#include "app/Init.h"
#include "app/PrecisionProbe.h"
#include "app/Tokenizer.h"
#include "app/Trainer.h"
#include "models/GPTBuilder.h"
#include "support/BuildInfo.h"
#include "support/Random.h"
#include "models/ProgramInterface.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/JSON.h"

#include <algorithm>
#include <fmt/format.h>

namespace tgc::cli {

namespace {

static cl::opt<std::string> BenchModel(cl::Positional, cl::desc("<model.yaml>"), cl::Required,
                                       cl::sub(benchCommand()), cl::cat(category()));
static cl::list<std::string> BenchPrecisions("precisions",
                                             cl::desc("Comma-separated recipes (default fp32,bf16,fp8, and auto "
                                                      "on a GPU: FP8 where it measures faster)"),
                                             cl::CommaSeparated, cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchSteps("bench-steps", cl::desc("Timed steps per precision"), cl::init(50),
                                   cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchWarmup("warmup", cl::desc("Untimed steps first"), cl::init(10),
                                    cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<std::string> BenchJson("json", cl::desc("Also write the results as JSON here, for scripts"),
                                      cl::value_desc("file.json"), cl::sub(benchCommand()), cl::cat(category()));

static cl::opt<bool> BenchGenerate("generate",
                                   cl::desc("Benchmark generation (prefill + decode, greedy unless --temperature) "
                                            "instead of training"),
                                   cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchPromptLength("prompt-length", cl::desc("--generate: tokens in each prompt"), cl::init(16),
                                          cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchTokens("tokens", cl::desc("--generate: new tokens for each prompt (default: to seq_len, at most 240)"),
                                    cl::init(0), cl::sub(benchCommand()), cl::cat(category()));

static cl::opt<std::string> BenchWeights("weights",
                                         cl::desc("--generate: this checkpoint's weights (trained with the model "
                                                  "file) instead of the initial ones"),
                                         cl::value_desc("model.safetensors"), cl::sub(benchCommand()),
                                         cl::cat(category()));

/// Model FLOPs of one training step: 6 per parameter per token, plus attention's
/// 12 * layers * seq_len * d_model per token (the PaLM appendix's count).
double trainingFlops(const ModelConfig &c) {
  double tokens = double(c.train.batch) * double(c.seqLen);
  return tokens * (6.0 * double(c.numParams()) + 12.0 * c.layers * double(c.seqLen) * c.dModel);
}

/// Where a step's time goes by kind of op: the GEMMs (cuBLASLt's, the GEMVs, the GEMVs that
/// normalise their rows, and on the CPU the LayerNorm+Linear/MLP ops, whose work is mostly
/// theirs), the attention (forward, gradient, over the cache), and the rest.
struct TimeShares {
  double gemms = 0, attention = 0, communication = 0, rest = 0;
};
TimeShares timeShares(const std::map<std::string, double> &msByOp) {
  TimeShares shares;
  double total = 0;
  for (const auto &[label, ms] : msByOp) {
    llvm::StringRef kind(label);
    bool gemm = kind.starts_with("matmul") || kind.starts_with("residual_norm_linear") ||
                kind.starts_with("layer_norm_linear") || kind.starts_with("layer_norm_mlp");
    double &share = gemm                           ? shares.gemms
                    : kind.contains("attention")   ? shares.attention
                    : kind.starts_with("all_reduce") ? shares.communication
                                                   : shares.rest;
    share += ms;
    total += ms;
  }
  if (total > 0)
    for (double *share : {&shares.gemms, &shares.attention, &shares.communication, &shares.rest})
      *share /= total;
  return shares;
}

double medianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Times `runs` generations of `prompts` after one untimed run (it compiles the prefill program
/// and captures the steps) and prints the medians as a row; returns the row for --json.
llvm::Expected<llvm::json::Object> timeGeneration(Generator &generator, const std::vector<std::vector<int32_t>> &prompts,
                                                  int64_t count, const SamplingOptions &sampling, int64_t runs,
                                                  const std::string &label) {
  const int64_t batch = int64_t(prompts.size()), P = int64_t(prompts.front().size());
  std::vector<double> prefill, step, decodeRate, overall;
  GenerationStats timed; // the timed runs' totals (the draft's tokens, drafted and kept)
  for (int64_t run = 0; run <= runs; ++run) {
    auto out = generator.generate(prompts, count, sampling);
    if (!out)
      return out.takeError();
    const GenerationStats &s = generator.stats();
    if (run == 0)
      continue;
    timed += s;
    prefill.push_back(1e3 * s.prefillSeconds);
    if (s.decodeSteps) {
      step.push_back(1e3 * s.decodeSeconds / s.decodeSteps);
      decodeRate.push_back(double(s.generatedTokens - batch) / s.decodeSeconds);
    }
    overall.push_back(double(s.generatedTokens) / (s.prefillSeconds + s.decodeSeconds));
  }
  std::string where = deviceName(generator.describe());
  double prefillMs = medianOf(prefill), stepMs = step.empty() ? 0 : medianOf(step);
  double rate = decodeRate.empty() ? 0 : medianOf(decodeRate), promptRate = batch * P / (prefillMs / 1e3);
  llvm::outs() << fmt::format("{:<10} {:<34} {:>11.2f} {:>12.0f} {:>11.3f} {:>13.0f} {:>13.0f}\n", label, where,
                              prefillMs, promptRate, stepMs, rate, medianOf(overall));
  double kept = timed.draftedTokens ? double(timed.acceptedTokens) / timed.draftedTokens : 0;
  if (timed.draftedTokens)
    llvm::outs() << fmt::format("           the draft's tokens kept: {:.1f}% (lookahead {}; a step is the draft's "
                                "steps and the model's check)\n",
                                100 * kept, generator.lookahead());
  const ModelConfig &config = generator.config();
  llvm::json::Object row{{"commit", buildCommit()},
                         {"model", config.name},
                         {"parameters", config.numParams()},
                         {"device", where},
                         {"recipe", label},
                         {"batch", batch},
                         {"prompt_length", P},
                         {"new_tokens", count},
                         {"prefill_ms", prefillMs},
                         {"prompt_tokens_per_s", promptRate},
                         {"decode_ms_per_step", stepMs},
                         {"decode_tokens_per_s", rate},
                         {"overall_tokens_per_s", medianOf(overall)}};
  if (timed.draftedTokens) {
    row["lookahead"] = generator.lookahead();
    row["draft_tokens_kept"] = kept;
  }
  return row;
}

/// tgc bench --generate: for each recipe, `batch` random prompts of --prompt-length tokens
/// continued greedily by --tokens tokens, from the model's initial weights; one untimed run
/// (it compiles the prefill program and captures the steps), then --bench-steps timed runs,
/// of which the medians are reported.
/// --weights: a checkpoint of `base` (its tensors are bound by name and type), or nothing.
llvm::Expected<std::optional<std::pair<ModelConfig, Checkpoint>>> benchWeights(const ModelConfig &base) {
  if (BenchWeights.empty())
    return std::nullopt;
  auto trained = loadTrained(BenchWeights);
  if (!trained)
    return trained.takeError();
  if (trained->first.vocab != base.vocab || trained->first.dModel != base.dModel || trained->first.layers != base.layers)
    return flagError(fmt::format("--weights {}: the checkpoint's model ({}) is not {}", BenchWeights.getValue(),
                                 trained->first.name, base.name));
  return std::optional(std::move(*trained));
}

/// `batch` prompts: --prompt-text through the --weights checkpoint's tokenizer, the same text for
/// every sequence (a trained model's continuation of text, which a draft guesses as it would
/// in use), or --prompt-length random tokens each.
llvm::Expected<std::vector<std::vector<int32_t>>>
benchPrompts(const ModelConfig &base, int64_t batch, const std::optional<std::pair<ModelConfig, Checkpoint>> &weights) {
  if (PromptText.getNumOccurrences()) {
    if (!weights)
      return flagError("--prompt-text goes through a trained model's tokenizer: give --weights CKPT");
    auto tokenizer = checkpointTokenizer(weights->second.meta, BenchWeights);
    if (!tokenizer)
      return tokenizer.takeError();
    if (!*tokenizer)
      return flagError(fmt::format("--weights {}: the checkpoint carries no tokenizer for --prompt-text",
                                   BenchWeights.getValue()));
    auto tokens = (*tokenizer)->encode(PromptText);
    if (!tokens)
      return flagError("--prompt-text: " + llvm::toString(tokens.takeError()));
    if (tokens->empty() || int64_t(tokens->size()) > base.seqLen)
      return flagError(fmt::format("--prompt-text: {} tokens; the model's window is 1 to {}", tokens->size(),
                                   base.seqLen));
    return std::vector<std::vector<int32_t>>(size_t(batch), *tokens);
  }
  Rng rng(mix64(base.train.seed));
  std::vector<std::vector<int32_t>> prompts(batch, std::vector<int32_t>(BenchPromptLength));
  for (auto &prompt : prompts)
    for (int32_t &t : prompt)
      t = int32_t(rng.below(base.vocab));
  return prompts;
}

int benchGeneration(const ModelConfig &base, const std::vector<std::string> &recipes, Device device) {
  const int64_t batch = BatchSize.getNumOccurrences() ? int64_t(BatchSize) : 1;
  if (BenchPromptLength < 1 || BenchPromptLength > base.seqLen)
    return report(flagError(fmt::format("--prompt-length must be between 1 and seq_len = {}, got {}", base.seqLen,
                                        int64_t(BenchPromptLength))));
  const int64_t runs = BenchSteps.getNumOccurrences() ? int64_t(BenchSteps) : 5;
  if (batch < 1 || batch > 4096)
    return report(flagError(fmt::format("--batch must be 1 to 4096 with --generate, got {}", batch)));
  if (runs < 1 || runs > 1000)
    return report(flagError(fmt::format("--bench-steps must be 1 to 1000 with --generate, got {}", runs)));
  auto weights = benchWeights(base);
  if (!weights)
    return report(weights.takeError());
  auto chosen = benchPrompts(base, batch, *weights);
  if (!chosen)
    return report(chosen.takeError());
  const std::vector<std::vector<int32_t>> &prompts = *chosen;
  const int64_t P = int64_t(prompts.front().size());
  // (--tokens 0 given is refused, as a count below 1 is: the default is only when it is absent)
  const int64_t count =
      BenchTokens.getNumOccurrences() ? int64_t(BenchTokens) : std::min<int64_t>(240, base.seqLen - P + 1);
  if (count < 1)
    return report(flagError(fmt::format("--tokens must be at least 1, got {}", count)));
  if (P + count - 1 > base.seqLen)
    return report(flagError(fmt::format("prompts of {} tokens and --tokens {} must fit seq_len {} (prompt + tokens - 1 "
                                        "positions)", P, count, base.seqLen)));
  auto flags = samplingFlags(base.train.seed);
  if (!flags)
    return report(flags.takeError());
  const SamplingOptions &sampling = *flags;
  if (auto err = checkDraftFlags(sampling))
    return report(std::move(err));
  std::string how = sampling.temperature > 0 ? fmt::format("sampled at temperature {}, top-k {}, top-p {}",
                                                           sampling.temperature, sampling.topK, sampling.topP)
                                             : "greedy";
  llvm::outs() << fmt::format("tgc bench --generate {}: batch {}, prompts of {} tokens{}, {} new tokens each ({}), "
                              "1 warm-up + {} timed runs per precision (medians)\n",
                              base.name, batch, P, PromptText.getNumOccurrences() ? " (--prompt-text)" : "", count,
                              how, runs);
  llvm::outs() << fmt::format("{:<10} {:<34} {:>11} {:>12} {:>11} {:>13} {:>13}\n", "recipe", "device", "prefill ms",
                              "prompt tok/s", "ms a step", "decode tok/s", "overall tok/s");
  llvm::json::Array results;
  for (const std::string &recipe : recipes) {
    ModelConfig config = base;
    config.precision.recipe = *parseRecipe(recipe); // (checkBenchPrecisions': a recipe)
    auto graph = buildGPT(config, 1, GPTOutput::Logits);
    if (!graph)
      return report(graph.takeError());
    auto generator = Generator::create(
        config, *weights ? (*weights)->second.tensors : initParams(**graph, config.train.seed), batch, device);
    if (!generator) {
      llvm::outs() << fmt::format("{:<10} {}\n", recipe, llvm::toString(generator.takeError()));
      continue;
    }
    auto row = timeGeneration(**generator, prompts, count, sampling, runs, recipe);
    if (!row)
      return report(row.takeError());
    results.push_back(std::move(*row));
    if (DraftPath.empty())
      continue;
    if (auto err = attachDraft(**generator, sampling, *weights ? &(*weights)->second.meta : nullptr))
      return report(std::move(err));
    row = timeGeneration(**generator, prompts, count, sampling, runs, recipe + "+draft");
    if (!row)
      return report(row.takeError());
    results.push_back(std::move(*row));
  }
  if (!BenchJson.empty()) {
    std::string text;
    llvm::raw_string_ostream(text) << llvm::json::Value(llvm::json::Object{{"generate", true},
                                                                           {"runs", runs},
                                                                           {"results", std::move(results)}})
                                   << "\n";
    if (auto err = writeFileAtomically(BenchJson, text))
      return report(std::move(err));
  }
  return 0;
}

/// Under an fp8 row: how many linear layers ran in FP8, and what auto measured.
/// The FP8 scaling state after a bench run of `recipe`. A large model has hundreds of quantized
/// tensors: the bench shows those with the most saturated (block scaling: flushed) values (in the table's order), and
/// says where every one is shown.
void printBenchFp8State(const std::string &recipe, std::vector<Fp8TensorSummary> summary) {
  constexpr size_t kShown = 16;
  size_t total = summary.size();
  if (total > kShown) {
    std::vector<size_t> order(total);
    for (size_t i = 0; i < total; ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return summary[a].saturations > summary[b].saturations; });
    order.resize(kShown);
    std::sort(order.begin(), order.end());
    std::vector<Fp8TensorSummary> shown;
    for (size_t i : order)
      shown.push_back(summary[i]);
    summary = std::move(shown);
  }
  bool block = !summary.empty() && summary.front().blockScaled; // (nothing saturates: flushed instead)
  llvm::outs() << fmt::format("FP8 scaling state after the {} run ({} quantized tensors{}):\n", recipe, total,
                              total > kShown ? fmt::format("; the {} with the most {} values, `tgc train "
                                                           "--fp8-summary-every N` shows every one",
                                                           kShown, block ? "flushed" : "saturated")
                                             : "");
  printFp8Summary(summary, llvm::outs());
}

void printFp8Layers(const Trainer &trainer) {
  const PrecisionConfig &resolved = trainer.config().precision;
  auto [fp8Layers, linearLayers] = countFp8Layers(trainer.program(), trainer.config());
  int64_t fp8Attention = llvm::count_if(trainer.program().ops(),
                                        [](const Op *op) { return op->kind() == OpKind::Fp8Attention; });
  llvm::outs() << fmt::format("       {} of {} linear layers in FP8 ({}; compile --explain-precision says why){}{}\n",
                              fp8Layers, linearLayers,
                              resolved.measured.empty() ? "every legal one" : "those measured faster",
                              resolved.fp8Weights ? ", their weights kept in FP8 between steps" : "",
                              fp8Attention ? fmt::format(", {} attentions in FP8", fp8Attention) : "");
  for (const GemmMeasurement &m : resolved.measured)
    llvm::outs() << "         " << describeMeasurement(m) << "\n";
  if (!resolved.measuredSummary.empty())
    llvm::outs() << "         " << resolved.measuredSummary << "\n";
}

/// --json, when given: not the model file nor --weights (generation's), and a file the results
/// may replace; checked before the runs, not after them.
llvm::Error checkBenchJson() {
  if (BenchJson.empty())
    return llvm::Error::success();
  if (auto err =
          checkDistinctFiles({{"the model file", BenchModel}, {"--json", BenchJson}, {"--weights", BenchWeights}}))
    return err;
  auto target = replaceableTarget(BenchJson);
  return target ? llvm::Error::success() : target.takeError();
}

/// --precisions' names, checked before the runs (a bad or repeated one after a good one would
/// otherwise stop the bench after that one's runs): each a recipe, auto only where `withAuto`
/// (training), none twice.
llvm::Error checkBenchPrecisions(const std::vector<std::string> &recipes, bool withAuto) {
  std::vector<Recipe> seen;
  for (const std::string &recipe : recipes) {
    std::optional<Recipe> parsed = parseRecipe(recipe);
    if (!parsed || (!withAuto && *parsed == Recipe::Auto))
      return flagError(
          fmt::format("--precisions takes fp32, bf16{}, got '{}'", withAuto ? ", fp8 and auto" : " and fp8", recipe));
    if (llvm::is_contained(seen, *parsed))
      return flagError("--precisions names " + recipe + " twice");
    seen.push_back(*parsed);
  }
  return llvm::Error::success();
}

/// The table's title and column heads.
void printBenchHeader(const ModelConfig &base, int ranks) {
  llvm::outs() << fmt::format("tgc bench {}: batch {} x {} tokens{}, {} warm-up + {} timed steps per precision\n",
                              base.name, base.train.batch, base.seqLen,
                              ranks > 1 ? fmt::format(" on {} GPUs ({} sequences each, data parallel through "
                                                             "NCCL)",
                                                             ranks, base.train.batch / ranks)
                                               : "",
                              int64_t(BenchWarmup), int64_t(BenchSteps));
  llvm::outs() << fmt::format("{:<6} {:<34} {:>10} {:>10} {:>12} {:>9} {:>11} {:>10}\n", "recipe",
                              "device", "median ms", "mean ms", "tokens/s", "TFLOP/s", "memory MiB",
                              "final loss");
}

/// The executor's memory by class, printed under the recipe's row; the lines, for --json.
llvm::json::Array printMemory(const Executor &executor) {
  llvm::json::Array lines;
  for (const std::string &line : executor.memoryReport()) {
    llvm::outs() << "       memory: " << line << "\n";
    lines.push_back(line);
  }
  return lines;
}

/// tgc bench --generate's flags checked, then benchGeneration.
int runBenchGeneration(const ModelConfig &base) {
  if (Gpus != 1)
    return report(flagError("--gpus is for training: generation runs on one GPU"));
  if (Nodes != 1 || NodeRank.getNumOccurrences() || RendezvousFlag.getNumOccurrences())
    return report(flagError("--nodes, --node-rank and --rendezvous are for training: generation runs on one GPU"));
  std::vector<std::string> recipes(BenchPrecisions.begin(), BenchPrecisions.end());
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  if (recipes.empty())
    recipes = {*device == Device::Cuda ? "bf16" : "fp32"};
  if (auto err = checkBenchPrecisions(recipes, /*withAuto=*/false))
    return report(std::move(err));
  if (auto err = checkBenchJson())
    return report(std::move(err));
  return benchGeneration(base, recipes, *device);
}

} // namespace

int runBench() {
  if (auto err = checkNotEmpty({&BenchJson, &BenchWeights, &DraftPath}))
    return report(std::move(err));
  auto base = loadConfig(BenchModel); // with --batch and --fp8-min-dim applied
  if (!base)
    return report(base.takeError());
  if (BenchGenerate)
    return runBenchGeneration(*base);
  if (BenchWeights.getNumOccurrences() || DraftPath.getNumOccurrences())
    return report(flagError("--weights and --draft are for generation: give --generate"));
  std::vector<std::string> recipes(BenchPrecisions.begin(), BenchPrecisions.end());
  if (auto err = checkBenchPrecisions(recipes, /*withAuto=*/true))
    return report(std::move(err));
  constexpr int64_t kMostSteps = 1000000; // (and no overflow in the step counts below)
  if (BenchSteps < 1 || BenchSteps > kMostSteps || BenchWarmup < 0 || BenchWarmup > kMostSteps)
    return report(flagError(fmt::format("--bench-steps must be 1 to {} and --warmup 0 to {}, got {} and {}",
                                        kMostSteps, kMostSteps, int64_t(BenchSteps), int64_t(BenchWarmup))));
  if (std::optional<int> launched = launchRanks()) // --gpus N: the ranks run it, rank 0 prints
    return *launched;
  auto setup = joinRanks();
  if (!setup)
    return report(setup.takeError());
  if (recipes.empty()) // auto is fp32 on the CPU: the first row again
    recipes = setup->device == Device::Cuda ? std::vector<std::string>{"fp32", "bf16", "fp8", "auto"}
                                            : std::vector<std::string>{"fp32", "bf16", "fp8"};
  printBenchHeader(*base, setup->ranks);
  if (auto err = checkBenchJson())
    return report(std::move(err));
  llvm::json::Array results; // --json: one object per recipe
  std::vector<std::pair<std::string, std::vector<Fp8TensorSummary>>> fp8States;
  for (const std::string &recipe : recipes) {
    ModelConfig config = *base;
    config.precision.recipe = *parseRecipe(recipe); // (checkBenchPrecisions': a recipe)
    config.train.steps = std::max<int64_t>(config.train.steps, BenchWarmup + BenchSteps + 1);
    auto trainer = Trainer::create(config, "", setup->device, setup->communicator.get());
    if (!trainer) {
      llvm::outs() << fmt::format("{:<6} {}\n", recipe, llvm::toString(trainer.takeError()));
      continue;
    }
    if (!(*trainer)->recomputeNote().empty())
      llvm::outs() << "       " << (*trainer)->recomputeNote() << "\n";
    std::vector<double> times;
    double loss = 0;
    for (int64_t i = 0; i < BenchWarmup + BenchSteps; ++i) {
      auto r = (*trainer)->step();
      if (!r)
        return report(r.takeError());
      if (i >= BenchWarmup)
        times.push_back(r->stepMs);
      loss = r->loss;
    }
    // One more step with each op timed on its own: the share of GEMMs, attention and the rest.
    Executor &executor = (*trainer)->executor();
    executor.setProfiling(true);
    auto profiled = (*trainer)->step();
    executor.setProfiling(false);
    if (!profiled)
      return report(profiled.takeError());
    TimeShares shares = timeShares(executor.profileByOp());
    double median = medianOf(times), mean = 0;
    for (double t : times)
      mean += t / times.size();
    double tokens = double(config.train.batch) * config.seqLen;
    std::string where = deviceName(**trainer);
    double memoryMiB = double((*trainer)->executor().deviceBytes()) / (1 << 20);
    double tflops = trainingFlops(config) / (median / 1000) / 1e12;
    llvm::outs() << fmt::format("{:<6} {:<34} {:>10.2f} {:>10.2f} {:>12.0f} {:>9.3f} {:>11.0f} {:>10.4f}\n",
                                recipe, where, median, mean, tokens / (median / 1000), tflops, memoryMiB, loss);
    llvm::outs() << fmt::format("       time in GEMMs {:.1f}%, attention {:.1f}%, {}the rest {:.1f}% (one more step, "
                                "each op timed on its own)\n",
                                100 * shares.gemms, 100 * shares.attention,
                                setup->ranks > 1 ? fmt::format("all-reduce {:.1f}%, ", 100 * shares.communication) : "",
                                100 * shares.rest);
    llvm::json::Array memoryLines = printMemory(executor);
    llvm::json::Object result = runDescription(**trainer);
    result["median_ms"] = median;
    result["mean_ms"] = mean;
    result["tokens_per_s"] = tokens / (median / 1000);
    result["model_tflops"] = tflops;
    result["memory_mib"] = memoryMiB;
    result["memory_by_class"] = std::move(memoryLines);
    result["final_loss"] = loss;
    result["time_shares"] = llvm::json::Object{{"gemms", shares.gemms}, {"attention", shares.attention},
                                               {"all_reduce", shares.communication}, {"rest", shares.rest}};
    result["gpus"] = setup->ranks;
    results.push_back(std::move(result));
    const PrecisionConfig &resolved = (*trainer)->config().precision;
    if (resolved.recipe == Recipe::Fp8 || !resolved.measured.empty())
      printFp8Layers(**trainer);
    if (resolved.recipe == Recipe::Fp8) {
      auto state = (*trainer)->fp8State();
      if (!state)
        return report(state.takeError());
      fp8States.emplace_back(recipe, summarizeFp8State(*state, config.precision));
    }
  }
  for (auto &[recipe, summary] : fp8States)
    printBenchFp8State(recipe, std::move(summary));
  if (!BenchJson.empty() && setup->rank == 0) {
    std::string text;
    llvm::raw_string_ostream(text) << llvm::json::Value(llvm::json::Object{{"bench_steps", int64_t(BenchSteps)},
                                                                           {"warmup", int64_t(BenchWarmup)},
                                                                           {"results", std::move(results)}})
                                   << "\n";
    if (auto err = writeFileAtomically(BenchJson, text))
      return report(std::move(err));
  }
  return 0;
}

} // namespace tgc::cli
