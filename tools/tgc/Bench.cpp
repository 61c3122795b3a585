// tgc bench: trains each precision for a few steps and compares step time, throughput and
// memory on one device.
#include "app/Trainer.h"
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
static cl::list<std::string> BenchPrecisions("precisions", cl::desc("Comma-separated recipes (default fp32,bf16,fp8)"),
                                             cl::CommaSeparated, cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchSteps("bench-steps", cl::desc("Timed steps per precision"), cl::init(50),
                                   cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<int64_t> BenchWarmup("warmup", cl::desc("Untimed steps first"), cl::init(10),
                                    cl::sub(benchCommand()), cl::cat(category()));
static cl::opt<std::string> BenchJson("json", cl::desc("Also write the results as JSON here, for scripts"),
                                      cl::value_desc("file.json"), cl::sub(benchCommand()), cl::cat(category()));

/// Model FLOPs of one training step: 6 per parameter per token, plus attention's
/// 12 * layers * seq_len * d_model per token (the PaLM appendix's count).
double trainingFlops(const ModelConfig &c) {
  double tokens = double(c.train.batch) * double(c.seqLen);
  return tokens * (6.0 * double(c.numParams()) + 12.0 * c.layers * double(c.seqLen) * c.dModel);
}

} // namespace

int runBench() {
  auto base = loadConfig(BenchModel); // with --batch and --fp8-min-dim applied
  if (!base)
    return report(base.takeError());
  std::vector<std::string> recipes(BenchPrecisions.begin(), BenchPrecisions.end());
  if (recipes.empty())
    recipes = {"fp32", "bf16", "fp8"};
  constexpr int64_t kMostSteps = 1000000; // (and no overflow in the step counts below)
  if (BenchSteps < 1 || BenchSteps > kMostSteps || BenchWarmup < 0 || BenchWarmup > kMostSteps)
    return report(flagError(fmt::format("--bench-steps must be 1 to {} and --warmup 0 to {}, got {} and {}",
                                        kMostSteps, kMostSteps, int64_t(BenchSteps), int64_t(BenchWarmup))));
  llvm::outs() << fmt::format("tgc bench {}: batch {} x {} tokens, {} warm-up + {} timed steps per precision\n",
                              base->name, base->train.batch, base->seqLen, int64_t(BenchWarmup),
                              int64_t(BenchSteps));
  llvm::outs() << fmt::format("{:<6} {:<34} {:>10} {:>10} {:>12} {:>9} {:>11} {:>10}\n", "recipe",
                              "device", "median ms", "mean ms", "tokens/s", "TFLOP/s", "memory MiB",
                              "final loss");
  auto device = resolveDevice(); // detected once for every precision
  if (!device)
    return report(device.takeError());
  if (!BenchJson.empty())
    if (auto err = checkDistinctFiles({{"the model file", BenchModel}, {"--json", BenchJson}}))
      return report(std::move(err));
  llvm::json::Array results; // --json: one object per recipe
  std::vector<std::pair<std::string, std::vector<Fp8TensorSummary>>> fp8States;
  for (const std::string &recipe : recipes) {
    std::optional<Recipe> parsed = parseRecipe(recipe);
    if (!parsed || *parsed == Recipe::Auto)
      return report(flagError("--precisions takes fp32, bf16 and fp8, got '" + recipe + "'"));
    ModelConfig config = *base;
    config.precision.recipe = *parsed;
    config.train.steps = std::max<int64_t>(config.train.steps, BenchWarmup + BenchSteps);
    auto trainer = Trainer::create(config, "", *device);
    if (!trainer) {
      llvm::outs() << fmt::format("{:<6} {}\n", recipe, llvm::toString(trainer.takeError()));
      continue;
    }
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
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    double median = sorted[sorted.size() / 2], mean = 0;
    for (double t : times)
      mean += t / times.size();
    double tokens = double(config.train.batch) * config.seqLen;
    std::string where = deviceName(**trainer);
    double memoryMiB = double((*trainer)->executor().deviceBytes()) / (1 << 20);
    double tflops = trainingFlops(config) / (median / 1000) / 1e12;
    llvm::outs() << fmt::format("{:<6} {:<34} {:>10.2f} {:>10.2f} {:>12.0f} {:>9.3f} {:>11.0f} {:>10.4f}\n",
                                recipe, where, median, mean, tokens / (median / 1000), tflops, memoryMiB, loss);
    llvm::json::Object result = runDescription(**trainer);
    result["median_ms"] = median;
    result["mean_ms"] = mean;
    result["tokens_per_s"] = tokens / (median / 1000);
    result["model_tflops"] = tflops;
    result["memory_mib"] = memoryMiB;
    result["final_loss"] = loss;
    results.push_back(std::move(result));
    if (recipe == "fp8") {
      int64_t fp8Layers = 0, linearLayers = 0;
      for (const Op *op : (*trainer)->program().ops()) { // linear weights: [out, in] "*.weight"
        llvm::StringRef site = op->result() ? llvm::StringRef(op->result()->name()) : "";
        if (op->kind() != OpKind::Param || op->result()->type().rank() != 2 || !site.consume_back(".weight"))
          continue;
        ++linearLayers;
        fp8Layers += (*trainer)->program().lookup(program::fp8StatePrefix(site, program::Fp8Role::Weight) + ".scale") != nullptr;
      }
      linearLayers += config.tieEmbeddings; // the head reads wte, which the loop does not count
      llvm::outs() << fmt::format("       {} of {} linear layers in FP8 (fp8_min_dim {}; compile "
                                  "--explain-precision says why)\n",
                                  fp8Layers, linearLayers, config.precision.fp8MinDim);
      auto state = (*trainer)->fp8State();
      if (!state)
        return report(state.takeError());
      fp8States.emplace_back(recipe, summarizeFp8State(*state, config.precision));
    }
  }
  for (auto &[recipe, summary] : fp8States) {
    llvm::outs() << fmt::format("FP8 scaling state after the fp8 run ({} quantized tensors):\n", summary.size());
    printFp8Summary(summary, llvm::outs());
  }
  if (!BenchJson.empty()) {
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
