// fuse-norm-bias-grad: the bias gradient of a layer whose output the residual stream adds (the
// attention's projection, fc2) is the column sums of the residual stream's gradient, which the
// LayerNorm gradient below it writes (its dx, dres added: fuse-norm-grad-add). reduce_to of that
// dx to its last axis becomes the norm gradient's fourth result {dx_sums}: the kernel that writes
// dx sums its columns as it writes them, instead of a reduction reading dx again.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseNormBiasGrad : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &, Op *reduce) const override {
    Op *back = reduce->kind() == OpKind::ReduceTo ? definedBy(reduce->operand(0), OpKind::LayerNormBackward)
                                                    : nullptr;
    // Legality: the sum is of dx over every axis but its last, and the gradient sums none yet.
    if (!back || back->numResults() != 3 || !isBiasSum(*reduce, back->result(0)))
      return std::nullopt;
    FusionMatch m;
    m.pattern = {back, reduce};
    Replacement &r = m.replacement;
    r.kind = OpKind::LayerNormBackward;
    r.attrs = back->attrs();
    r.attrs.set("dx_sums", true);
    r.operands.append(back->operands().begin(), back->operands().end());
    r.replaces = {back->result(0), back->result(1), back->result(2), reduce->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseNormBiasGradPass() { return std::make_unique<FuseNormBiasGrad>(); }

} // namespace tgc
