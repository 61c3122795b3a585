// fuse-gelu-bias-grad: the bias gradient of the layer before a GELU (reduce_to of the GELU's
// input gradient dx to its last axis) becomes gelu_backward's second result, so that one pass
// over dx computes it and sums its columns, as reduce_to does. Then the GEMMs are dx's only other
// readers: under BF16 it is written in BF16 alone (CudaProgram::bf16Stored), not in fp32 too.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseGeluBiasGrad : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &, Op *reduce) const override {
    Op *back = reduce->kind() == OpKind::ReduceTo ? definedBy(reduce->operand(0), OpKind::GeluBackward) : nullptr;
    // Legality: the sum is over every axis but dx's last (a bias's gradient).
    if (!back || back->numResults() != 1 || !isBiasSum(*reduce, back->result()))
      return std::nullopt;
    FusionMatch m;
    m.pattern = {back, reduce};
    Replacement &r = m.replacement;
    r.kind = OpKind::GeluBackward;
    r.attrs = back->attrs();
    setBiasGrad(r.attrs);
    r.operands.append(back->operands().begin(), back->operands().end());
    r.replaces = {back->result(), reduce->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseGeluBiasGradPass() { return std::make_unique<FuseGeluBiasGrad>(); }

} // namespace tgc
