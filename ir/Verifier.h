// The verifier: operand counts, types, attributes and SSA order of a whole graph.
#pragma once

#include "ir/Graph.h"

namespace tgc {

/// Checks every op against its type rule (Infer.h), that operands are defined above their
/// users and that the graph returns something. Errors on parsed ops name `file:line:col`.
llvm::Error verify(const Graph &graph, llvm::StringRef file = "");

} // namespace tgc
