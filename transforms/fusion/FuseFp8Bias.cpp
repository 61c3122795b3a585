// fuse-fp8-bias: an FP8 linear layer's bias added in its product's epilogue. add(matmul(x, w)
// {transpose_b}, b), the product FP8 in cuBLASLt's TN layout and read by this add alone, b a
// parameter, becomes matmul_bias(x, w, b) with the product's FP8 attributes: the fp32 product is
// never written nor read back by an add kernel. (cuBLASLt's FP8 epilogues take a BF16 bias: the
// GPU adds the parameter's BF16 copy, CudaProgram::bf16Rounding, as Transformer Engine does.)
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseFp8Bias : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *add) const override {
    if (add->kind() != OpKind::Add)
      return std::nullopt;
    Op *product = definedBy(add->operand(0), OpKind::MatMul);
    Value *bias = add->operand(1);
    // Legality: an FP8 product x @ w^T (legalize-fp8-gemm's layout) that only this add reads,
    // plus a parameter of one value per column.
    if (!product || !isFp8(product->operand(0)->type().dtype) || product->operand(1)->type().rank() != 2 ||
        !matmulLayout(product->attrs()).transposeB || matmulLayout(product->attrs()).transposeA || soleUser(graph, product->result()) != add ||
        !bias->def() || bias->def()->kind() != OpKind::Param ||
        bias->type() != TensorType(DType::F32, {product->result()->type().dim(-1)}))
      return std::nullopt;
    FusionMatch m;
    m.pattern = {product, add};
    Replacement &r = m.replacement;
    r.kind = OpKind::MatMulBias;
    r.attrs = product->attrs();
    setMatmulLayout(r.attrs, {}); // matmul_bias's weight is [N, K]
    r.operands = {product->operand(0), product->operand(1), bias};
    r.replaces = {add->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseFp8BiasPass() { return std::make_unique<FuseFp8Bias>(); }

} // namespace tgc
