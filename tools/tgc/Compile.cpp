// tgc compile, opt and run: a model file or IR text through the passes, printed; the generated
// CUDA and its NVRTC compilation; one forward pass on the CPU interpreter.
#include "app/Data.h"
#include "app/Init.h"
#include "app/PrecisionProbe.h"
#include "backends/cpu/Interpreter.h"
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/libraries/KernelHeaders.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/libraries/Nvrtc.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/Report.h"
#include "driver/RecomputeBudget.h"
#include "ir/Parser.h"
#include "models/ProgramInterface.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"
#include "transforms/Pass.h"
#include "transforms/Passes.h"
#include "transforms/precision/Precision.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <set>

namespace tgc::cli {

namespace {

static cl::opt<bool> Train("train", cl::desc("Compile the training program (forward, loss, backward, AdamW)"),
                           cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<bool> Decode("decode",
                            cl::desc("Compile the generation step with a KV cache (one token per sequence)"),
                            cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<int64_t> Prefill("prefill",
                                cl::desc("Compile the prompt's program for N positions: it fills the KV cache and "
                                         "gives each sequence's first new token"),
                                cl::init(0), cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<int64_t> Verify("verify",
                               cl::desc("Compile speculative decoding's check: N tokens a sequence over the KV cache "
                                        "(a draft's proposals after the last token), each one's successor"),
                               cl::init(0), cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<int> Ranks("ranks",
                          cl::desc("With --train: the program of one rank of N training data-parallel (its share of "
                                   "the batch; the data-parallel pass reduces over the ranks)"),
                          cl::init(1), cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<std::string> IRPath(cl::Positional, cl::desc("<file.ir | ->"), cl::Required,
                                   cl::sub(optCommand()), cl::cat(category()));
static cl::list<std::string> Passes("passes",
                                    cl::desc("Comma-separated passes to run, in order, instead of "
                                             "the default pipeline ('none': the builder's output)"),
                                    cl::CommaSeparated, cl::sub(optCommand()), cl::sub(compileCommand()),
                                    cl::cat(category()));
static cl::list<std::string>
    DumpAfter("dump-after", cl::desc("Print the IR to stderr after <pass>, or after every pass with 'all'"),
              cl::CommaSeparated, cl::sub(compileCommand()), cl::sub(optCommand()), cl::cat(category()));
static cl::opt<bool> Stats("stats", cl::desc("Print op counts by kind before and after the passes"),
                           cl::sub(compileCommand()), cl::sub(optCommand()), cl::cat(category()));
static cl::opt<bool> ExplainPrecision("explain-precision",
                                      cl::desc("Print each linear layer's precision and why"),
                                      cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<std::string> EmitCuda("emit-cuda", cl::desc("Write the generated CUDA source into this folder"),
                                     cl::value_desc("dir"), cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<std::string> Arch("arch", cl::desc("Compile the generated kernels with NVRTC for sm_XY (no GPU needed)"),
                                 cl::sub(compileCommand()), cl::cat(category()));
static cl::opt<bool> Profile("profile", cl::desc("Print the time spent in each op kind"),
                             cl::sub(runCommand()), cl::cat(category()));

/// --passes as given, with "none" for no pass at all.
std::vector<std::string> explicitPasses() {
  std::vector<std::string> passes;
  for (const std::string &p : Passes)
    if (p != "none")
      passes.push_back(p);
  return passes;
}

/// The compute capability --arch names (sm_90 -> 90), or 0 without --arch.
llvm::Expected<int> archCapability() {
  if (Arch.empty())
    return 0;
  llvm::StringRef digits = llvm::StringRef(Arch).drop_front(3).take_while(llvm::isDigit);
  int cc = 0;
  if (!llvm::StringRef(Arch).starts_with("sm_") || digits.size() < 2 || digits.getAsInteger(10, cc))
    return flagError(fmt::format("--arch must look like sm_90, got '{}'", Arch.getValue()));
  return cc;
}

/// The precision a compiled program gets: with --arch, what a GPU of that architecture runs
/// (auto takes its device policy, as tgc train does there; an explicit recipe it cannot run is
/// an error), else the CPU's (auto is fp32).
llvm::Expected<PrecisionConfig> compileRecipe(PrecisionConfig precision) {
  auto cc = archCapability();
  if (!cc)
    return cc.takeError();
  if (*cc == 0)
    return resolveRecipeForCpu(precision);
  Recipe best = gpuRecipeFor(*cc);
  if (precision.recipe == Recipe::Auto)
    precision.recipe = best;
  if (int needed = recipeCapability(precision.recipe); *cc < needed)
    return flagError(fmt::format("--arch {}: the {} recipe needs compute capability {}.{} or later "
                                 "(--precision {} or lower)",
                                 Arch.getValue(), recipeName(precision.recipe).str(), needed / 10, needed % 10,
                                 recipeName(best).str()));
  return precision;
}

/// The precision --explain-precision shows: under auto on a machine whose GPU has FP8 (and is
/// the --arch given, if one is), the layers measured faster in FP8 there, as tgc train would
/// choose them; else compileRecipe's, saying that auto measures where it trains.
llvm::Expected<PrecisionConfig> explainedRecipe(const ModelConfig &config) {
  auto precision = compileRecipe(config.precision);
  if (!precision || config.precision.recipe != Recipe::Auto)
    return precision;
  auto cc = archCapability();
  auto device = detectCudaDevice();
  if (!device) {
    llvm::consumeError(device.takeError());
  } else if (cc && (*cc == 0 || *cc == device->computeCapability) &&
             gpuRecipeFor(device->computeCapability) == Recipe::Fp8) {
    return choosePrecision(config, *device);
  }
  if (precision->recipe == Recipe::Fp8)
    llvm::errs() << "// auto: the FP8 layers are chosen by timing them on the GPU that trains (no such GPU here): "
                    "every legal one is shown\n";
  return precision;
}

/// What one rank keeps of a training program's leaves from step to step, by class: what
/// shard: optimizer divides (AdamW's moments) and what it does not.
void printLeafBytes(const Graph &graph, bool sharded, llvm::raw_ostream &os) {
  double parameters = 0, moments = 0, other = 0;
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    const TensorType &type = op->result()->type();
    double mib = double(type.numElements()) * dtypeBytes(type.dtype) / (1 << 20);
    (op->kind() == OpKind::Param ? parameters : program::isOptimizerMoment(op->result()->name()) ? moments : other) += mib;
  }
  if (moments == 0) // (not a training program)
    return;
  os << fmt::format("// a rank's leaves: parameters {:.2f} MiB, AdamW's moments {:.2f} MiB{}, other state {:.2f} MiB\n",
                    parameters, moments, sharded ? fmt::format(" (its 1/{} share)", int(Ranks)) : "", other);
}

/// Model file -> forward (or training) graph -> pipeline (minus --disable-pass).
llvm::Expected<std::unique_ptr<Graph>> compileModel(const ModelConfig &config, bool training,
                                                    bool stats, std::vector<std::string> dumpAfter) {
  if (int(training) + int(Decode) + int(Prefill.getNumOccurrences() > 0) + int(Verify.getNumOccurrences() > 0) > 1)
    return flagError("--train, --decode, --prefill and --verify name different programs: give one");
  if (Prefill.getNumOccurrences() && (Prefill < 1 || Prefill > config.seqLen))
    return flagError(fmt::format("--prefill must be between 1 and seq_len = {}, got {}", config.seqLen, int64_t(Prefill)));
  if (Verify.getNumOccurrences() && (Verify < 1 || Verify > config.seqLen))
    return flagError(fmt::format("--verify must be between 1 and seq_len = {}, got {}", config.seqLen, int64_t(Verify)));
  if (Ranks < 1 || (Ranks > 1 && !training) || config.train.batch % Ranks != 0)
    return flagError(fmt::format("--ranks takes a count of ranks that splits the batch of {} evenly, with --train; "
                                 "got {}",
                                 config.train.batch, int(Ranks)));
  GPTOutput output = Decode                          ? GPTOutput::Decode
                     : Prefill.getNumOccurrences() ? GPTOutput::Prefill
                     : Verify.getNumOccurrences()  ? GPTOutput::Verify
                                                   : GPTOutput::Loss;
  auto graph = buildGPT(config, config.train.batch / Ranks, output, output == GPTOutput::Verify ? Verify : Prefill);
  if (!graph)
    return graph.takeError();
  PipelineOptions options;
  options.dumpAfter = std::move(dumpAfter);
  options.disabled = config.disabledPasses;
  options.passOptions.train = config.train;
  options.passOptions.dataParallel.ranks = Ranks;
  options.passOptions.dataParallel.shardOptimizer = config.train.shardOptimizer; // (rank 0's program)
  options.passOptions.dataParallel.shardGradients = config.train.shardGradients;
  options.passOptions.dataParallel.bf16Gradients = config.train.bf16GradientReduce;
  auto precision = compileRecipe(config.precision);
  if (!precision)
    return precision.takeError();
  options.passOptions.precision = *precision;
  bool gpu = !EmitCuda.empty() || !Arch.empty();
  std::vector<std::string> passes = gpu ? gpuPipeline(training, precision->recipe, precision->fp8Scaling) : cpuPipeline(training, *precision);
  if (Passes.getNumOccurrences())
    passes = explicitPasses();
  auto pipeline = PassPipeline::create(passes, options);
  if (!pipeline)
    return pipeline.takeError();
  OpCounts before = countOps(**graph);
  if (auto err = pipeline->run(**graph))
    return std::move(err);
  if (stats) {
    llvm::errs() << fmt::format("// op counts of @{} (passes: {})\n", (*graph)->name(),
                                fmt::join(pipeline->passNames(), ","));
    printOpCountTable(before, countOps(**graph), llvm::errs());
    printLeafBytes(**graph, config.train.shardOptimizer && Ranks > 1, llvm::errs());
    printGpuMemoryReport(**graph, llvm::errs());
    if (output == GPTOutput::Prefill || output == GPTOutput::Verify)
      llvm::errs() << "// (on a GPU, tgc generate and bench --generate run this program beside the decode step's, "
                      "whose parameters, state and BF16 weight copy it uses where laid out alike: it adds its arena "
                      "and kernel buffers)\n";
  }
  return graph;
}

} // namespace

int runCompile() {
  if (auto err = checkNotEmpty({&EmitCuda}))
    return report(std::move(err));
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  if (config->train.recomputeAuto) { // the layers that fit the budget, as tgc train would choose them
    auto cc = archCapability();
    if (!cc)
      return report(cc.takeError());
    if (!Train || (EmitCuda.empty() && Arch.empty()))
      return report(flagError("recompute: auto (--memory-budget) chooses for a GPU's training program: give "
                              "--train and --arch (or --emit-cuda)"));
    std::string note;
    auto resolved = resolveRecompute(*config, config->train.batch / Ranks, Device{Device::Cuda, *cc ? *cc : 90, 0},
                                     Ranks, &note);
    if (!resolved)
      return report(resolved.takeError());
    *config = std::move(*resolved);
    llvm::errs() << "// " << note << "\n";
  }
  auto graph = compileModel(*config, Train, Stats, DumpAfter);
  if (!graph)
    return report(graph.takeError());
  if (!EmitCuda.empty() || !Arch.empty()) {
    auto cc = archCapability(); // the kernels as --arch has them (0: sm_90)
    if (!cc)
      return report(cc.takeError());
    LoweringOptions options;
    options.computeCapability = *cc;
    auto cuda = lowerToCuda(**graph, options);
    if (!cuda)
      return report(cuda.takeError());
    int64_t launches = 0;
    std::set<std::string> distinct;
    for (const OpLowering &l : cuda->lowering)
      for (const KernelLaunch &launch : l.launches) {
        ++launches;
        distinct.insert(launch.name);
      }
    std::string kernels = fmt::format("{} launches of {} kernels", launches, distinct.size());
    if (!EmitCuda.empty()) {
      if (auto ec = llvm::sys::fs::create_directories(EmitCuda))
        return report(flagError(fmt::format("{}: error: cannot create: {}", EmitCuda.getValue(), ec.message())));
      llvm::SmallString<256> path(EmitCuda.getValue());
      llvm::sys::path::append(path, (*graph)->name() + ".cu");
      if (auto err = writeFileAtomically(path, cuda->source))
        return report(std::move(err));
      // The kernel headers beside it: nvcc -I FOLDER compiles the program as NVRTC does.
      for (const KernelHeader &header : kernelHeaders()) {
        llvm::SmallString<256> headerPath(EmitCuda.getValue());
        llvm::sys::path::append(headerPath, header.name);
        if (auto err = writeFileAtomically(headerPath, header.text))
          return report(std::move(err));
      }
      llvm::errs() << fmt::format("// wrote {} ({})\n", path.str().str(), kernels);
    }
    if (!Arch.empty()) {
      auto module = compileCuda(cuda->source, Arch);
      if (!module)
        return report(module.takeError());
      llvm::errs() << fmt::format("// {} for {}: {}, {} bytes of CUBIN{}\n", kernels,
                                  Arch.getValue(), module->fromCache ? "from the cache" : "compiled by NVRTC",
                                  module->cubin.size(),
                                  module->log.empty() ? ", NVRTC log clean" : "; NVRTC says:\n" + module->log);
    }
  }
  if (ExplainPrecision) {
    auto plain = buildGPT(*config, config->train.batch);
    if (!plain)
      return report(plain.takeError());
    auto precision = explainedRecipe(*config);
    if (!precision)
      return report(precision.takeError());
    llvm::errs() << fmt::format("// precision of @{}'s linear layers (recipe {}{}):\n", config->name,
                                recipeName(precision->recipe).str(),
                                config->precision.recipe == Recipe::Auto ? " from auto" : "");
    for (const std::string &line : explainPrecision(**plain, *precision))
      llvm::errs() << "//   " << line << "\n";
    if (precision->recipe == Recipe::Fp8 && precision->fp8Attention) {
      const ModelConfig &c = *config;
      AttentionHeads heads{c.heads, c.kvHeads > 0 ? c.kvHeads : c.heads,
                           c.position == PositionKind::Rope ? std::optional<double>(c.ropeTheta) : std::nullopt};
      auto refusal = fp8AttentionRefusal(heads, c.dModel / c.heads);
      llvm::errs() << fmt::format("//   attention (every layer)  {} heads of {}  {}\n", c.heads, c.dModel / c.heads,
                                  refusal ? "bf16  (" + *refusal + ")" : "fp8   (fp8_attention: cuDNN's FP8 attention)");
    }
    if (!precision->measuredSummary.empty())
      llvm::errs() << "// " << precision->measuredSummary << "\n";
  }
  printGraph(**graph, llvm::outs());
  return 0;
}

int runOpt() {
  auto graph = parseGraphFile(IRPath);
  if (!graph)
    return report(graph.takeError());
  PipelineOptions options;
  options.dumpAfter = DumpAfter;
  options.passOptions.train.recompute = Recompute;
  auto pipeline = PassPipeline::create(explicitPasses(), options);
  if (!pipeline)
    return report(pipeline.takeError());
  OpCounts before = countOps(**graph);
  if (auto err = pipeline->run(**graph))
    return report(std::move(err));
  if (Stats)
    printOpCountTable(before, countOps(**graph), llvm::errs());
  printGraph(**graph, llvm::outs());
  return 0;
}

int runForward() {
  if (auto err = checkDistinctFiles({{"the model file", ModelPath}}))
    return report(std::move(err));
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto graph = compileModel(*config, false, false, {});
  if (!graph)
    return report(graph.takeError());
  // The recipe the program was compiled in (compileModel's): bf16 and fp8 are emulated bit-exactly.
  auto precision = compileRecipe(config->precision);
  if (!precision)
    return report(precision.takeError());
  uint64_t seed = config->train.seed;
  if (auto err = checkHostMemory(**graph))
    return report(std::move(err));
  Interpreter interpreter(**graph);
  interpreter.setProfiling(Profile);
  if (auto err = interpreter.bindAll(initParams(**graph, seed)))
    return report(std::move(err));
  ArithmeticData data(config->vocab, config->seqLen, config->data, seed);
  int64_t batch = (*graph)->lookup("tokens")->type().dim(0);
  tgc::Batch b = data.trainBatch(0, batch);
  TensorType ids(DType::I32, {batch, config->seqLen});
  if (auto err = interpreter.bind("tokens", Tensor{ids, {}, b.tokens}))
    return report(std::move(err));
  if (auto err = interpreter.bind("targets", Tensor{ids, {}, b.targets}))
    return report(std::move(err));
  auto start = std::chrono::steady_clock::now();
  auto outputs = interpreter.run();
  if (!outputs)
    return report(outputs.takeError());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                  .count();
  llvm::outs() << fmt::format(
      "model {}: {} parameters, batch {} x {} tokens, seed {}\n", config->name,
      config->numParams(), batch, config->seqLen, seed);
  llvm::outs() << fmt::format("loss {:.6f}   ln(vocab) {:.6f}   forward {:.1f} ms on the CPU "
                              "interpreter ({})\n",
                              (*outputs)[0].data[0], std::log(double(config->vocab)), ms,
                              recipeName(precision->recipe).str());
  if (Profile) {
    std::vector<std::pair<double, std::string>> rows;
    for (const auto &[name, opMs] : interpreter.profileByOp())
      rows.emplace_back(opMs, name);
    std::sort(rows.rbegin(), rows.rend());
    for (const auto &[opMs, name] : rows)
      llvm::outs() << fmt::format("  {:<24}{:>10.1f} ms {:>6.1f}%\n", name, opMs, 100 * opMs / ms);
  }
  return 0;
}

} // namespace tgc::cli
