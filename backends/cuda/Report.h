// The GPU's plan for a program, as tgc compile --stats prints it: the memory arena, the
// contiguous parameter buffers, the grouped optimizer launches and the BF16 storage choices.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/raw_ostream.h"

namespace tgc {

/// The report, or a line saying that the program has ops the GPU backend does not lower.
void printGpuMemoryReport(const Graph &graph, llvm::raw_ostream &os);

} // namespace tgc
