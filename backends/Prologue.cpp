#include "backends/Prologue.h"

#include "support/Error.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {

bool isPrologueLeaf(const Op &op) {
  return op.kind() == OpKind::State && op.attrs().getString("init") == "prologue";
}

llvm::Expected<std::vector<PrologueOp>> prologueOps(const Graph &graph) {
  std::vector<Op *> ops = graph.ops();
  llvm::DenseMap<const Value *, const Value *> leafOf; // a value assigned to a leaf: the leaf
  llvm::DenseMap<const Op *, bool> makesPrologue;
  for (const Op *op : ops) {
    if (op->kind() != OpKind::Assign)
      continue;
    const Value *leaf = op->operand(0), *value = op->operand(1);
    leafOf[value] = leaf;
    if (leaf->def() && isPrologueLeaf(*leaf->def()) && value->def())
      makesPrologue[value->def()] = true;
  }
  std::vector<PrologueOp> out;
  for (const Op *op : ops) {
    if (!makesPrologue.lookup(op))
      continue;
    PrologueOp p{op, {}, {}};
    for (const Value *v : op->operands()) {
      const Value *leaf = v->def() && isLeaf(v->def()->kind()) ? v : leafOf.lookup(v);
      if (!leaf)
        return makeError("the prologue's %{} reads %{}, which is neither a leaf nor assigned to one",
                         op->result()->name(), v->name());
      p.operandLeaves.push_back(leaf);
    }
    for (unsigned r = 0; r < op->numResults(); ++r)
      p.resultLeaves.push_back(leafOf.lookup(op->result(r)));
    out.push_back(std::move(p));
  }
  return out;
}

} // namespace tgc
