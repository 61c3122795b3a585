// fuse-norm-grad-add: the add of a norm's input gradient to the residual stream's gradient
// becomes the norm gradient's fourth operand (dres), so that the norm's backward kernel writes
// the sum in the pass that computes dx: one read and one write of the gradient less. The add is
// in fp32 either way, the same bits.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

bool isNormBackward(const Op *op) {
  return op && (op->kind() == OpKind::LayerNormBackward || op->kind() == OpKind::RMSNormBackward);
}

class FuseNormGradAdd : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *add) const override {
    if (add->kind() != OpKind::Add || add->operand(0)->type() != add->operand(1)->type())
      return std::nullopt;
    for (unsigned i = 0; i < 2; ++i) {
      Op *back = add->operand(i)->def();
      // Legality: dx is the norm gradient's first result, read by this add alone, and the
      // gradient does not accumulate yet.
      if (!isNormBackward(back) || back->numOperands() != 3 || back->result(0) != add->operand(i) ||
          soleUser(graph, back->result(0)) != add)
        continue;
      FusionMatch m;
      m.pattern = {back, add};
      Replacement &r = m.replacement;
      r.kind = back->kind();
      r.attrs = back->attrs();
      r.operands.append(back->operands().begin(), back->operands().end());
      r.operands.push_back(add->operand(1 - i));
      r.replaces = {add->result()};
      for (unsigned k = 1; k < back->numResults(); ++k)
        r.replaces.push_back(back->result(k));
      return m;
    }
    return std::nullopt;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseNormGradAddPass() { return std::make_unique<FuseNormGradAdd>(); }

} // namespace tgc
