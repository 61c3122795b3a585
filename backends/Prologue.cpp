#include "backends/Prologue.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {

bool isPrologueLeaf(const Op &op) {
  return op.kind() == OpKind::State && op.attrs().getString("init") == "prologue";
}

std::vector<PrologueOp> prologueOps(const Graph &graph) {
  std::vector<Op *> ops = graph.ops();
  llvm::DenseMap<const Value *, const Value *> leafOf; // a value assigned to a leaf: the leaf
  llvm::DenseMap<const Op *, bool> makesPrologue;
  std::vector<const Op *> pending;
  for (const Op *op : ops) {
    if (op->kind() != OpKind::Assign)
      continue;
    const Value *leaf = op->operand(0), *value = op->operand(1);
    leafOf[value] = leaf;
    if (leaf->def() && isPrologueLeaf(*leaf->def()) && value->def() && !makesPrologue[value->def()]) {
      makesPrologue[value->def()] = true;
      pending.push_back(value->def());
    }
  }
  // What those ops read that is neither a leaf nor left in one by the step: made by the ops
  // before them (the FP8 codes of a shard, gathered over the ranks, say).
  auto readFromLeaf = [&](const Value *v) -> const Value * {
    return v->def() && isLeaf(v->def()->kind()) ? v : leafOf.lookup(v);
  };
  while (!pending.empty()) {
    const Op *op = pending.back();
    pending.pop_back();
    for (const Value *v : op->operands()) {
      if (!readFromLeaf(v) && !makesPrologue[v->def()]) {
        makesPrologue[v->def()] = true;
        pending.push_back(v->def());
      }
    }
  }
  std::vector<PrologueOp> out;
  for (const Op *op : ops) {
    if (!makesPrologue.lookup(op))
      continue;
    PrologueOp p{op, {}, {}};
    for (const Value *v : op->operands())
      p.operandLeaves.push_back(readFromLeaf(v));
    for (unsigned r = 0; r < op->numResults(); ++r)
      p.resultLeaves.push_back(leafOf.lookup(op->result(r)));
    out.push_back(std::move(p));
  }
  return out;
}

} // namespace tgc
