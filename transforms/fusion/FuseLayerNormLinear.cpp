// fuse-layernorm-linear: norm -> linear (+ bias) becomes layer_norm_linear (TE's LayerNormLinear).
// When something besides the linear reads the norm's output, the fused op returns it too
// (TE's return_layernorm_output).
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseLayerNormLinear : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *linear) const override {
    if (!isLinear(linear))
      return std::nullopt;
    Op *norm = linear->operand(0)->def();
    // Legality: a norm over the features the linear reads (the verifier guarantees the shapes);
    // the norm's output may have other readers, the linear's output only the bias add (if one).
    if (!isNorm(norm) || linear->operand(1) == norm->result())
      return std::nullopt;
    Op *bias = biasAddOf(graph, linear->result());
    bool returnNorm = norm->result()->users().size() > 1 || isGraphOutput(graph, norm->result());

    FusionMatch m;
    m.pattern = {norm, linear};
    Replacement &r = m.replacement;
    r.kind = OpKind::LayerNormLinear;
    r.attrs = normAttrs(norm);
    r.attrs.set("bias", bias != nullptr);
    copyGemmDType(*linear, r.attrs);
    if (returnNorm)
      r.attrs.set("return_norm", true);
    r.operands.append(norm->operands().begin(), norm->operands().end());
    r.operands.push_back(linear->operand(1));
    if (bias) {
      r.operands.push_back(bias->operand(1));
      m.pattern.push_back(bias);
    }
    r.replaces.push_back(bias ? bias->result() : linear->result());
    if (returnNorm)
      r.replaces.push_back(norm->result());
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseLayerNormLinearPass() {
  return std::make_unique<FuseLayerNormLinear>();
}

} // namespace tgc
