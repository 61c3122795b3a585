// fuse-softmax: scale -> causal_mask -> softmax becomes masked_softmax, the attention
// probabilities in one pass over the [..., T, T] scores (Megatron's fused scale-mask-softmax).
// Where fuse-attention takes the whole attention (the CPU pipeline) nothing is left for it; the
// GPU pipeline, whose attention stays unfused around cuBLASLt GEMMs, is where it pays.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

#include <cmath>

namespace tgc {
namespace {

class FuseSoftmax : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *softmax) const override {
    if (softmax->kind() != OpKind::Softmax)
      return std::nullopt;
    Op *mask = definedBy(softmax->operand(0), OpKind::CausalMask);
    Op *scale = mask ? definedBy(mask->operand(0), OpKind::Scale) : nullptr;
    // Legality: the mask fills with -inf (a mask with another fill is not attention's), and
    // nothing else reads the scaled or the masked scores.
    std::optional<double> fill = mask ? mask->attrs().getFloat("fill") : std::nullopt;
    if (!scale || (fill && !(std::isinf(*fill) && *fill < 0)) ||
        soleUser(graph, scale->result()) != mask || soleUser(graph, mask->result()) != softmax)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {scale, mask, softmax};
    m.replacement.kind = OpKind::MaskedSoftmax;
    m.replacement.operands = {scale->operand(0)};
    m.replacement.attrs.set("scale", *scale->attrs().getFloat("factor"));
    m.replacement.replaces = {softmax->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseSoftmaxPass() { return std::make_unique<FuseSoftmax>(); }

} // namespace tgc
