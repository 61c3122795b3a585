// fuse-attention: the builder's causal attention over a packed qkv (three slices, heads split
// and transposed, scaled scores, causal mask, softmax, weighted sum, heads merged) becomes one
// attention op; with fewer KV heads (the products grouped per KV head) and with q and k
// rotated by rope, one attention op with kv_heads and rope_theta. Every intermediate must be
// read only inside the pattern.
#include "ir/Attributes.h"
#include "ir/Rope.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

const std::vector<int64_t> kSwapHeads{0, 2, 1, 3};

/// The ops a match takes, and the producers it walks through.
struct Walk {
  const Graph &graph;
  llvm::SmallVector<Op *, 24> ops;
  // The op defining operand `i` of `user`, if it is of `kind` and read only by `user`.
  Op *producer(Op *user, unsigned i, OpKind kind) {
    Op *def = definedBy(user->operand(i), kind);
    if (!def || soleUser(graph, user->operand(i)) != user)
      return nullptr;
    ops.push_back(def);
    return def;
  }
};

/// q, k, v: transpose(reshape(slice(qkv, axis 2, start, heads Dh)), 0213), one qkv for all, the
/// slices side by side from 0; q and k rotated by one rope (positions 0..T-1) or neither.
struct HeadSlices {
  Value *qkv = nullptr;
  std::optional<RopeOptions> rope;
  int64_t heads = 0, kvHeads = 0, dh = 0, start = 0;

  bool match(Walk &w, Op *user, unsigned i, bool query, bool rotatable) {
    Op *rope = rotatable ? definedBy(user->operand(i), OpKind::Rope) : nullptr;
    if (rope) {
      RopeOptions options = ropeOptions(rope->attrs());
      if (!w.producer(user, i, OpKind::Rope) || rope->numOperands() != 1 || options.inverse ||
          (this->rope && (this->rope->theta != options.theta || this->rope->scaling != options.scaling)) ||
          (!this->rope && !query))
        return false;
      this->rope = options;
      user = rope;
      i = 0;
    } else if (this->rope && rotatable) {
      return false; // k unrotated where q was rotated
    }
    Op *swap = w.producer(user, i, OpKind::Transpose);
    Op *split = swap ? w.producer(swap, 0, OpKind::Reshape) : nullptr;
    Op *slice = split ? w.producer(split, 0, OpKind::Slice) : nullptr;
    if (!slice || swap->attrs().getInts("perm") != kSwapHeads || slice->attrs().getInt("axis") != 2 ||
        split->result()->type().rank() != 4 || (qkv && slice->operand(0) != qkv))
      return false;
    int64_t count = split->result()->type().dim(2), width = split->result()->type().dim(3);
    if (query) {
      heads = count;
      dh = width;
    } else if (width != dh || (kvHeads && count != kvHeads)) {
      return false;
    }
    if (!query)
      kvHeads = count;
    if (slice->attrs().getInt("start") != start || slice->attrs().getInt("size") != count * dh)
      return false;
    start += count * dh;
    qkv = slice->operand(0);
    return true;
  }
};

class FuseAttention : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *merge) const override {
    // merge = reshape(transpose(matmul(probs, v), 0213)) : [B, T, D]
    if (merge->kind() != OpKind::Reshape || merge->result()->type().rank() != 3)
      return std::nullopt;
    Walk w{graph, {merge}};
    auto producer = [&](Op *user, unsigned i, OpKind kind) { return w.producer(user, i, kind); };
    Op *unswap = producer(merge, 0, OpKind::Transpose);
    if (!unswap || unswap->attrs().getInts("perm") != kSwapHeads)
      return std::nullopt;
    // Under grouped-query attention each product is one per KV head: its [B, H, T, X] operand
    // reshaped to [B, KV, G T, X] before, its result back to [B, H, T, X] after (the builder's
    // graph); `grouped` says which form the two products take (both the same).
    std::optional<bool> grouped;
    auto product = [&](Op *user, unsigned i) -> Op * {
      Op *ungroup = definedBy(user->operand(i), OpKind::Reshape);
      bool isGrouped = ungroup != nullptr;
      if (grouped && *grouped != isGrouped)
        return nullptr;
      grouped = isGrouped;
      if (!isGrouped)
        return producer(user, i, OpKind::MatMul);
      ungroup = producer(user, i, OpKind::Reshape);
      return ungroup ? producer(ungroup, 0, OpKind::MatMul) : nullptr;
    };
    // Operand 0 of a product, through the reshape to [B, KV, G T, X] where grouped.
    auto groupedOperand = [&](Op *mm, OpKind kind) -> Op * {
      if (!*grouped)
        return producer(mm, 0, kind);
      Op *group = producer(mm, 0, OpKind::Reshape);
      return group ? producer(group, 0, kind) : nullptr;
    };
    Op *context = product(unswap, 0);
    if (!context || matmulLayout(context->attrs()).transposeA || matmulLayout(context->attrs()).transposeB)
      return std::nullopt;
    Op *softmax = groupedOperand(context, OpKind::Softmax);
    Op *mask = softmax ? producer(softmax, 0, OpKind::CausalMask) : nullptr;
    if (!mask || mask->attrs().has("fill"))
      return std::nullopt;
    Op *scale = producer(mask, 0, OpKind::Scale);
    Op *scores = scale ? product(scale, 0) : nullptr;
    if (!scores || !matmulLayout(scores->attrs()).transposeB || matmulLayout(scores->attrs()).transposeA)
      return std::nullopt;
    Op *groupedQ = *grouped ? producer(scores, 0, OpKind::Reshape) : scores;
    HeadSlices h;
    if (!groupedQ || !h.match(w, groupedQ, 0, true, true) || !h.match(w, scores, 1, false, true) ||
        !h.match(w, context, 1, false, false))
      return std::nullopt;
    Value *qkv = h.qkv;
    int64_t heads = h.heads, kvHeads = h.kvHeads;
    const int64_t D = merge->result()->type().dim(2);
    // Legality: qkv is [B, T, (H + 2 KV) Dh] with D = H Dh, the grouping reshapes are the
    // [B, KV, G T, X] ones, and rope's theta is one the op takes.
    const TensorType &packed = qkv->type(), &out = merge->result()->type();
    if (packed.rank() != 3 || packed.dim(2) != h.start || heads * h.dh != D || heads % kvHeads ||
        packed.dim(0) != out.dim(0) || packed.dim(1) != out.dim(1) || (h.rope && !(h.rope->theta > 1.0)))
      return std::nullopt;
    if (*grouped != (kvHeads != heads))
      return std::nullopt;
    if (*grouped) {
      int64_t T = packed.dim(1);
      const TensorType &q = scores->operand(0)->type(), &p = context->operand(0)->type();
      if (q.rank() != 4 || q.dim(1) != kvHeads || q.dim(2) != heads / kvHeads * T || p.rank() != 4 ||
          p.dim(1) != kvHeads || p.dim(2) != heads / kvHeads * T)
        return std::nullopt;
    }

    FusionMatch m;
    m.pattern.assign(w.ops.rbegin(), w.ops.rend());
    m.replacement.kind = OpKind::Attention;
    m.replacement.operands = {qkv};
    m.replacement.attrs.set("heads", heads);
    if (kvHeads != heads)
      m.replacement.attrs.set("kv_heads", kvHeads);
    if (h.rope) {
      m.replacement.attrs.set("rope_theta", h.rope->theta);
      setRopeScaling(m.replacement.attrs, h.rope->scaling);
    }
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
