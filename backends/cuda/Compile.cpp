#include "backends/cuda/Compile.h"

#include "backends/cuda/libraries/Nvrtc.h"
#include "backends/cuda/lowering/Lowering.h"

#include <fmt/format.h>
#include <set>

namespace tgc {

llvm::Expected<CompiledCudaProgram> compileCudaProgram(const Graph &graph, const LoweringOptions &options,
                                                       const std::string &arch) {
  auto program = lowerToCuda(graph, options);
  if (!program)
    return program.takeError();
  auto module = compileCuda(program->source, arch);
  if (!module)
    return module.takeError();
  int64_t launches = 0;
  std::set<std::string> kernels;
  for (const OpLowering &l : program->lowering)
    for (const KernelLaunch &launch : l.launches) {
      ++launches;
      kernels.insert(launch.name);
    }
  CompiledCudaProgram compiled;
  compiled.description = fmt::format(", {} launches of {} kernels {}", launches, kernels.size(),
                                     module->fromCache ? "from the kernel cache (no NVRTC compilation)"
                                                       : "compiled by NVRTC");
  compiled.program = std::move(*program);
  compiled.cubin = std::move(module->cubin);
  return compiled;
}

} // namespace tgc
