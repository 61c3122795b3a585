#include "runtime/Program.h"

#include "compiler/Target.h"
#include "passes/Pass.h"
#include "runtime/CudaExecutor.h"
#include "runtime/Interpreter.h"

#include <fmt/format.h>

namespace tgc {

namespace {
int computeCapability() {
  TargetInfo target = detectTarget();
  return target.gpus.empty() ? 0 : target.gpus[0].major * 10 + target.gpus[0].minor;
}
} // namespace

int recipeCapability(llvm::StringRef recipe) { return recipe == "fp8" ? 89 : recipe == "bf16" ? 80 : 0; }

std::string gpuRecipeFor(int computeCapability) {
  for (const char *recipe : {"fp8", "bf16"})
    if (computeCapability >= recipeCapability(recipe))
      return recipe;
  return "fp32";
}

llvm::Error checkGpuRecipe(const std::string &recipe, int computeCapability) {
  int cc = computeCapability, needed = recipeCapability(recipe);
  if (cc < needed)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        fmt::format("error: the {} recipe needs a GPU of compute capability {}.{} or later; this "
                    "one is {}.{} (--precision fp32, or --device cpu to emulate it)",
                    recipe, needed / 10, needed % 10, cc / 10, cc % 10));
  return llvm::Error::success();
}

PrecisionConfig resolveRecipe(PrecisionConfig precision, Device device) {
  if (precision.recipe != "auto" || device == Device::Cpu)
    return resolveRecipeForCpu(precision);
  precision.recipe = gpuRecipeFor(computeCapability());
  return precision;
}

llvm::Expected<CompiledProgram> compileForDevice(std::unique_ptr<Graph> graph,
                                                 const ModelConfig &config, Device device,
                                                 bool training) {
  CompiledProgram program;
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.precision = program.precision = resolveRecipe(config.precision, device);
  options.disabled = config.disabledPasses;
  // An explicit recipe the GPU cannot serve is an error, not a silent downgrade.
  if (device == Device::Cuda)
    if (auto err = checkGpuRecipe(program.precision.recipe, computeCapability()))
      return std::move(err);
  std::vector<std::string> passes = device == Device::Cuda
                                        ? gpuPipeline(training, program.precision.recipe)
                                    : training ? trainingPipeline()
                                               : forwardPipeline();
  auto pipeline = PassPipeline::create(passes, options);
  if (!pipeline)
    return pipeline.takeError();
  if (auto err = pipeline->run(*graph))
    return std::move(err);
  program.graph = std::move(graph);
  if (device == Device::Cuda) {
    auto executor = createCudaExecutor(*program.graph);
    if (!executor)
      return executor.takeError();
    program.executor = std::move(*executor);
  } else {
    // A program too large for this machine stops here, before any tensor is allocated.
    if (auto err = checkHostMemory(*program.graph))
      return std::move(err);
    program.executor = std::make_unique<Interpreter>(*program.graph);
  }
  return program;
}

} // namespace tgc
