// The GPU's plan for a program, as tgc compile --stats prints it: the memory arena, the
// contiguous parameter buffers, the grouped optimizer launches, the BF16 storage choices, and a
// decode step's bytes (its floor at the memory's rate).
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/raw_ostream.h"

namespace tgc {

/// The report, or a line saying that the program has ops the GPU backend does not lower.
void printGpuMemoryReport(const Graph &graph, llvm::raw_ostream &os);

} // namespace tgc
