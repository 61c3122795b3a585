// fuse-residual-norm: a residual add read by a norm becomes residual_norm, which returns both
// the sum (the residual stream goes on) and its normalisation, in one pass over the data.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseResidualNorm : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *norm) const override {
    if (!isNorm(norm))
      return std::nullopt;
    Op *add = definedBy(norm->operand(0), OpKind::Add);
    // Legality: a residual add of two tensors of one shape (not a broadcast bias); the sum may
    // have other readers, since the fused op returns it.
    if (!add || add->operand(0)->type() != add->operand(1)->type())
      return std::nullopt;
    FusionMatch m;
    m.pattern = {add, norm};
    Replacement &r = m.replacement;
    r.kind = OpKind::ResidualNorm;
    r.attrs = normAttrs(norm);
    r.operands = {add->operand(0), add->operand(1)};
    r.operands.append(norm->operands().begin() + 1, norm->operands().end());
    r.replaces = {add->result(), norm->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseResidualNormPass() { return std::make_unique<FuseResidualNorm>(); }

} // namespace tgc
