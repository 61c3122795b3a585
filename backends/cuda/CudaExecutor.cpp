// createCudaExecutor: the device opened, cuDNN's attention planned for it, the program compiled
// (Compile.h), and the runtime (runtime/ProgramRunner.h) given the result to run.
#include "backends/cuda/CudaExecutor.h"

#include "backends/cuda/Compile.h"
#include "backends/cuda/runtime/CudnnAttention.h"
#include "backends/cuda/runtime/Device.h"
#include "backends/cuda/runtime/ProgramRunner.h"
#include "backends/cuda/runtime/Profiler.h"

#include <fmt/format.h>

namespace tgc {

llvm::Expected<std::unique_ptr<Executor>> createCudaExecutor(const Graph &graph, CudaOptions options) {
  auto device = openDevice(options.device);
  if (!device)
    return device.takeError();
  auto profiler = std::make_unique<Profiler>();
  profiler->configure(fmt::format("@{} on {}", graph.name(), device->description));
  LoweringOptions lowering;
  lowering.multiprocessors = device->multiprocessors;
  lowering.computeCapability = device->major * 10 + device->minor;
  lowering.groupOptimizer = options.groupOptimizer;
  lowering.groupFp8Updates = options.groupFp8Updates;
  lowering.storeBf16 = options.storeBf16;
  lowering.bf16Rounding = options.bf16Rounding;
  std::string description = device->description;
  // The attention ops cuDNN takes are planned first: the lowering leaves them to cuDNN, with the
  // workspace each plan needs.
  auto attention = std::make_unique<CudnnAttentionRunner>();
  attention->plan(graph, options.cudnnAttention, *device, profiler->printsPlans(), lowering, description);
  auto compiled = compileCudaProgram(graph, lowering, device->arch);
  if (!compiled)
    return compiled.takeError();
  description += compiled->description;
  auto runner = std::make_unique<ProgramRunner>(graph, options, std::move(*device), std::move(*compiled),
                                                std::move(attention), std::move(profiler), std::move(description));
  if (auto err = runner->initialize())
    return std::move(err);
  return std::unique_ptr<Executor>(std::move(runner));
}

} // namespace tgc
