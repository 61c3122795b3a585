// fuse-dgelu: the GELU's gradient taken as the product before it is written. A BF16
// gelu_backward(matmul(dy, w), h) whose h a matmul_bias_gelu kept becomes matmul_dgelu(dy, w, h),
// cuBLASLt's DGELU epilogue (as Transformer Engine runs LayerNormMLP's fc2 dgrad): the product is
// never written, nor read back by a GELU-gradient kernel. Under BF16 the GPU then stores h, the
// product's gradient and fc1's activation in BF16 (CudaProgram::bf16Rounding).
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseDGelu : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *back) const override {
    if (back->kind() != OpKind::GeluBackward || back->numResults() != 1)
      return std::nullopt;
    Op *product = definedBy(back->operand(0), OpKind::MatMul);
    Op *forward = back->operand(1)->def();
    // Legality: a BF16 product (not FP8) that only this gradient reads, and an h the forward's
    // GELU epilogue kept (its second result).
    if (!product || !hasBf16Gemms(product->attrs()) || isFp8(product->operand(0)->type().dtype) ||
        soleUser(graph, product->result()) != back || !forward || forward->kind() != OpKind::MatMulBiasGelu ||
        back->operand(1) != forward->result(1))
      return std::nullopt;
    FusionMatch m;
    m.pattern = {product, back};
    Replacement &r = m.replacement;
    r.kind = OpKind::MatMulDGelu;
    r.attrs = product->attrs();
    r.operands = {product->operand(0), product->operand(1), back->operand(1)};
    r.replaces = {back->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseDGeluPass() { return std::make_unique<FuseDGelu>(); }

} // namespace tgc
