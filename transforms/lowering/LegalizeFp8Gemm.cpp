// legalize-fp8-gemm: cuBLASLt runs FP8 GEMMs on Hopper in the "TN" layout only: the reduction
// dimension contiguous in both operands, i.e. C = A B^T with A [M, K] and B [N, K] as stored
// (fp8.md). A linear layer's forward product is already so. Its gradients are not: dgrad
// (dY W) reads W [N, K] along N, and wgrad (dY^T X) reads both operands along their rows. This
// pass materialises the transposes those need, as transpose ops on the FP8 values (one per
// value, shared by every GEMM that needs it), and rewrites each FP8 matmul to
// matmul(A, B) {transpose_b=true}. The result is the same to the bit on the CPU interpreter; the
// GPU backend runs it, and refuses an FP8 matmul in any other layout.
#include "transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {
namespace {

class LegalizeFp8Gemm : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    Builder b(graph);
    llvm::DenseMap<Value *, Value *> transposed; // one transpose per FP8 value
    auto transposeOf = [&](Value *v) -> Value * {
      if (Value *t = transposed.lookup(v))
        return t;
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
      bool ta = attrs.getBool("transpose_a").value_or(false);
      bool tb = attrs.getBool("transpose_b").value_or(false);
      if (!ta && tb)
        continue;
      // C = op(A) op(B) = A' B'^T with A' = op(A) and B' = op(B)^T, both as stored.
      if (ta) {
        Value *a = transposeOf(op->operand(0));
        if (!a)
          break;
        op->setOperand(0, a);
        attrs.erase("transpose_a");
      }
      if (!tb) {
        Value *bt = transposeOf(op->operand(1));
        if (!bt)
          break;
        op->setOperand(1, bt);
      }
      attrs.set("transpose_b", true);
      changed = true;
    }
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
