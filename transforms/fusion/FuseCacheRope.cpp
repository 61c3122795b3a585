// fuse-cache-rope: the rotation of a decode step's (or a prompt's) qkv before its caches moves
// into the ops that read it. The builder rotates q and k by rope ops (three slices, the heads
// split and transposed, two ropes, back and a concat: six launches a layer on the GPU) and the
// kv_write and decode_attention read the concat; after this pass they read the projection's qkv
// itself with rope_theta (and rope's scaling) and rotate what they take: kv_write its keys,
// decode_attention its query, each at its row's position, and a prompt's attention q and k
// from position 0. The same arithmetic, the same bits; the six launches are gone.
#include "ir/Attributes.h"
#include "ir/Rope.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

const std::vector<int64_t> kSwapHeads{0, 2, 1, 3};

/// The rotated qkv the builder made: concat(flat(rope(heads(slice q))), flat(rope(heads(slice
/// k))), slice v) along the last axis, from one qkv, q and k by ropes of the same options at the
/// same positions (or none), every intermediate read only inside it.
struct RotatedQkv {
  Value *qkv = nullptr, *positions = nullptr;
  RopeOptions rope;
  int64_t length = 0, kvHeads = 0;
  llvm::SmallVector<Op *, 16> ops;
};

/// One rotated part: reshape(transpose(rope(transpose(reshape(slice(qkv, start, size)))))).
bool matchRotated(const Graph &graph, Value *flat, int64_t start, bool first, RotatedQkv &r, int64_t &heads,
                  int64_t &dh) {
  auto sole = [&](Value *v, OpKind kind, Op *user) -> Op * {
    Op *def = definedBy(v, kind);
    return def && soleUser(graph, v) == user ? def : nullptr;
  };
  Op *merge = definedBy(flat, OpKind::Reshape);
  if (!merge)
    return false;
  Op *back = sole(merge->operand(0), OpKind::Transpose, merge);
  Op *rope = back ? sole(back->operand(0), OpKind::Rope, back) : nullptr;
  Op *swap = rope ? sole(rope->operand(0), OpKind::Transpose, rope) : nullptr;
  Op *split = swap ? sole(swap->operand(0), OpKind::Reshape, swap) : nullptr;
  Op *slice = split ? sole(split->operand(0), OpKind::Slice, split) : nullptr;
  if (!slice || back->attrs().getInts("perm") != kSwapHeads || swap->attrs().getInts("perm") != kSwapHeads ||
      slice->attrs().getInt("axis") != 2 || slice->attrs().getInt("start") != start ||
      split->result()->type().rank() != 4 || merge->result()->type().rank() != 3)
    return false;
  RopeOptions options = ropeOptions(rope->attrs());
  Value *positions = rope->numOperands() > 1 ? rope->operand(1) : nullptr;
  int64_t length = rope->attrs().getInt("length").value_or(0);
  if (options.inverse || !(options.theta > 1.0))
    return false;
  if (first) {
    r.qkv = slice->operand(0);
    r.rope = options;
    r.positions = positions;
    r.length = length;
  } else if (slice->operand(0) != r.qkv || options.theta != r.rope.theta || options.scaling != r.rope.scaling ||
             positions != r.positions || length != r.length) {
    return false;
  }
  const TensorType &parts = split->result()->type();
  if (slice->attrs().getInt("size") != parts.dim(2) * parts.dim(3) || (!first && parts.dim(3) != dh))
    return false;
  heads = parts.dim(2);
  dh = parts.dim(3);
  r.ops.append({slice, split, swap, rope, back, merge});
  return true;
}

