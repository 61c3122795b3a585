// The IR's text form: flat SSA, one op per line, in program order.
//
//   graph @tiny
//   %tokens = input() : i32[16,32]
//   %wte = param() {init="normal", std=0.02} : f32[64,64]
//   %x = embedding(%wte, %tokens) : f32[16,32,64]
//   ...
//   return %loss
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/raw_ostream.h"

namespace tgc {

void printGraph(const Graph &graph, llvm::raw_ostream &os);
std::string printGraph(const Graph &graph);
/// One op as it appears in the text form, without the newline.
std::string printOp(const Op &op);

} // namespace tgc
