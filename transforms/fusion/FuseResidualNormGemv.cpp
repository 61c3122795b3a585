// fuse-residual-norm-gemv: a residual_norm whose norm only a product of one row reads (a batch-1
// decode step's GEMV, ir/Gemv.h) becomes residual_norm_linear, with the GELU or the SwiGLU after
// the product where there is one: each of the GEMV's blocks normalises the row it reads (d_model
// features) instead of reading them from a norm kernel before it, and applies the GELU to what it
// writes. Three launches a layer become one or two.
//
// fuse-gemv-gelu: a few-row product with a bias whose only reader is a GELU (a decode step's fc1
// past one row, where the norm stays a kernel of its own) becomes matmul_bias_gelu, which gemv.cuh
// runs with the GELU applied as the product is written: one launch less a layer.
//
// fuse-gelu-epilogue: the same for a BF16 product of many rows (what expand-layernorm-fused
// makes of fc1 where no gradient keeps its h: a prompt's forward, a recomputed layer), its
// pre-activation unread, which the GPU runs as cuBLASLt's GELU_BIAS epilogue writing the
// activation in BF16: the fp32 product is never written, nor read back and written again by a
// GELU kernel.
#include "ir/Attributes.h"
#include "ir/Gemv.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

/// Rows and features of at most this many elements together: the kernel keeps the normalised
/// rows in BF16 in 32 KB of shared memory (each row held in registers as norms.cuh's
/// RowInRegisters holds it: by a warp up to 1024 features, by the block past that).
constexpr int64_t kMaxNormedElements = 16384;
/// Products of at most this many outputs: every block (8 outputs) normalises the rows again, which
/// for a vocabulary's head (50k outputs) would read the rows thousands of times.
constexpr int64_t kMaxOutputs = 16384;

class FuseResidualNormGemv : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *product) const override {
    if (!isGemv(*product) || product->kind() == OpKind::MatMulBiasGelu)
      return std::nullopt;
    Op *norm = definedBy(product->operand(0), OpKind::ResidualNorm);
    const TensorType &w = product->operand(1)->type();
    // One row: 2 to 8 rows go to the tensor cores, whose blocks each normalising all the rows
    // cost more than the norm's own launch (gpt-1.3b, 4 rows: 2.49 ms a step against 1.77).
    if (!norm || norm->result(1) != product->operand(0) || soleUser(graph, norm->result(1)) != product ||
        product->operand(0)->type().numElements() != w.dim(1) || w.dim(1) > kMaxNormedElements ||
        w.dim(0) > kMaxOutputs)
      return std::nullopt;
    bool bias = product->kind() == OpKind::MatMulBias;
    // The activation the product alone feeds: a GELU, or SwiGLU of a product without a bias.
    Op *gelu = soleUser(graph, product->result());
    if (gelu && gelu->kind() != OpKind::Gelu && (gelu->kind() != OpKind::Swiglu || bias))
      gelu = nullptr;
    FusionMatch m;
    m.pattern = {norm, product};
    if (gelu)
      m.pattern.push_back(gelu);
    Replacement &r = m.replacement;
    r.kind = OpKind::ResidualNormLinear;
    r.attrs = norm->attrs();
    copyGemmDType(*product, r.attrs);
    if (bias)
      r.attrs.set("bias", true);
    if (gelu)
      r.attrs.set(kActivation, std::string(gelu->kind() == OpKind::Gelu ? "gelu" : "swiglu"));
    r.operands.append(norm->operands().begin(), norm->operands().end());
    r.operands.push_back(product->operand(1));
    if (bias)
      r.operands.push_back(product->operand(2));
    r.replaces = {norm->result(0), gelu ? gelu->result() : product->result()};
    return m;
  }
};

/// fuse-gemv-gelu (`few`: gemv.cuh's products) and fuse-gelu-epilogue (BF16 products of many
/// rows, cuBLASLt's): product (+ bias) -> gelu becomes matmul_bias_gelu.
class FuseProductGelu : public FusionPass {
public:
  explicit FuseProductGelu(bool few) : few_(few) {}
  std::optional<FusionMatch> match(const Graph &graph, Op *gelu) const override {
    if (gelu->kind() != OpKind::Gelu)
      return std::nullopt;
    Op *product = definedBy(gelu->operand(0), OpKind::MatMulBias);
    if (!product || soleUser(graph, product->result()) != gelu)
      return std::nullopt;
    bool taken = few_ ? fewRows(*product) != FewRows::None
                      : hasBf16Gemms(product->attrs()) && fewRows(*product) == FewRows::None;
    if (!taken)
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

private:
  bool few_;
};

} // namespace

std::unique_ptr<Pass> createFuseResidualNormGemvPass() { return std::make_unique<FuseResidualNormGemv>(); }

std::unique_ptr<Pass> createFuseGemvGeluPass() { return std::make_unique<FuseProductGelu>(true); }
std::unique_ptr<Pass> createFuseGeluEpiloguePass() { return std::make_unique<FuseProductGelu>(false); }

} // namespace tgc