std::optional<RotatedQkv> matchRotatedQkv(const Graph &graph, Value *value) {
  Op *concat = definedBy(value, OpKind::Concat);
  if (!concat || concat->numOperands() != 3 || concat->attrs().getInt("axis") != 2 || isGraphOutput(graph, value))
    return std::nullopt;
  for (unsigned i = 0; i < 3; ++i)
    if (soleUser(graph, concat->operand(i)) != concat)
      return std::nullopt;
  RotatedQkv r;
  int64_t heads = 0, kvHeads = 0, dh = 0;
  const TensorType &out = value->type();
  if (out.rank() != 3 || !matchRotated(graph, concat->operand(0), 0, true, r, heads, dh) ||
      !matchRotated(graph, concat->operand(1), heads * dh, false, r, kvHeads, dh))
    return std::nullopt;
  Op *v = definedBy(concat->operand(2), OpKind::Slice);
  if (!v || v->operand(0) != r.qkv || v->attrs().getInt("axis") != 2 ||
      v->attrs().getInt("start") != (heads + kvHeads) * dh || v->attrs().getInt("size") != kvHeads * dh ||
      r.qkv->type() != out || concat->operand(1)->type().dim(2) != kvHeads * dh)
    return std::nullopt;
  r.ops.push_back(v);
  r.ops.push_back(concat);
  r.kvHeads = kvHeads;
  return r;
}

/// Whether `reader` can take qkv unrotated with rope_theta: a kv_write (operand 2) or a
/// decode_attention (operand 0) at the ropes' positions, with a cache as long as their table
/// (or, for a prompt's from row 0, ropes without positions), or a prompt's attention.
bool rotatesItself(const Op &reader, const Value *rotated, const RotatedQkv &r) {
  // A prompt's attention (from position 0) rotates q and k itself under rope_theta, by the
  // table of its T positions: the same entries as the ropes' of S = T rows.
  if (reader.kind() == OpKind::Attention)
    return !r.positions && reader.operand(0) == rotated && !reader.attrs().has("rope_theta") &&
           attentionHeads(reader.attrs()).kvHeads == r.kvHeads;
  bool write = reader.kind() == OpKind::KvWrite, attend = reader.kind() == OpKind::DecodeAttention;
  if ((!write && !attend) || reader.attrs().has("rope_theta"))
    return false;
  unsigned qkvIndex = write ? 2 : 0;
  for (unsigned i = 0; i < reader.numOperands(); ++i)
    if ((reader.operand(i) == rotated) != (i == qkvIndex))
      return false;
  Value *positions = reader.numOperands() > 3 ? reader.operand(3) : nullptr;
  int64_t T = reader.operand(write ? 0 : 1)->type().dim(1);
  if (positions != r.positions)
    return false;
  return r.positions ? r.length == T : true;
}

class FuseCacheRope : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *reader) const override {
    if (reader->kind() != OpKind::KvWrite && reader->kind() != OpKind::DecodeAttention &&
        reader->kind() != OpKind::Attention)
      return std::nullopt;
    Value *rotated = reader->operand(reader->kind() == OpKind::KvWrite ? 2 : 0);
    std::optional<RotatedQkv> r = matchRotatedQkv(graph, rotated);
    if (!r)
      return std::nullopt;
    // Every reader of the rotated qkv must rotate itself (each is rewritten in turn; the ropes
    // go when the last is), so that no rope op is left computing what the readers recompute.
    for (Op *user : rotated->users())
      if (!rotatesItself(*user, rotated, *r))
        return std::nullopt;
    FusionMatch m;
    m.pattern.assign(r->ops.begin(), r->ops.end());
    m.pattern.push_back(reader);
    Replacement &rep = m.replacement;
    rep.kind = reader->kind();
    rep.attrs = reader->attrs();
    rep.attrs.set("rope_theta", r->rope.theta);
    setRopeScaling(rep.attrs, r->rope.scaling);
    if (reader->kind() == OpKind::KvWrite)
      rep.attrs.set("kv_heads", r->kvHeads);
    for (unsigned i = 0; i < reader->numOperands(); ++i)
      rep.operands.push_back(reader->operand(i) == rotated ? r->qkv : reader->operand(i));
    for (unsigned i = 0; i < reader->numResults(); ++i)
      rep.replaces.push_back(reader->result(i));
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseCacheRopePass() { return std::make_unique<FuseCacheRope>(); }

} // namespace tgc
