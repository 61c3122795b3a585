// ProgramRunner::memoryReport: the device memory a program holds, by class.
#include "backends/cuda/runtime/ProgramRunner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc {

std::vector<std::string> ProgramRunner::memoryReport() const {
  auto mib = [](int64_t bytes) { return double(bytes) / double(1 << 20); };
  std::vector<std::string> allocated;
  for (const auto &[use, bytes] : memory_.byUse())
    allocated.push_back(fmt::format("{} {:.1f}", use, mib(bytes)));
  std::vector<std::string> lines;
  lines.push_back(fmt::format("allocated {:.1f} MiB: {}", mib(memory_.bytes()), fmt::join(allocated, ", ")));
  std::string breakdown;
  llvm::raw_string_ostream os(breakdown);
  printMemoryBreakdown(memoryBreakdown_, os, "");
  // The second line of the breakdown is the arena's (the first repeats the regions above).
  llvm::StringRef arena = llvm::StringRef(breakdown).split('\n').second.rtrim();
  lines.push_back(arena.str());
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess)
    lines.push_back(fmt::format("the device has {:.1f} of {:.1f} MiB in use (this program's, the CUDA context's and "
                                "the libraries' own, and any other process's)",
                                mib(int64_t(total - free)), mib(int64_t(total))));
  return lines;
}

} // namespace tgc
