// fuse-layernorm-mlp: norm -> fc1 (+ bias) -> gelu | swiglu -> fc2 (+ bias) becomes
// layer_norm_mlp (TE's LayerNormMLP). Every intermediate must be read only inside the pattern.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseLayerNormMLP : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *fc2) const override {
    if (!isLinear(fc2))
      return std::nullopt;
    FusionMatch m;
    // Walk up from fc2, collecting ops (in reverse) and requiring each intermediate to have
    // one reader, inside the pattern.
    llvm::SmallVector<Op *, 12> ops{fc2};
    auto single = [&](Value *v, Op *user) { return soleUser(graph, v) == user; };
    Value *act = fc2->operand(0);
    std::string activation;
    Value *h1 = nullptr;
    if (Op *gelu = definedBy(act, OpKind::Gelu); gelu && single(act, fc2)) {
      activation = "gelu";
      ops.push_back(gelu);
      h1 = gelu->operand(0);
      if (!single(h1, gelu))
        return std::nullopt;
    } else if (auto swiglu = matchSwiglu(graph, definedBy(act, OpKind::Mul)); swiglu && single(act, fc2)) {
      activation = "swiglu";
      h1 = swiglu->h;
      ops.append({swiglu->mul, swiglu->silu, swiglu->up, swiglu->gate});
    } else {
      return std::nullopt;
    }
    // h1 = fc1(n) (+ b1).
    Op *bias1 = nullptr, *fc1 = h1->def();
    if (fc1->kind() == OpKind::Add) {
      bias1 = fc1;
      fc1 = fc1->operand(0)->def();
      if (biasAddOf(graph, fc1->result()) != bias1)
        return std::nullopt;
      ops.push_back(bias1);
    }
    if (!isLinear(fc1) || (!bias1 && h1 != fc1->result()))
      return std::nullopt;
    ops.push_back(fc1);
    Op *norm = fc1->operand(0)->def();
    if (!isNorm(norm) || !single(norm->result(), fc1))
      return std::nullopt;
    ops.push_back(norm);
    // fc2 (+ b2); both linears carry a bias or neither does (one `bias` attribute).
    Op *bias2 = biasAddOf(graph, fc2->result());
    if ((bias1 != nullptr) != (bias2 != nullptr))
      return std::nullopt;
    // One gemm_dtype for both GEMMs.
    if (!sameGemmPrecision(fc1->attrs(), fc2->attrs()))
      return std::nullopt;

    m.pattern.assign(ops.rbegin(), ops.rend());
    Replacement &r = m.replacement;
    r.kind = OpKind::LayerNormMLP;
    r.attrs = normAttrs(norm);
    r.attrs.set(kActivation, activation);
    r.attrs.set("bias", bias1 != nullptr);
    copyGemmDType(*fc1, r.attrs);
    r.operands.append(norm->operands().begin(), norm->operands().end());
    r.operands.push_back(fc1->operand(1));
    if (bias1)
      r.operands.push_back(bias1->operand(1));
    r.operands.push_back(fc2->operand(1));
    if (bias2) {
      r.operands.push_back(bias2->operand(1));
      m.pattern.push_back(bias2);
    }
    r.replaces.push_back(bias2 ? bias2->result() : fc2->result());
    r.replaces.push_back(h1); // the fused op keeps fc1's output for its gradient
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseLayerNormMLPPass() { return std::make_unique<FuseLayerNormMLP>(); }

} // namespace tgc
