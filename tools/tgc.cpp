// tgc: the runner. Compiles model descriptions, prints the IR after any pass, runs it on the
// CPU reference interpreter, and reports what this machine can run.
#include "compiler/Target.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "passes/Pass.h"
#include "runtime/Data.h"
#include "runtime/Init.h"
#include "runtime/Interpreter.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cmath>
#include <fmt/format.h>

using namespace tgc;
namespace cl = llvm::cl;

static cl::OptionCategory Category("tgc options");

static cl::SubCommand CompileCmd("compile", "Build a model's IR, run the passes and print it");
static cl::SubCommand OptCmd("opt", "Parse IR text, run the given passes and print it");
static cl::SubCommand RunCmd("run", "Run one forward pass on a deterministic batch, print the loss");
static cl::SubCommand InfoCmd("info", "Show the GPU, the libraries and what this machine can run");

static cl::opt<std::string> ModelPath(cl::Positional, cl::desc("<model.yaml>"), cl::Required,
                                      cl::sub(CompileCmd), cl::sub(RunCmd), cl::cat(Category));
static cl::opt<std::string> IRPath(cl::Positional, cl::desc("<file.ir | ->"), cl::Required,
                                   cl::sub(OptCmd), cl::cat(Category));
static cl::list<std::string> Passes("passes", cl::desc("Comma-separated passes to run, in order"),
                                    cl::CommaSeparated, cl::sub(OptCmd), cl::cat(Category));
static cl::list<std::string>
    DumpAfter("dump-after", cl::desc("Print the IR to stderr after <pass>, or after every pass with 'all'"),
              cl::CommaSeparated, cl::sub(CompileCmd), cl::sub(OptCmd), cl::cat(Category));
static cl::list<std::string> DisablePass("disable-pass", cl::desc("Skip the named pass"),
                                         cl::CommaSeparated, cl::sub(CompileCmd), cl::sub(RunCmd),
                                         cl::cat(Category));
static cl::opt<bool> Stats("stats", cl::desc("Print op counts by kind before and after the passes"),
                           cl::sub(CompileCmd), cl::sub(OptCmd), cl::cat(Category));
static cl::opt<int64_t> BatchSize("batch", cl::desc("Batch size (default: the model file's)"),
                              cl::init(0), cl::sub(CompileCmd), cl::sub(RunCmd), cl::cat(Category));
static cl::opt<uint64_t> Seed("seed", cl::desc("Seed of the init and the data (default: the model file's)"),
                              cl::sub(RunCmd), cl::cat(Category));

namespace {

/// Prints one line for the error and returns the exit code.
int report(llvm::Error err) {
  std::string message = llvm::toString(std::move(err));
  if (message.find("error: ") == std::string::npos)
    message = "error: " + message;
  llvm::errs() << "tgc: " << message << "\n";
  return 1;
}

llvm::Expected<int64_t> batchSize(const ModelConfig &config) {
  if (BatchSize.getNumOccurrences() == 0)
    return config.train.batch;
  if (BatchSize < 1 || BatchSize > (1 << 16))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "--batch must be between 1 and 65536, got %lld",
                                   (long long)BatchSize);
  return int64_t(BatchSize);
}

/// Model file -> forward graph -> default pipeline (minus --disable-pass).
llvm::Expected<std::unique_ptr<Graph>> compileModel(const ModelConfig &config, bool stats,
                                                    std::vector<std::string> dumpAfter) {
  auto batch = batchSize(config);
  if (!batch)
    return batch.takeError();
  auto graph = buildGPT(config, *batch);
  if (!graph)
    return graph.takeError();
  PipelineOptions options;
  options.dumpAfter = std::move(dumpAfter);
  options.disabled = DisablePass;
  auto pipeline = PassPipeline::create(defaultPipeline(), options);
  if (!pipeline)
    return pipeline.takeError();
  OpCounts before = countOps(**graph);
  if (auto err = pipeline->run(**graph))
    return std::move(err);
  if (stats) {
    llvm::errs() << fmt::format("// op counts of @{} (passes: {})\n", (*graph)->name(),
                                fmt::join(pipeline->passNames(), ","));
    printOpCountTable(before, countOps(**graph), llvm::errs());
  }
  return graph;
}

int runCompile() {
  auto config = loadModelConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto graph = compileModel(*config, Stats, DumpAfter);
  if (!graph)
    return report(graph.takeError());
  printGraph(**graph, llvm::outs());
  return 0;
}

int runOpt() {
  auto graph = parseGraphFile(IRPath);
  if (!graph)
    return report(graph.takeError());
  PipelineOptions options;
  options.dumpAfter = DumpAfter;
  auto pipeline = PassPipeline::create(Passes, options);
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
  auto config = loadModelConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto graph = compileModel(*config, false, {});
  if (!graph)
    return report(graph.takeError());
  uint64_t seed = Seed.getNumOccurrences() ? uint64_t(Seed) : config->train.seed;
  Interpreter interpreter(**graph);
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
  llvm::outs() << "backends: cpu (reference interpreter, fp32)\n";
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  for (cl::SubCommand *sub : {&CompileCmd, &OptCmd, &RunCmd, &InfoCmd})
    cl::HideUnrelatedOptions(Category, *sub);
  cl::HideUnrelatedOptions(Category);
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "tgc: a transformer graph compiler and runtime\n\n"
          "  tgc compile MODEL.yaml [--dump-after=PASS|all] [--disable-pass=PASS] [--stats]\n"
          "  tgc opt FILE.ir --passes=a,b\n"
          "  tgc run MODEL.yaml\n"
          "  tgc info\n\n"
          "  tgc SUBCOMMAND --help shows the options of each.\n",
          &llvm::errs()))
    return 1;
  if (CompileCmd)
    return runCompile();
  if (OptCmd)
    return runOpt();
  if (RunCmd)
    return runForward();
  if (InfoCmd)
    return runInfo();
  llvm::errs() << "tgc: error: no subcommand given (compile, opt, run, info); see tgc --help\n";
  return 1;
}
