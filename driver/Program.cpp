#include "driver/Program.h"

#include "backends/cpu/Interpreter.h"
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/CudaExecutor.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/Target.h"
#include "support/Error.h"
#include "transforms/Pass.h"

#include <cstdlib>
#include <fmt/format.h>

namespace tgc {

llvm::Expected<Device> detectCudaDevice(int ordinal) {
  TargetInfo target = detectTarget();
  if (target.gpus.empty())
    return stringError("error: no GPU: " + target.noGpuReason);
  if (ordinal < 0 || ordinal >= int(target.gpus.size()))
    return stringError(fmt::format("error: no GPU {}: this machine has {}", ordinal, target.gpus.size()));
  const GpuInfo &gpu = target.gpus[ordinal];
  return Device{Device::Cuda, gpu.major * 10 + gpu.minor, ordinal};
}

PrecisionConfig resolveRecipe(PrecisionConfig precision, const Device &device) {
  if (precision.recipe != Recipe::Auto || device == Device::Cpu)
    return resolveRecipeForCpu(precision);
  precision.recipe = gpuRecipeFor(device.computeCapability);
  return precision;
}

llvm::Expected<PassPipeline> devicePipeline(const ModelConfig &config, const Device &device, bool training,
                                            int ranks, PrecisionConfig &precision, int rank) {
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.dataParallel.ranks = ranks;
  options.passOptions.dataParallel.rank = rank;
  options.passOptions.dataParallel.shardOptimizer = config.train.shardOptimizer;
  options.passOptions.dataParallel.shardGradients = config.train.shardGradients;
  options.passOptions.dataParallel.bf16Gradients = config.train.bf16GradientReduce;
  // TGC_BUCKET_MB: the gradients' all_reduce buckets (PyTorch DDP's bucket_cap_mb, 25 MiB).
  if (const char *mb = std::getenv("TGC_BUCKET_MB")) {
    int64_t value = 0;
    if (llvm::StringRef(mb).getAsInteger(10, value) || value < 1 || value > 65536)
      return stringError(fmt::format("error: TGC_BUCKET_MB takes 1 to 65536 (MiB), got '{}'", mb));
    options.passOptions.dataParallel.bucketBytes = value << 20;
  }
  options.passOptions.precision = precision = resolveRecipe(config.precision, device);
  options.passOptions.precision.forwardOnly = !training;
  options.disabled = config.disabledPasses;
  // An explicit recipe the GPU cannot serve is an error, not a silent downgrade.
  if (device == Device::Cuda) {
    if (auto err = checkGpuRecipe(precision.recipe, device.computeCapability))
      return std::move(err);
  }
  std::vector<std::string> passes = device == Device::Cuda
                                        ? gpuPipeline(training, precision.recipe, precision.fp8Scaling)
                                        : cpuPipeline(training, precision);
  return PassPipeline::create(passes, options);
}

llvm::Expected<CompiledProgram> compileForDevice(std::unique_ptr<Graph> graph,
                                                 const ModelConfig &config, const Device &device,
                                                 bool training, Communicator *communicator,
                                                 Executor *regionsOf) {
  CompiledProgram program;
  auto pipeline = devicePipeline(config, device, training, communicator ? communicator->ranks() : 1,
                                 program.precision, communicator ? communicator->rank() : 0);
  if (!pipeline)
    return pipeline.takeError();
  if (auto err = pipeline->run(*graph))
    return std::move(err);
  program.graph = std::move(graph);
  if (device == Device::Cuda) {
    CudaOptions cuda;
    cuda.device = device.ordinal;
    cuda.communicator = communicator;
    cuda.regionsOf = regionsOf;
    auto executor = createCudaExecutor(*program.graph, cuda);
    if (!executor)
      return executor.takeError();
    program.executor = std::move(*executor);
  } else {
    // A program too large for this machine stops here, before any tensor is allocated.
    if (auto err = checkHostMemory(*program.graph))
      return std::move(err);
    program.executor = std::make_unique<Interpreter>(*program.graph, communicator);
  }
  return program;
}

} // namespace tgc
