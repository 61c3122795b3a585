// dce: removes ops none of whose results is used. Leaves (inputs, parameters, state) are the
// program's interface and the checkpoint's contents, so they stay even when unused; so do
// assigns.
#include "transforms/Passes.h"

namespace tgc {
namespace {

class DeadCodeElimination : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    bool changed = false;
    std::vector<Op *> ops = graph.ops();
    // Walking backwards frees a whole dead chain in one sweep.
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      Op *op = *it;
      if (isLeaf(op->kind()) || hasSideEffects(op->kind()))
        continue;
      bool used = false;
      for (unsigned i = 0; i < op->numResults() && !used; ++i)
        used = op->result(i)->hasUses() || llvm::is_contained(graph.outputs(), op->result(i));
      if (used)
        continue;
      graph.eraseOp(op);
      changed = true;
    }
    return changed;
  }
};

} // namespace

std::unique_ptr<Pass> createDeadCodeEliminationPass() {
  return std::make_unique<DeadCodeElimination>();
}

} // namespace tgc
