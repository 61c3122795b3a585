#include "runtime/Program.h"

#include "compiler/Target.h"
#include "passes/Pass.h"
#include "runtime/CudaExecutor.h"
#include "runtime/Interpreter.h"

namespace tgc {

PrecisionConfig resolveRecipe(PrecisionConfig precision, Device device) {
  if (precision.recipe != "auto" || device == Device::Cpu)
    return resolveRecipeForCpu(precision);
  TargetInfo target = detectTarget();
  int cc = target.gpus.empty() ? 0 : target.gpus[0].major * 10 + target.gpus[0].minor;
  precision.recipe = cc >= 80 ? "bf16" : "fp32";
  return precision;
}

llvm::Expected<CompiledProgram> compileForDevice(std::unique_ptr<Graph> graph,
                                                 const ModelConfig &config, Device device,
                                                 bool training) {
  CompiledProgram program;
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.precision = program.precision = resolveRecipe(config.precision, device);
  if (device == Device::Cuda && program.precision.recipe == "fp8")
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "error: the GPU backend runs the fp32 and bf16 recipes so far; "
                                   "fp8 runs on the CPU interpreter (--device cpu)");
  std::vector<std::string> passes = device == Device::Cuda ? gpuPipeline(training)
                                    : training            ? trainingPipeline()
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
    program.executor = std::make_unique<Interpreter>(*program.graph);
  }
  return program;
}

} // namespace tgc
