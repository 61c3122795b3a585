// tgc: the runner. Compiles model descriptions, prints the IR after any pass, trains, generates
// and evaluates, and reports what this machine can run.
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/Lowering.h"
#include "backends/cuda/KernelHeaders.h"
#include "backends/cuda/MemoryPlan.h"
#include "backends/cuda/Nvrtc.h"
#include "backends/cuda/Target.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "transforms/Passes.h"
#include "app/Data.h"
#include "app/Init.h"
#include "backends/cuda/CudaExecutor.h"
#include "backends/cpu/Fp8Scaling.h"
#include "app/Generate.h"
#include "backends/cpu/Interpreter.h"
#include "driver/Program.h"
#include "app/Trainer.h"
#include "support/Files.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <new>
#include <set>
#include <system_error>

using namespace tgc;
namespace cl = llvm::cl;

static cl::OptionCategory Category("tgc options");

static cl::SubCommand CompileCmd("compile", "Build a model's IR, run the passes and print it");
static cl::SubCommand OptCmd("opt", "Parse IR text, run the given passes and print it");
static cl::SubCommand RunCmd("run", "Run one forward pass on a deterministic batch, print the loss");
static cl::SubCommand InfoCmd("info", "Show the GPU, the libraries and what this machine can run");
static cl::SubCommand TrainCmd("train", "Train a model; print the loss per step; save a checkpoint");
static cl::SubCommand GenerateCmd("generate", "Continue a prompt with a trained checkpoint");
static cl::SubCommand EvalCmd("eval", "Score greedy continuations of held-out arithmetic prompts");
static cl::SubCommand InspectCmd("inspect", "Show a checkpoint's FP8 scaling state");
static cl::SubCommand BenchCmd("bench", "Train each precision for a few steps and compare step time and memory");
static cl::opt<std::string> BenchModel(cl::Positional, cl::desc("<model.yaml>"), cl::Required,
                                       cl::sub(BenchCmd), cl::cat(Category));
static cl::list<std::string> BenchPrecisions("precisions", cl::desc("Comma-separated recipes (default fp32,bf16,fp8)"),
                                             cl::CommaSeparated, cl::sub(BenchCmd), cl::cat(Category));
static cl::opt<int64_t> BenchSteps("bench-steps", cl::desc("Timed steps per precision"), cl::init(50),
                                   cl::sub(BenchCmd), cl::cat(Category));
static cl::opt<int64_t> BenchWarmup("warmup", cl::desc("Untimed steps first"), cl::init(10),
                                    cl::sub(BenchCmd), cl::cat(Category));

static cl::opt<std::string> ModelPath(cl::Positional, cl::desc("<model.yaml>"), cl::Required,
                                      cl::sub(CompileCmd), cl::sub(RunCmd), cl::sub(TrainCmd),
                                      cl::cat(Category));
static cl::opt<std::string> CheckpointPath(cl::Positional, cl::desc("<checkpoint.safetensors>"),
                                           cl::Required, cl::sub(GenerateCmd), cl::sub(EvalCmd),
                                           cl::sub(InspectCmd), cl::cat(Category));
static cl::opt<bool> Json("json", cl::desc("Print JSON for scripts"), cl::sub(InspectCmd),
                          cl::cat(Category));
