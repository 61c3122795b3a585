// cse: an op with the same kind, operands and attributes as an earlier one is replaced by it.
// Ops other than assign are pure; leaves (inputs, parameters, state, constants) are distinct by
// definition.
#include "transforms/Passes.h"

#include <map>
#include <tuple>

namespace tgc {
namespace {

class CommonSubexpressionElimination : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    // Keyed by operand *names* (unique, stable), never by pointers, so the choice is
    // deterministic.
    using Key = std::tuple<OpKind, std::vector<std::string>, std::string>;
    std::map<Key, Op *> seen;
    std::vector<Op *> merged;
    for (Op *op : graph.ops()) {
      if (isLeaf(op->kind()) || hasSideEffects(op->kind()))
        continue;
      std::vector<std::string> operands;
      for (Value *v : op->operands())
        operands.push_back(v->name());
      std::string attrs;
      for (const auto &[k, v] : op->attrs().entries())
        attrs += k + "=" + formatAttr(v) + ";";
      auto [it, inserted] = seen.try_emplace(Key(op->kind(), operands, attrs), op);
      if (inserted)
        continue;
      for (unsigned i = 0; i < op->numResults(); ++i)
        graph.replaceAllUsesWith(op->result(i), it->second->result(i));
      merged.push_back(op);
    }
    graph.eraseOps(merged);
    return !merged.empty();
  }
};

} // namespace

std::unique_ptr<Pass> createCommonSubexpressionEliminationPass() {
  return std::make_unique<CommonSubexpressionElimination>();
}

} // namespace tgc
