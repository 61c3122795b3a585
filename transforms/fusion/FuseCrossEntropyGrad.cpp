// fuse-cross-entropy-grad: the loss and its gradient from one pass over the logits. The
// gradient of cross_entropy, whose dloss is a constant (the seed of the backward), becomes the
// forward op's second result: each row's log-sum-exp is taken once, for the loss and for
// dlogits, instead of once by each (the logits are the largest tensor of a GPT's step).
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseCrossEntropyGrad : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &, Op *back) const override {
    if (back->kind() != OpKind::CrossEntropyBackward)
      return std::nullopt;
    Value *dloss = back->operand(0), *logits = back->operand(1), *targets = back->operand(2);
    // Legality: dloss is known before the loss is (a constant), so the forward can take it.
    if (!definedBy(dloss, OpKind::Constant))
      return std::nullopt;
    for (Op *forward : logits->users()) {
      if (forward->kind() != OpKind::CrossEntropy || forward->numOperands() != 2 || forward->operand(0) != logits ||
          forward->operand(1) != targets)
        continue;
      FusionMatch m;
      m.pattern = {forward, back};
      Replacement &r = m.replacement;
      r.kind = OpKind::CrossEntropy;
      r.attrs = forward->attrs();
      r.operands = {logits, targets, dloss};
      r.replaces = {forward->result(), back->result()};
      return m;
    }
    return std::nullopt;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseCrossEntropyGradPass() { return std::make_unique<FuseCrossEntropyGrad>(); }

} // namespace tgc