static cl::opt<bool> Train("train", cl::desc("Compile the training program (forward, loss, backward, AdamW)"),
                           cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<bool> Decode("decode",
                            cl::desc("Compile the generation step with a KV cache (one token per sequence)"),
                            cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<std::string> IRPath(cl::Positional, cl::desc("<file.ir | ->"), cl::Required,
                                   cl::sub(OptCmd), cl::cat(Category));
static cl::list<std::string> Passes("passes",
                                    cl::desc("Comma-separated passes to run, in order, instead of "
                                             "the default pipeline ('none': the builder's output)"),
                                    cl::CommaSeparated, cl::sub(OptCmd), cl::sub(CompileCmd),
                                    cl::cat(Category));
static cl::list<std::string>
    DumpAfter("dump-after", cl::desc("Print the IR to stderr after <pass>, or after every pass with 'all'"),
              cl::CommaSeparated, cl::sub(CompileCmd), cl::sub(OptCmd), cl::cat(Category));
static cl::list<std::string> DisablePass("disable-pass", cl::desc("Skip the named pass"),
                                         cl::CommaSeparated, cl::sub(CompileCmd), cl::sub(RunCmd),
                                         cl::sub(TrainCmd), cl::sub(BenchCmd), cl::cat(Category));
static cl::opt<bool> Stats("stats", cl::desc("Print op counts by kind before and after the passes"),
                           cl::sub(CompileCmd), cl::sub(OptCmd), cl::cat(Category));
static cl::opt<int64_t> BatchSize("batch", cl::desc("Batch size (default: the model file's)"),
                              cl::init(0), cl::sub(CompileCmd), cl::sub(RunCmd), cl::sub(TrainCmd),
                              cl::sub(BenchCmd), cl::cat(Category));
static cl::opt<uint64_t> Seed("seed", cl::desc("Seed of the init, the data and sampling (default: the model file's)"),
                              cl::sub(RunCmd), cl::sub(TrainCmd), cl::sub(GenerateCmd),
                              cl::cat(Category));
static cl::opt<std::string> Precision("precision", cl::desc("auto | fp32 | bf16 | fp8 (default: the model file's)"),
                                      cl::sub(CompileCmd), cl::sub(RunCmd), cl::sub(TrainCmd),
                                      cl::cat(Category));
static cl::opt<std::string> Fp8FormatFlag("fp8-format", cl::desc("hybrid | e4m3"), cl::sub(CompileCmd),
                                      cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<int64_t> Margin("margin", cl::desc("FP8 scale margin (scale / 2^margin)"),
                               cl::sub(CompileCmd), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<int64_t> AmaxHistoryLen("amax-history-len", cl::desc("Length of the amax window"),
                                       cl::sub(CompileCmd), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<std::string> AmaxAlgoFlag("amax-compute-algo", cl::desc("max | most_recent"),
                                     cl::sub(CompileCmd), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<int64_t> Fp8MinDim("fp8-min-dim",
                                  cl::desc("Under fp8, GEMMs with K or N below this stay BF16 (0: every eligible GEMM is FP8)"),
                                  cl::sub(CompileCmd), cl::sub(TrainCmd), cl::sub(BenchCmd), cl::cat(Category));
static cl::opt<bool> ExplainPrecision("explain-precision",
                                      cl::desc("Print each linear layer's precision and why"),
                                      cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<int64_t> Fp8SummaryEvery("fp8-summary-every",
                                        cl::desc("Print the FP8 scaling summary every N steps"),
                                        cl::init(0), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<std::string> EmitCuda("emit-cuda", cl::desc("Write the generated CUDA source into this folder"),
                                     cl::value_desc("dir"), cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<std::string> Arch("arch", cl::desc("Compile the generated kernels with NVRTC for sm_XY (no GPU needed)"),
                                 cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<bool> Profile("profile", cl::desc("Print the time spent in each op kind"),
                             cl::sub(RunCmd), cl::cat(Category));
static cl::opt<int64_t> Steps("steps", cl::desc("Training steps (default: the model file's)"),
                              cl::sub(TrainCmd), cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<double> LearningRate("lr", cl::desc("Peak learning rate (default: the model file's)"),
                                    cl::sub(TrainCmd), cl::sub(CompileCmd), cl::cat(Category));
static cl::opt<std::string> SavePath("save", cl::desc("Write a checkpoint here at the end (atomically)"),
                                     cl::value_desc("file.safetensors"), cl::sub(TrainCmd),
                                     cl::cat(Category));
static cl::opt<std::string> ResumePath("resume", cl::desc("Continue from a checkpoint of the same model"),
                                       cl::value_desc("file.safetensors"), cl::sub(TrainCmd),
                                       cl::cat(Category));
static cl::opt<std::string> LogPath("log", cl::desc("Write one JSON record per step"),
                                    cl::value_desc("file.jsonl"), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<std::string> DataPath("data", cl::desc("Train on a file: bytes of text, or uint16 tokens (.bin, .u16, .tokens)"),
                                     cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<std::string> DeviceFlag("device", cl::desc("auto | cpu | cuda"), cl::init("auto"),
                                   cl::sub(TrainCmd), cl::sub(GenerateCmd), cl::sub(EvalCmd), cl::sub(BenchCmd),
                                   cl::cat(Category));
static cl::opt<int64_t> LogEvery("log-every", cl::desc("Print every N steps (default: about 20 lines)"),
                                 cl::init(0), cl::sub(TrainCmd), cl::cat(Category));
static cl::opt<std::string> Prompt("prompt", cl::desc("Token ids, separated by spaces or commas"),
                                   cl::sub(GenerateCmd), cl::cat(Category));
static cl::opt<int64_t> Tokens("tokens", cl::desc("How many tokens to generate"), cl::init(16),
                               cl::sub(GenerateCmd), cl::cat(Category));
static cl::opt<double> Temperature("temperature", cl::desc("0 is greedy"), cl::init(0.0),
                                   cl::sub(GenerateCmd), cl::cat(Category));
static cl::opt<int64_t> TopK("top-k", cl::desc("Sample among the k most likely tokens (0: all)"),
                             cl::init(0), cl::sub(GenerateCmd), cl::cat(Category));
static cl::opt<int64_t> Sequences("sequences", cl::desc("Held-out prompts to score"), cl::init(64),
                                  cl::sub(EvalCmd), cl::cat(Category));
static cl::opt<int64_t> PromptLength("prompt-length", cl::desc("Tokens given of each held-out progression"),
                                     cl::init(8), cl::sub(EvalCmd), cl::cat(Category));

namespace {

/// Prints one line for the error and returns the exit code.
int report(llvm::Error err) {
  std::string message = llvm::toString(std::move(err));
  if (message.find("error: ") == std::string::npos)
    message = "error: " + message;
  llvm::errs() << "tgc: " << message << "\n";
  return 1;
}

llvm::Error flagError(const std::string &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.c_str());
}

/// The model file with the command line's overrides applied and checked.
llvm::Error applyFp8MinDim(PrecisionConfig &p) {
  if (Fp8MinDim < 0 || Fp8MinDim > kMaxDim)
    return flagError(fmt::format("--fp8-min-dim must be between 0 and {}, got {}", kMaxDim,
                                 int64_t(Fp8MinDim)));
  p.fp8MinDim = Fp8MinDim;
  return llvm::Error::success();
}

llvm::Expected<ModelConfig> loadConfig(llvm::StringRef path) {
  auto config = loadModelConfig(path);
  if (!config)
    return config.takeError();
  TrainConfig &t = config->train;
  if (BatchSize.getNumOccurrences()) {
    if (BatchSize < 1 || BatchSize > (1 << 16))
      return flagError(fmt::format("--batch must be between 1 and 65536, got {}", int64_t(BatchSize)));
    t.batch = BatchSize;
  }
  if (Steps.getNumOccurrences()) {
    if (Steps < 0 || Steps > (int64_t(1) << 40))
      return flagError(fmt::format("--steps must be between 0 and 2^40, got {}", int64_t(Steps)));
    t.steps = Steps;
  }
  if (LearningRate.getNumOccurrences()) {
    if (!(LearningRate > 0 && LearningRate <= 10))
      return flagError(fmt::format("--lr must be in (0, 10], got {}", double(LearningRate)));
    t.lr = LearningRate;
  }
  if (Seed.getNumOccurrences())
    t.seed = Seed;
  PrecisionConfig &p = config->precision;
  auto choice = [](const std::string &flag, const std::string &value,
                   std::initializer_list<const char *> allowed) -> llvm::Error {
    for (const char *a : allowed)
      if (value == a)
        return llvm::Error::success();
    std::string list;
    for (const char *a : allowed)
      list += (list.empty() ? "" : " | ") + std::string(a);
    return flagError(fmt::format("--{} must be {}, got '{}'", flag, list, value));
  };
  if (Precision.getNumOccurrences()) {
    if (auto err = choice("precision", Precision, {"auto", "fp32", "bf16", "fp8"}))
      return std::move(err);
    p.recipe = Precision;
  }
  if (Fp8FormatFlag.getNumOccurrences()) {
    if (auto err = choice("fp8-format", Fp8FormatFlag, {"hybrid", "e4m3"}))
      return std::move(err);
    p.fp8Format = Fp8FormatFlag;
  }
  if (AmaxAlgoFlag.getNumOccurrences()) {
    if (auto err = choice("amax-compute-algo", AmaxAlgoFlag, {"max", "most_recent"}))
      return std::move(err);
    p.amaxComputeAlgo = AmaxAlgoFlag;
  }
  if (Margin.getNumOccurrences()) {
    if (Margin < 0 || Margin > 64)
      return flagError(fmt::format("--margin must be between 0 and 64, got {}", int64_t(Margin)));
    p.margin = Margin;
  }
  if (Fp8MinDim.getNumOccurrences()) {
    if (auto err = applyFp8MinDim(p))
      return std::move(err);
  }
  if (AmaxHistoryLen.getNumOccurrences()) {
    if (AmaxHistoryLen < 1 || AmaxHistoryLen > (1 << 16))
      return flagError(fmt::format("--amax-history-len must be between 1 and 65536, got {}",
                                   int64_t(AmaxHistoryLen)));
    p.amaxHistoryLen = AmaxHistoryLen;
  }
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
  std::string why;
  if (DeviceFlag == "cpu")
    return tgc::Device::Cpu;
  if (DeviceFlag == "auto") {
    if (!cudaAvailable(&why))
      return tgc::Device::Cpu;
    return tgc::Device::Cuda;
  }
  if (DeviceFlag == "cuda") {
    if (!cudaAvailable(&why))
      return flagError("--device cuda: " + why);
    return tgc::Device::Cuda;
  }
  return flagError("--device must be auto, cpu or cuda, got '" + DeviceFlag + "'");
}

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
  std::string best = gpuRecipeFor(*cc);
  if (precision.recipe == "auto")
    precision.recipe = best;
  if (int needed = recipeCapability(precision.recipe); *cc < needed)
    return flagError(fmt::format("--arch {}: the {} recipe needs compute capability {}.{} or later "
                                 "(--precision {} or lower)",
                                 Arch.getValue(), precision.recipe, needed / 10, needed % 10, best));
  return precision;
}

/// Model file -> forward (or training) graph -> pipeline (minus --disable-pass).
llvm::Expected<std::unique_ptr<Graph>> compileModel(const ModelConfig &config, bool training,
                                                    bool stats, std::vector<std::string> dumpAfter) {
  if (training && Decode)
    return flagError("--train and --decode name different programs: give one");
  auto graph = buildGPT(config, config.train.batch, Decode ? GPTOutput::Decode : GPTOutput::Loss);
  if (!graph)
    return graph.takeError();
  PipelineOptions options;
  options.dumpAfter = std::move(dumpAfter);
  options.disabled = config.disabledPasses;
  options.passOptions.train = config.train;
  auto precision = compileRecipe(config.precision);
  if (!precision)
    return precision.takeError();
  options.passOptions.precision = *precision;
  bool gpu = !EmitCuda.empty() || !Arch.empty();
  std::vector<std::string> passes = gpu        ? gpuPipeline(training, precision->recipe)
                                    : training ? trainingPipeline()
                                               : forwardPipeline();
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
    // The GPU memory plan, for programs the GPU backend lowers.
    if (auto lowered = lowerToCuda(**graph)) {
      MemoryPlan plan = planMemory(**graph, *lowered);
      const ParameterLayout &layout = lowered->layout;
      auto mib = [](int64_t bytes) { return double(bytes) / double(1 << 20); };
      llvm::errs() << fmt::format("// GPU memory plan: intermediates {:.1f} MiB in one arena ({:.1f} MiB "
                                  "without reuse), parameters, gradients, state and inputs {:.1f} MiB\n",
                                  mib(plan.arenaBytes), mib(plan.withoutReuseBytes),
                                  mib(plan.persistentBytes));
      llvm::errs() << fmt::format("// contiguous buffers: parameters {:.1f} MiB ({} tensors), gradients "
                                  "{:.1f} MiB, state {:.1f} MiB (AdamW's moments {:.1f} MiB)\n",
                                  mib(layout.paramBytes), layout.params.size(), mib(layout.gradBytes),
                                  mib(layout.stateBytes), mib(2 * layout.updatedBytes));
      for (const OpLowering &l : lowered->lowering)
        if (!l.label.empty())
          llvm::errs() << fmt::format("// grouped: {}, {} launch{}\n", l.label, l.launches.size(),
                                      l.launches.size() == 1 ? "" : "es");
      int64_t bf16Values = 0, bf16Bytes = 0;
      for (const Value *v : lowered->bf16Stored)
        if (v->def()->kind() != OpKind::Reshape) {
          ++bf16Values;
          bf16Bytes += storedBytesOf(*lowered, v);
        }
      if (bf16Values)
        llvm::errs() << fmt::format("// {} values stored in BF16, as only BF16 GEMMs read them "
                                    "({:.1f} MiB, half their fp32 size)\n",
                                    bf16Values, mib(bf16Bytes));
      std::vector<std::string> converted; // BF16 GEMM operands a conversion kernel rounds
      std::vector<Op *> loweredOps = (*graph)->ops();
      for (size_t i = 0; i < loweredOps.size(); ++i)
        if (lowered->lowering[i].kind == OpLowering::Gemm && isBf16Gemm(*loweredOps[i]))
          for (unsigned k = 0; k < 2; ++k)
            if (!bf16Ready(*lowered, loweredOps[i]->operand(k)))
              converted.push_back("%" + loweredOps[i]->operand(k)->name());
      if (!converted.empty())
        llvm::errs() << fmt::format("// {} BF16 GEMM operands converted at the GEMM: {}\n",
                                    converted.size(), fmt::join(converted, ", "));
      if (!plan.shadowOffsets.empty())
        llvm::errs() << fmt::format("// {} values with a BF16 copy their producer writes for the "
                                    "BF16 GEMMs that read them\n",
                                    plan.shadowOffsets.size());
      if (!lowered->inPlace.empty())
        llvm::errs() << fmt::format("// {} values written into the state they are assigned to "
                                    "({:.1f} MiB neither in the arena nor copied)\n",
                                    lowered->inPlace.size(), mib(plan.inPlaceBytes));
    } else {
      llvm::consumeError(lowered.takeError());
      llvm::errs() << "// GPU memory plan: this program has ops the GPU backend does not lower "
                      "(compile with --arch or --emit-cuda for the GPU's program)\n";
    }
  }
  return graph;
}

int runCompile() {
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto graph = compileModel(*config, Train, Stats, DumpAfter);
  if (!graph)
    return report(graph.takeError());
  if (!EmitCuda.empty() || !Arch.empty()) {
    auto cuda = lowerToCuda(**graph);
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
    auto precision = compileRecipe(config->precision);
    if (!precision)
      return report(precision.takeError());
    llvm::errs() << fmt::format("// precision of @{}'s linear layers (recipe {}):\n",
                                config->name, precision->recipe);
    for (const std::string &line : explainPrecision(**plain, *precision))
      llvm::errs() << "//   " << line << "\n";
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
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto graph = compileModel(*config, false, false, {});
  if (!graph)
    return report(graph.takeError());
  uint64_t seed = config->train.seed;
  if (auto err = checkHostMemory(**graph))
    return report(std::move(err));
  Interpreter interpreter(**graph);
  interpreter.enableProfile(Profile);
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
                              "interpreter (fp32)\n",
                              (*outputs)[0].data[0], std::log(double(config->vocab)), ms);
  if (Profile) {
    std::vector<std::pair<double, std::string>> rows;
    for (const auto &[name, opMs] : interpreter.profile())
      rows.emplace_back(opMs, name);
    std::sort(rows.rbegin(), rows.rend());
    for (const auto &[opMs, name] : rows)
      llvm::outs() << fmt::format("  {:<24}{:>10.1f} ms {:>6.1f}%\n", name, opMs, 100 * opMs / ms);
  }
  return 0;
}

/// The FP8 scaling summary: one line per quantized tensor.
void printFp8Summary(const std::vector<Fp8TensorSummary> &summary, llvm::raw_ostream &os) {
  os << fmt::format("  {:<30}{:<8}{:>12}{:>12}  {:<40}{:>10}\n", "tensor", "format", "scale",
                    "scale_inv", "amax history (newest first)", "saturated");
  for (const Fp8TensorSummary &s : summary) {
    std::string amax;
    for (float a : s.newestAmax)
      amax += fmt::format("{}{:.4g}", amax.empty() ? "" : " ", a);
    os << fmt::format("  {:<30}{:<8}{:>12.5g}{:>12.5g}  {:<40}{:>10.0f}\n",
                      s.site + " " + s.role, s.format, s.scale, s.scaleInv, amax, s.saturations);
  }
}

/// Fails early, before any training, when the checkpoint could not be written there.
llvm::Error checkWritable(llvm::StringRef path) {
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  if (!llvm::sys::fs::is_directory(dir))
    return flagError(fmt::format("{}: error: folder '{}' does not exist", path.str(), dir.str().str()));
  if (llvm::sys::fs::is_directory(path))
    return flagError(fmt::format("{}: error: is a folder, not a file", path.str()));
  if (llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write))
    return flagError(fmt::format("{}: error: folder '{}' is not writable", path.str(), dir.str().str()));
  return llvm::Error::success();
}

int runTrain() {
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  for (const std::string *path : {&SavePath.getValue(), &LogPath.getValue()})
    if (!path->empty())
      if (auto err = checkWritable(*path))
        return report(std::move(err));
  std::optional<Checkpoint> resumeFrom;
  if (!ResumePath.empty()) {
    auto checkpoint = readCheckpoint(ResumePath);
    if (!checkpoint)
      return report(checkpoint.takeError());
    resumeFrom = std::move(*checkpoint);
  }
  auto trainer = Trainer::create(*config, DataPath, *device);
  if (!trainer)
    return report(trainer.takeError());
  Trainer &t = **trainer;
  if (resumeFrom)
    if (auto err = t.resume(*resumeFrom, ResumePath))
      return report(std::move(err));
  const ModelConfig &c = t.config();
  int64_t total = c.train.steps, tokensPerStep = c.train.batch * c.seqLen;
  llvm::outs() << fmt::format("model {}: {} parameters, batch {} x {} tokens, {} steps, lr {}, "
                              "seed {}\n",
                              c.name, c.numParams(), c.train.batch, c.seqLen, total,
                              formatDouble(c.train.lr), c.train.seed);
  std::string recipe = c.precision.recipe; // resolved by the trainer for its device
  bool emulated = recipe != "fp32" && llvm::StringRef(t.executor().describe()).starts_with("cpu");
  llvm::outs() << fmt::format("device: {}, precision {}{}\ndata: {}\n", t.executor().describe(),
                              recipe, emulated ? " (emulated)" : "", t.data().describe());
  if (t.stepsDone())
    llvm::outs() << fmt::format("resumed from {} at step {}\n", ResumePath.getValue(), t.stepsDone());

  std::unique_ptr<llvm::raw_fd_ostream> log;
  if (!LogPath.empty()) {
    std::error_code ec;
    log = std::make_unique<llvm::raw_fd_ostream>(LogPath, ec);
    if (ec)
      return report(flagError(fmt::format("{}: error: cannot write: {}", LogPath.getValue(), ec.message())));
  }
  bool terminal = llvm::sys::Process::StandardOutIsDisplayed();
  int64_t every = LogEvery > 0 ? int64_t(LogEvery) : std::max<int64_t>(1, total / 20);
  std::vector<double> losses;
  double totalMs = 0;
  while (t.stepsDone() < total) {
    auto record = t.step();
    if (!record)
      return report(record.takeError());
    losses.push_back(record->loss);
    totalMs += record->stepMs;
    double tokensPerSecond = tokensPerStep / (record->stepMs / 1000.0);
    std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  "
                                   "{:.1f} ms  {:.0f} tok/s",
                                   record->step, total, record->loss, record->lr,
                                   record->gradNorm, record->stepMs, tokensPerSecond);
    bool print = record->step % every == 0 || record->step == 1 || record->step == total;
    if (terminal) {
      int width = 30, filled = int(width * record->step / std::max<int64_t>(total, 1));
      llvm::outs() << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] "
                   << line << (print ? "\n" : "");
      llvm::outs().flush();
    } else if (print) {
      llvm::outs() << line << "\n";
    }
    if (Fp8SummaryEvery > 0 && record->step % Fp8SummaryEvery == 0) {
      auto checkpoint = t.checkpoint();
      if (!checkpoint)
        return report(checkpoint.takeError());
      auto summary = summarizeFp8State(checkpoint->tensors, c.precision);
      llvm::outs() << fmt::format("FP8 scaling state after step {} ({} quantized tensors):\n",
                                  record->step, summary.size());
      printFp8Summary(summary, llvm::outs());
    }
    if (log)
      *log << llvm::json::Value(llvm::json::Object{{"step", record->step},
                                                   {"loss", record->loss},
                                                   {"lr", record->lr},
                                                   {"grad_norm", record->gradNorm},
                                                   {"step_ms", record->stepMs},
                                                   {"tokens_per_s", tokensPerSecond}})
           << "\n";
  }
  if (!losses.empty()) {
    size_t tail = std::min<size_t>(10, losses.size());
    double mean = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i)
      mean += losses[i] / tail;
    llvm::outs() << fmt::format("final loss {:.4f} (mean of the last {}: {:.4f})   random guess "
                                "ln(V) {:.4f}",
                                losses.back(), tail, mean, std::log(double(c.vocab)));
    if (double floor = t.data().lossFloor(); floor > 0)
      llvm::outs() << fmt::format("   task floor {:.4f}", floor);
    llvm::outs() << fmt::format("\n{} steps in {:.1f} s, {:.0f} tokens/s\n", losses.size(),
                                totalMs / 1000, tokensPerStep * losses.size() / (totalMs / 1000));
  }
  if (!SavePath.empty()) {
    auto checkpoint = t.checkpoint();
    if (!checkpoint)
      return report(checkpoint.takeError());
    if (auto err = writeCheckpoint(SavePath, *checkpoint))
      return report(std::move(err));
    llvm::outs() << fmt::format("saved {} (step {})\n", SavePath.getValue(), t.stepsDone());
  }
  return 0;
}

/// A checkpoint and the model it was trained for.
llvm::Expected<std::pair<ModelConfig, Checkpoint>> loadTrained(llvm::StringRef path) {
  auto checkpoint = readCheckpoint(path);
  if (!checkpoint)
    return checkpoint.takeError();
  auto config = checkpointModel(*checkpoint, path);
  if (!config)
    return config.takeError();
  return std::make_pair(std::move(*config), std::move(*checkpoint));
}

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

/// Model FLOPs of one training step: 6 per parameter per token, plus attention's
/// 12 * layers * seq_len * d_model per token (the PaLM appendix's count).
double trainingFlops(const ModelConfig &c) {
  double tokens = double(c.train.batch) * double(c.seqLen);
  return tokens * (6.0 * double(c.numParams()) + 12.0 * c.layers * double(c.seqLen) * c.dModel);
}

int runBench() {
  auto base = loadConfig(BenchModel); // with --batch and --fp8-min-dim applied
  if (!base)
    return report(base.takeError());
  std::vector<std::string> recipes(BenchPrecisions.begin(), BenchPrecisions.end());
  if (recipes.empty())
    recipes = {"fp32", "bf16", "fp8"};
  if (BenchSteps < 1 || BenchWarmup < 0)
    return report(flagError("--bench-steps must be >= 1 and --warmup >= 0"));
  llvm::outs() << fmt::format("tgc bench {}: batch {} x {} tokens, {} warm-up + {} timed steps per precision\n",
                              base->name, base->train.batch, base->seqLen, int64_t(BenchWarmup),
                              int64_t(BenchSteps));
  llvm::outs() << fmt::format("{:<6} {:<34} {:>10} {:>10} {:>12} {:>9} {:>11} {:>10}\n", "recipe",
                              "device", "median ms", "mean ms", "tokens/s", "TFLOP/s", "memory MiB",
                              "final loss");
  std::vector<std::pair<std::string, std::vector<Fp8TensorSummary>>> fp8States;
  for (const std::string &recipe : recipes) {
    if (recipe != "fp32" && recipe != "bf16" && recipe != "fp8")
      return report(flagError("--precisions takes fp32, bf16 and fp8, got '" + recipe + "'"));
    ModelConfig config = *base;
    config.precision.recipe = recipe;
    config.train.steps = std::max<int64_t>(config.train.steps, BenchWarmup + BenchSteps);
    auto device = resolveDevice();
    if (!device)
      return report(device.takeError());
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
    // The device without the kernel-cache note that follows its first comma.
    std::string where = (*trainer)->executor().describe();
    where = where.substr(0, where.find(", "));
    llvm::outs() << fmt::format("{:<6} {:<34} {:>10.2f} {:>10.2f} {:>12.0f} {:>9.3f} {:>11.0f} {:>10.4f}\n",
                                recipe, where, median, mean,
                                tokens / (median / 1000), trainingFlops(config) / (median / 1000) / 1e12,
                                double((*trainer)->executor().deviceBytes()) / (1 << 20), loss);
    if (recipe == "fp8") {
      int64_t fp8Layers = 0, linearLayers = 0;
      for (const Op *op : (*trainer)->program().ops()) { // linear weights: [out, in] "*.weight"
        llvm::StringRef site = op->result() ? llvm::StringRef(op->result()->name()) : "";
        if (op->kind() != OpKind::Param || op->result()->type().rank() != 2 || !site.consume_back(".weight"))
          continue;
        ++linearLayers;
        fp8Layers += (*trainer)->program().lookup((site + ".fp8.weight.scale").str()) != nullptr;
      }
      linearLayers += config.tieEmbeddings; // the head reads wte, which the loop does not count
      llvm::outs() << fmt::format("       {} of {} linear layers in FP8 (fp8_min_dim {}; compile "
                                  "--explain-precision says why)\n",
                                  fp8Layers, linearLayers, config.precision.fp8MinDim);
      auto checkpoint = (*trainer)->checkpoint();
      if (!checkpoint)
        return report(checkpoint.takeError());
      fp8States.emplace_back(recipe, summarizeFp8State(checkpoint->tensors, config.precision));
    }
  }
  for (auto &[recipe, summary] : fp8States) {
    llvm::outs() << fmt::format("FP8 scaling state after the fp8 run ({} quantized tensors):\n", summary.size());
    printFp8Summary(summary, llvm::outs());
  }
  return 0;
}

int runInspect() {
  auto trained = loadTrained(CheckpointPath);
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  PrecisionConfig precision = resolveRecipeForCpu(config.precision);
  auto summary = summarizeFp8State(checkpoint.tensors, precision, /*newest=*/8);
  int64_t step = checkpoint.meta.getInteger("step").value_or(0);
  if (Json) {
    llvm::json::Array tensors;
    for (const Fp8TensorSummary &s : summary) {
      llvm::json::Array amax;
      for (float a : s.newestAmax)
        amax.push_back(double(a));
      tensors.push_back(llvm::json::Object{{"gemm", s.site},
                                           {"operand", s.role},
                                           {"format", s.format},
                                           {"scale", double(s.scale)},
                                           {"scale_inv", double(s.scaleInv)},
                                           {"amax_newest_first", std::move(amax)},
                                           {"amax_history_len", s.historyLength},
                                           {"saturated", s.saturations}});
    }
    llvm::outs() << llvm::json::Value(llvm::json::Object{{"model", config.name},
                                                          {"step", step},
                                                          {"recipe", precision.recipe},
                                                          {"fp8_format", precision.fp8Format},
                                                          {"margin", precision.margin},
                                                          {"amax_compute_algo", precision.amaxComputeAlgo},
                                                          {"tensors", std::move(tensors)}})
                 << "\n";
    return 0;
  }
  llvm::outs() << fmt::format("{}: model {}, step {}, recipe {}", CheckpointPath.getValue(),
                              config.name, step, precision.recipe);
  if (precision.recipe == "fp8")
    llvm::outs() << fmt::format(" ({}, margin {}, amax history {}, {})", precision.fp8Format,
                                precision.margin, precision.amaxHistoryLen,
                                precision.amaxComputeAlgo);
  llvm::outs() << "\n";
  if (summary.empty()) {
    llvm::outs() << "no FP8 scaling state: nothing in this model was quantized\n";
    return 0;
  }
  llvm::outs() << fmt::format("{} quantized tensors:\n", summary.size());
  printFp8Summary(summary, llvm::outs());
  return 0;
}

int runInfo() {
  TargetInfo info = detectTarget();
  llvm::outs() << fmt::format("tgc built with CUDA: {}\n", info.builtWithCuda ? "yes" : "no");
  if (info.builtWithCuda) {
    llvm::outs() << fmt::format("  cudart {}.{}, NVRTC {}.{}, cuBLASLt {}\n",
                                info.runtimeVersion / 1000, info.runtimeVersion % 1000 / 10,
                                info.nvrtcMajor, info.nvrtcMinor, info.cublasLtVersion);
    if (info.driverVersion)
      llvm::outs() << fmt::format("  CUDA driver {}.{}\n", info.driverVersion / 1000,
                                  info.driverVersion % 1000 / 10);
  }
  for (size_t i = 0; i < info.gpus.size(); ++i) {
    const GpuInfo &g = info.gpus[i];
    llvm::outs() << fmt::format("GPU {}: {}, compute capability {}.{}, {} SMs, {:.1f} GiB\n", i,
                                g.name, g.major, g.minor, g.smCount,
                                double(g.memoryBytes) / double(1ull << 30));
  }
  if (info.gpus.empty())
    llvm::outs() << "GPU: none (" << info.noGpuReason << ")\n";
  llvm::outs() << "backends: cpu (reference interpreter)"
               << (info.gpus.empty() ? "" : ", cuda (generated kernels + cuBLASLt)") << "\n";
  llvm::outs() << "recipes:\n"
                  "  fp32  cpu: yes\n"
                  "  bf16  cpu: yes, emulated (operands rounded to BF16 as CUDA rounds them, "
                  "fp32 accumulation)\n"
                  "  fp8   cpu: yes, emulated (E4M3/E5M2 bit for bit with cuda_fp8.h, delayed "
                  "scaling as Transformer Engine)\n";
  for (const GpuInfo &g : info.gpus) {
    int cc = g.major * 10 + g.minor;
    llvm::outs() << fmt::format("  on {} (compute capability {}.{}): FP8 tensor cores {}, BF16 {}\n",
                                g.name, g.major, g.minor,
                                cc >= 89 ? "yes" : "no (needs 8.9)",
                                cc >= 80 ? "yes" : "no (needs 8.0)");
  }
  llvm::outs() << "  GPU backend (NVRTC kernels, cuBLASLt): fp32, bf16 (from 8.0) and fp8 (from 8.9)\n"
                  "  --precision auto: fp32 on the CPU interpreter; on a GPU fp8 from compute "
                  "capability 8.9, bf16 from 8.0, fp32 below\n"
                  "  under fp8, a GEMM smaller than fp8_min_dim stays BF16 (compile --explain-precision)\n";
  return 0;
}

/// Every subcommand and what runs it, in the order of tgc --help.
struct Subcommand {
  cl::SubCommand *command;
  int (*run)();
};
const Subcommand kSubcommands[] = {
    {&CompileCmd, runCompile}, {&OptCmd, runOpt},         {&RunCmd, runForward},
    {&InfoCmd, runInfo},       {&TrainCmd, runTrain},     {&GenerateCmd, runGenerate},
    {&EvalCmd, runEval},       {&InspectCmd, runInspect}, {&BenchCmd, runBench},
};

/// The chosen subcommand's exit status.
int runSubcommand() {
  for (const Subcommand &s : kSubcommands)
    if (*s.command)
      return s.run();
  llvm::errs() << "tgc: error: no subcommand given (compile, opt, run, train, generate, eval, inspect, "
                  "bench, info); see tgc --help\n";
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  for (const Subcommand &s : kSubcommands)
    cl::HideUnrelatedOptions(Category, *s.command);
  cl::HideUnrelatedOptions(Category);
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "tgc: a transformer graph compiler and runtime\n\n"
          "  tgc compile MODEL.yaml [--dump-after=PASS|all] [--disable-pass=PASS] [--stats]\n"
          "  tgc opt FILE.ir --passes=a,b\n"
          "  tgc run MODEL.yaml\n"
          "  tgc train MODEL.yaml [--steps N] [--save CKPT] [--log FILE.jsonl]\n"
          "  tgc generate CKPT --prompt \"5 12 19\" [--tokens N]\n"
          "  tgc eval CKPT\n"
          "  tgc inspect CKPT [--json]\n"
          "  tgc bench MODEL.yaml [--precisions fp32,bf16,fp8] [--bench-steps N]\n"
          "  tgc info\n\n"
          "  tgc SUBCOMMAND --help shows the options of each.\n",
          &llvm::errs()))
    return 1;
  // A failed allocation (or thread) is an error message and exit 1, not an abort: InitLLVM's
  // out-of-memory handler is replaced so that operator new throws.
  std::set_new_handler(nullptr);
  try {
    return runSubcommand();
  } catch (const std::bad_alloc &) {
    llvm::errs() << "tgc: error: out of host memory; use a smaller --batch or model\n";
    return 1;
  } catch (const std::system_error &e) { // a worker thread the system would not start
    llvm::errs() << "tgc: error: " << e.what() << "\n";
    return 1;
  }
}
