// The GEMM epilogues. fuse-bias-activation: linear -> bias add -> gelu becomes
// matmul_bias_gelu, cuBLASLt's GELU_AUX_BIAS epilogue; the pre-activation is its second result
// (the backward reads it). fuse-bias: a linear and its bias add that are left become
// matmul_bias, the BIAS epilogue.
// fuse-gelu-epilogue: a BF16 matmul_bias of many rows whose only reader is a GELU (what
// expand-layernorm-fused makes of fc1 where no gradient keeps its h: a prompt's forward, a
// recomputed layer) becomes matmul_bias_gelu with its pre-activation unread, which the GPU runs
// as cuBLASLt's GELU_BIAS epilogue writing the activation in BF16: the fp32 product is never
// written, nor read back and written again by a GELU kernel.
#include "ir/Gemv.h"
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

class FuseGeluEpilogue : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *gelu) const override {
    if (gelu->kind() != OpKind::Gelu)
      return std::nullopt;
    Op *product = definedBy(gelu->operand(0), OpKind::MatMulBias);
    if (!product || !hasBf16Gemms(product->attrs()) || fewRows(*product) != FewRows::None ||
        soleUser(graph, product->result()) != gelu)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {product, gelu};
    Replacement &r = m.replacement;
    r.kind = OpKind::MatMulBiasGelu;
    copyGemmDType(*product, r.attrs);
    r.operands.append(product->operands().begin(), product->operands().end());
    r.replaces = {gelu->result(), product->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseBiasPass() { return std::make_unique<FuseBias>(); }
std::unique_ptr<Pass> createFuseGeluEpiloguePass() { return std::make_unique<FuseGeluEpilogue>(); }

std::unique_ptr<Pass> createFuseBiasActivationPass() {
  return std::make_unique<FuseBiasActivation>();
}

} // namespace tgc
