// Parses the IR text form written by Printer.h back into a verified graph.
#pragma once

#include "ir/Graph.h"

namespace tgc {

/// Parses and verifies `text`. Errors read `file:line:col: error: what was expected`.
llvm::Expected<std::unique_ptr<Graph>> parseGraph(llvm::StringRef text, llvm::StringRef file);
/// Reads `path` ("-" is standard input) and parses it.
llvm::Expected<std::unique_ptr<Graph>> parseGraphFile(llvm::StringRef path);

} // namespace tgc
