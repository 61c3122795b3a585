// dce: removes ops none of whose results is used. Leaves (inputs, parameters, state) are the
// program's interface and the checkpoint's contents, so they stay even when unused; so do
// assigns.
#include "transforms/Passes.h"

#include "llvm/ADT/DenseSet.h"

namespace tgc {
namespace {

class DeadCodeElimination : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    llvm::DenseSet<const Value *> outputs(graph.outputs().begin(), graph.outputs().end());
    llvm::DenseSet<const Op *> dead;
    std::vector<Op *> ops = graph.ops(), erased;
    // Walking backwards frees a whole dead chain in one sweep: an op's users come after it, so
    // each is known to be dead or not when the op is reached.
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      Op *op = *it;
      if (isLeaf(op->kind()) || hasSideEffects(op->kind()))
        continue;
      bool used = false;
      for (unsigned i = 0; i < op->numResults() && !used; ++i)
        used = outputs.contains(op->result(i)) ||
               llvm::any_of(op->result(i)->users(), [&](const Op *user) { return !dead.contains(user); });
      if (used)
        continue;
      dead.insert(op);
      erased.push_back(op);
    }
    graph.eraseOps(erased);
    return !erased.empty();
  }
};

} // namespace

std::unique_ptr<Pass> createDeadCodeEliminationPass() {
  return std::make_unique<DeadCodeElimination>();
}

} // namespace tgc
