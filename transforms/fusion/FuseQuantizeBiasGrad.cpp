// fuse-quantize-bias-grad: a bias gradient summed from the same gradient an FP8 GEMM quantizes.
// reduce_to(dy) {shape=[C]} (the sums over every axis but dy's last) beside
// quantize(dy, scale, scale_inv) {transpose=true} becomes that quantize's last result
// (bias_grad=true): the cast-transpose sums the columns of the tiles it has read anyway, and
// the separate pass over dy goes (the qkv projection's bias gradient from the attention's
// gradient: [B*T, 3D] read once instead of twice; TE's cast-transpose + dbias). The sums are
// reduce_to's on the CPU interpreter (the same bits there); the GPU's column sums follow the
// tiles' order. It asks for transpose=true (the GPU sums columns in its cast-transpose), which
// legalize-fp8-gemm has set where an FP8 gradient GEMM reads the transpose.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

/// The plain cast-transpose of `v`: quantize(v, ...) {transpose=true} with no activation and no
/// column sums of its own yet.
Op *castTransposeOf(Value *v) {
  for (Op *user : v->users()) {
    if (user->kind() != OpKind::Quantize || user->operand(0) != v)
      continue;
    QuantizeOptions options = quantizeOptions(user->attrs());
    if (options.transpose && !options.biasGrad && options.activation == QuantizeActivation::None)
      return user;
  }
  return nullptr;
}

class FuseQuantizeBiasGrad : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *reduce) const override {
    if (reduce->kind() != OpKind::ReduceTo || !isBiasSum(*reduce, reduce->operand(0)))
      return std::nullopt;
    Op *quantize = castTransposeOf(reduce->operand(0));
    if (!quantize)
      return std::nullopt;
    FusionMatch m;
    // In program order: the fused op's results are then defined where the later of the two was,
    // before every reader of either (applyReplacement restores the order).
    bool reduceFirst = false;
    for (const Op *op : graph.ops()) {
      if (op == reduce || op == quantize) {
        reduceFirst = op == reduce;
        break;
      }
    }
    m.pattern = reduceFirst ? llvm::SmallVector<Op *, 16>{reduce, quantize} : llvm::SmallVector<Op *, 16>{quantize, reduce};
    Replacement &r = m.replacement;
    r.kind = OpKind::Quantize;
    r.attrs = quantize->attrs();
    setBiasGrad(r.attrs);
    r.operands.append(quantize->operands().begin(), quantize->operands().end());
    for (unsigned i = 0; i < quantize->numResults(); ++i)
      r.replaces.push_back(quantize->result(i));
    r.replaces.push_back(reduce->result());
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseQuantizeBiasGradPass() { return std::make_unique<FuseQuantizeBiasGrad>(); }

} // namespace tgc
