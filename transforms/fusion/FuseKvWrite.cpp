// fuse-kv-write: a decode step's kv_write and the decode_attention that reads the caches it
// wrote become one decode_attention {write_cache=true}: the attention takes this step's key and
// value from qkv and writes them into the caches itself, one launch a layer less, and returns
// the caches kv_write returned (the same values, so its other readers and assigns read those).
#include "ir/Attributes.h"
#include "ir/Rope.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseKvWrite : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &, Op *attention) const override {
    // (Under grouped-query attention G query heads share a cache row: the GPU has one block of
    // the G write it, each putting the row it computes into its own tiles, decode.cuh.)
    if (attention->kind() != OpKind::DecodeAttention || writesCache(attention->attrs()))
      return std::nullopt;
    Op *write = definedBy(attention->operand(1), OpKind::KvWrite);
    // Legality: both caches are this write's results, written from the attention's own qkv at
    // its positions (a decode step's write: one row a sequence), rounded as the attention
    // reads them. Several queries a sequence (a draft's tokens checked) keep kv_write: each
    // query reads the rows the others write.
    if (!write || write->numOperands() != 4 || attention->operand(1) != write->result(0) ||
        attention->operand(2) != write->result(1) || write->operand(2) != attention->operand(0) ||
        write->operand(3) != attention->operand(3) || attention->operand(0)->type().dim(1) != 1 ||
        !sameGemmPrecision(write->attrs(), attention->attrs()))
      return std::nullopt;
    // Under fuse-cache-rope both rotate, by the same table (the attention then rotates the key
    // it writes), or neither does.
    auto rope = [](const Op *op) {
      RopeOptions o = ropeOptions(op->attrs(), "rope_theta");
      return std::make_tuple(op->attrs().has("rope_theta"), o.theta, o.scaling);
    };
    if (rope(write) != rope(attention))
      return std::nullopt;
    FusionMatch m;
    m.pattern = {write, attention};
    Replacement &r = m.replacement;
    r.kind = OpKind::DecodeAttention;
    r.attrs = attention->attrs();
    r.attrs.set(kWriteCache, true);
    r.operands = {attention->operand(0), write->operand(0), write->operand(1), attention->operand(3)};
    r.replaces = {attention->result(), write->result(0), write->result(1)};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseKvWritePass() { return std::make_unique<FuseKvWrite>(); }

} // namespace tgc
