// The GEMM epilogues. fuse-bias-activation: linear -> bias add -> gelu becomes
// matmul_bias_gelu, cuBLASLt's GELU_AUX_BIAS epilogue; the pre-activation is its second result
// (the backward reads it). fuse-bias: a linear and its bias add that are left become
// matmul_bias, the BIAS epilogue.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

/// The epilogue op of `kind` over a linear layer and its bias add: (x, weight, bias), with the
/// GEMM's gemm_dtype.
Replacement biasEpilogue(OpKind kind, const Op &linear, const Op &add) {
  Replacement r;
  r.kind = kind;
  r.operands = {linear.operand(0), linear.operand(1), add.operand(1)};
  copyGemmDType(linear, r.attrs);
  return r;
}

class FuseBiasActivation : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *gelu) const override {
    if (gelu->kind() != OpKind::Gelu)
      return std::nullopt;
    Op *add = definedBy(gelu->operand(0), OpKind::Add);
    Op *linear = add ? add->operand(0)->def() : nullptr;
    // Legality: the matmul's product is read only by the bias add (the epilogue never writes
    // it); the pre-activation may have other readers (it is returned).
    if (!isLinear(linear) || biasAddOf(graph, linear->result()) != add)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {linear, add, gelu};
    m.replacement = biasEpilogue(OpKind::MatMulBiasGelu, *linear, *add);
    m.replacement.replaces = {gelu->result(), add->result()};
    return m;
  }
};

class FuseBias : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *add) const override {
    if (add->kind() != OpKind::Add)
      return std::nullopt;
    Op *linear = add->operand(0)->def();
    // Legality: the product is read only by the bias add (the epilogue never writes it).
    if (!isLinear(linear) || biasAddOf(graph, linear->result()) != add)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {linear, add};
    m.replacement = biasEpilogue(OpKind::MatMulBias, *linear, *add);
    m.replacement.replaces = {add->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseBiasPass() { return std::make_unique<FuseBias>(); }

std::unique_ptr<Pass> createFuseBiasActivationPass() {
  return std::make_unique<FuseBiasActivation>();
}

} // namespace tgc
