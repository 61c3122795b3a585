// A program's prologue: the state a step derives from the other leaves and keeps from one step
// to the next (the FP8 weights of the fp8-weights pass, state {init="prologue"}), made again
// from them where no step has made it yet: after the leaves are initialised or restored. It
// is made by the ops whose results the step assigns to it, each operand read where the step
// leaves it: the leaf it is, or the leaf it is assigned to; an operand that is neither is made
// by the ops before them, as the step makes it (collectives included: every rank runs its
// prologue at the same point). What the end of the step before would have made.
#pragma once

#include "ir/Graph.h"

#include <vector>

namespace tgc {

/// Whether `op` is a state the prologue makes (neither drawn, bound nor checkpointed).
bool isPrologueLeaf(const Op &op);

struct PrologueOp {
  const Op *op = nullptr;
  std::vector<const Value *> operandLeaves; // the leaf each operand is read from (null: made
                                            // by an op before it in the prologue)
  std::vector<const Value *> resultLeaves;  // the leaf each result goes to (null: none)
};

/// The ops that make `graph`'s prologue leaves and what they read, in program order.
std::vector<PrologueOp> prologueOps(const Graph &graph);

} // namespace tgc
