// fuse-cross-entropy-quantize: the LM head's FP8 output gradient made as the loss reads the
// logits. cross_entropy(logits, targets, dloss) -> (loss, dlogits), whose dlogits only
// quantize(dlogits, scale, scale_inv) {transpose=true} reads (an FP8 head's dgrad and wgrad),
// becomes quantize(logits, scale, scale_inv, targets, dloss) {activation="cross_entropy_backward",
// transpose=true} -> (q, amax, saturated, q_t, loss): the [rows, vocab] gradient (the largest
// tensor of a GPT-2 step) is never stored in fp32 or BF16, only as the FP8 bytes and their
// transpose the two products read. The GPU takes each row's log-sum-exp and loss in one read of
// the logits, then makes the gradient tile by tile in its cast-transpose. The same function on
// the CPU interpreter: cross_entropy's loss and gradient, then the quantize's rounding. It asks
// for transpose=true, which legalize-fp8-gemm has set where the vocabulary and the rows allow it.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseCrossEntropyQuantize : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *quantize) const override {
    if (quantize->kind() != OpKind::Quantize)
      return std::nullopt;
    QuantizeOptions options = quantizeOptions(quantize->attrs());
    if (!options.transpose || options.biasGrad || options.activation != QuantizeActivation::None)
      return std::nullopt;
    Op *loss = definedBy(quantize->operand(0), OpKind::CrossEntropy);
    if (!loss || loss->numOperands() != 3 || loss->result(1) != quantize->operand(0) ||
        soleUser(graph, loss->result(1)) != quantize)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {loss, quantize};
    Replacement &r = m.replacement;
    r.kind = OpKind::Quantize;
    r.attrs = quantize->attrs();
    setQuantizeActivation(r.attrs, QuantizeActivation::CrossEntropyBackward);
    r.operands = {loss->operand(0), quantize->operand(1), quantize->operand(2), loss->operand(1), loss->operand(2)};
    for (unsigned i = 0; i < quantize->numResults(); ++i)
      r.replaces.push_back(quantize->result(i));
    r.replaces.push_back(loss->result(0));
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseCrossEntropyQuantizePass() { return std::make_unique<FuseCrossEntropyQuantize>(); }

} // namespace tgc
