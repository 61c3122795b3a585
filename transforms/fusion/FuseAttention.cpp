// fuse-attention: the builder's causal attention over a packed qkv (three slices, heads split
// and transposed, scaled scores, causal mask, softmax, weighted sum, heads merged) becomes one
// attention op. Every intermediate must be read only inside the pattern.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

const std::vector<int64_t> kSwapHeads{0, 2, 1, 3};

class FuseAttention : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *merge) const override {
    // merge = reshape(transpose(matmul(probs, v), 0213)) : [B, T, D]
    if (merge->kind() != OpKind::Reshape || merge->result()->type().rank() != 3)
      return std::nullopt;
    llvm::SmallVector<Op *, 20> ops{merge};
    auto single = [&](Value *v, Op *user) { return soleUser(graph, v) == user; };
    // The op defining operand `i` of `user`, if it is of `kind` and read only by `user`.
    auto producer = [&](Op *user, unsigned i, OpKind kind) -> Op * {
      Op *def = definedBy(user->operand(i), kind);
      if (!def || !single(user->operand(i), user))
        return nullptr;
      ops.push_back(def);
      return def;
    };
    Op *unswap = producer(merge, 0, OpKind::Transpose);
    if (!unswap || unswap->attrs().getInts("perm") != kSwapHeads)
      return std::nullopt;
    Op *context = producer(unswap, 0, OpKind::MatMul);
    if (!context || matmulLayout(context->attrs()).transposeA || matmulLayout(context->attrs()).transposeB)
      return std::nullopt;
    Op *softmax = producer(context, 0, OpKind::Softmax);
    Op *mask = softmax ? producer(softmax, 0, OpKind::CausalMask) : nullptr;
    if (!mask || mask->attrs().has("fill"))
      return std::nullopt;
    Op *scale = producer(mask, 0, OpKind::Scale);
    Op *scores = scale ? producer(scale, 0, OpKind::MatMul) : nullptr;
    if (!scores || !matmulLayout(scores->attrs()).transposeB || matmulLayout(scores->attrs()).transposeA)
      return std::nullopt;
    // q, k, v: transpose(reshape(slice(qkv, axis 2, part * D, D)), 0213), one qkv for all.
    Value *qkv = nullptr;
    int64_t heads = 0;
    const int64_t D = merge->result()->type().dim(2);
    auto head = [&](Op *user, unsigned i, int64_t part) {
      Op *swap = producer(user, i, OpKind::Transpose);
      Op *split = swap ? producer(swap, 0, OpKind::Reshape) : nullptr;
      Op *slice = split ? producer(split, 0, OpKind::Slice) : nullptr;
      if (!slice || swap->attrs().getInts("perm") != kSwapHeads ||
          slice->attrs().getInt("axis") != 2 || slice->attrs().getInt("start") != part * D ||
          slice->attrs().getInt("size") != D || split->result()->type().rank() != 4)
        return false;
      if (qkv && slice->operand(0) != qkv)
        return false;
      qkv = slice->operand(0);
      heads = split->result()->type().dim(2);
      return true;
    };
    if (!head(scores, 0, 0) || !head(scores, 1, 1) || !head(context, 1, 2))
      return std::nullopt;
    // Legality: qkv is [B, T, 3D] and the heads split D evenly, as the attention op assumes.
    const TensorType &packed = qkv->type();
    if (packed.rank() != 3 || packed.dim(2) != 3 * D || packed.dim(0) != merge->result()->type().dim(0) ||
        packed.dim(1) != merge->result()->type().dim(1))
      return std::nullopt;

    FusionMatch m;
    m.pattern.assign(ops.rbegin(), ops.rend());
    m.replacement.kind = OpKind::Attention;
    m.replacement.operands = {qkv};
    m.replacement.attrs.set("heads", heads);
    m.replacement.attrs.set("scale", *scale->attrs().getFloat("factor"));
    if (!sameGemmPrecision(scores->attrs(), context->attrs()))
      return std::nullopt;
    copyGemmDType(*scores, m.replacement.attrs);
    m.replacement.replaces = {merge->result()};
    m.replacement.newResults = {merge->result()->name() + ".lse"};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseAttentionPass() { return std::make_unique<FuseAttention>(); }

} // namespace tgc
