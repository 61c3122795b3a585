// legalize-fp8-gemm: cuBLASLt runs FP8 GEMMs on Hopper in the "TN" layout only: the reduction
// dimension contiguous in both operands, i.e. C = A B^T with A [M, K] and B [N, K] as stored
// (fp8.md). A linear layer's forward product is already so. Its gradients are not: dgrad
// (dY W) reads W [N, K] along N, and wgrad (dY^T X) reads both operands along their rows. This
// pass materialises the transposes those need (one per value, shared by every GEMM that needs
// it) and rewrites each FP8 matmul to matmul(A, B) {transpose_b=true}. A value that is a
// quantize's q, or q with its leading dimensions flattened, is transposed by that quantize: it
// becomes quantize {transpose=true}, which writes q_t in the same pass over its input
// (Transformer Engine's cast-transpose) instead of a transpose reading the bytes back; other
// FP8 values, and shapes whose sides are not multiples of 16 (cuBLASLt's FP8 products need them
// anyway, and the GPU's cast-transpose moves 16 bytes at a time), get a transpose op. The result
// is the same to the bit on the CPU interpreter; the GPU backend runs it, and refuses an FP8
// matmul in any other layout.
#include "support/Error.h"
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

#include "llvm/ADT/DenseMap.h"

#include <fmt/format.h>

namespace tgc {
namespace {

/// The quantize whose q the two-dimensional FP8 value v is, as stored (q itself, or a reshape of
/// q that keeps its last dimension), where its sides are multiples of 16.
Op *quantizeOfRows(Value *v) {
  if (v->type().rank() != 2 || v->type().dim(0) % 16 || v->type().dim(1) % 16)
    return nullptr;
  Value *q = v;
  if (Op *reshape = definedBy(v, OpKind::Reshape))
    q = reshape->operand(0);
  Op *quantize = definedBy(q, OpKind::Quantize);
  return quantize && q == quantize->result(0) && q->type().dim(-1) == v->type().dim(-1) ? quantize : nullptr;
}

/// The 1 x 128 block-scaled quantize whose q `v` is (or a reshape of it), if any.
Op *blockScaledQuantize(Value *v) {
  if (Op *reshape = definedBy(v, OpKind::Reshape))
    v = reshape->operand(0);
  Op *quantize = definedBy(v, OpKind::Quantize);
  if (!quantize || v != quantize->result())
    return nullptr;
  QuantizeOptions options = quantizeOptions(quantize->attrs());
  return options.blockScaling && options.blockRows == 1 ? quantize : nullptr;
}

class LegalizeFp8Gemm : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    Builder b(graph);
    llvm::DenseMap<Value *, Value *> transposed; // one transpose per FP8 value
    std::string failed; // an error of the cast-transpose's rewrite
    auto transposeOf = [&](Value *v) -> Value * {
      if (Value *t = transposed.lookup(v))
        return t;
      if (Op *quantize = quantizeOfRows(v)) {
        if (!quantizeOptions(quantize->attrs()).transpose) {
          // (The rewrite replaces q: v, where it is q, then names the new op's q.)
          bool isQ = v == quantize->result();
          std::string qName = quantize->result()->name();
          Replacement r{OpKind::Quantize, {}, quantize->attrs(), {}, {qName + ".t"}};
          r.operands.append(quantize->operands().begin(), quantize->operands().end());
          setQuantizeTranspose(r.attrs);
          for (unsigned i = 0; i < quantize->numResults(); ++i)
            r.replaces.push_back(quantize->result(i));
          if (auto err = applyReplacement(graph, {quantize}, std::move(r), nullptr, /*sort=*/false)) {
            failed = llvm::toString(std::move(err));
            return nullptr;
          }
          Value *q = graph.lookup(qName);
          if (isQ)
            v = q;
          quantize = q->def();
        }
        transposed[v] = quantize->result(3);
        return quantize->result(3);
      }
      if (Op *q = blockScaledQuantize(v)) {
        // A transpose op would move q's 1 x 128 blocks across the reduction: the wgrad's operand
        // must be quantized again along the rows, which only the quantize can.
        failed = fmt::format("legalize-fp8-gemm: %{} is block-scaled (1 x 128) and not a quantize's q of "
                             "two dimensions: its transpose cannot be quantized again along its rows",
                             q->result()->name());
        return nullptr;
      }
      std::vector<int64_t> perm;
      for (int64_t i = 0; i < int64_t(v->type().rank()); ++i)
        perm.push_back(i);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      AttrMap attrs;
      attrs.set("perm", perm);
      Value *t = b.create(OpKind::Transpose, {v}, std::move(attrs), v->name() + ".t");
      transposed[v] = t;
      return t;
    };
    bool changed = false;
    for (Op *op : graph.ops()) {
      if (op->kind() != OpKind::MatMul || !isFp8(op->operand(0)->type().dtype))
        continue;
      AttrMap &attrs = op->attrs();
      MatMulLayout layout = matmulLayout(attrs);
      bool ta = layout.transposeA, tb = layout.transposeB;
      if (!ta && tb)
        continue;
      // C = op(A) op(B) = A' B'^T with A' = op(A) and B' = op(B)^T, both as stored.
      if (ta) {
        Value *a = transposeOf(op->operand(0));
        if (!a)
          break;
        op->setOperand(0, a);
      }
      if (!tb) {
        Value *bt = transposeOf(op->operand(1));
        if (!bt)
          break;
        op->setOperand(1, bt);
      }
      setMatmulLayout(attrs, kTransposedWeight);
      changed = true;
    }
    if (!failed.empty())
      return stringError(failed);
    if (auto err = b.takeError())
      return std::move(err);
    if (changed)
      graph.sortTopologically();
    return changed;
  }
};

} // namespace

std::unique_ptr<Pass> createLegalizeFp8GemmPass() { return std::make_unique<LegalizeFp8Gemm>(); }

} // namespace tgc
