#include "transforms/precision/ShardedFp8Weights.h"

#include "llvm/ADT/DenseSet.h"

namespace tgc {

namespace {

/// The op defining `v`, where it is of `kind`. Else null.
Op *defOf(const Value *v, OpKind kind) { return v && v->def() && v->def()->kind() == kind ? v->def() : nullptr; }

/// The all_gather whose result `weight`'s assigned value is a view of (reshape of a prefix slice).
Op *fp32Gather(const Value *weight, unsigned &index) {
  Op *reshape = defOf(assignedValue(weight), OpKind::Reshape);
  Op *slice = reshape ? defOf(reshape->operand(0), OpKind::Slice) : nullptr;
  Op *gather = slice ? defOf(slice->operand(0), OpKind::AllGather) : nullptr;
  if (gather)
    index = slice->operand(0)->index();
  return gather;
}

/// Removes `gather`'s operands whose results nothing reads: the op is made again without them
/// (or erased, where none is left).
void dropUnread(Graph &graph, Op *gather) {
  llvm::SmallVector<Value *, 8> operands;
  llvm::SmallVector<Value *, 8> kept;
  for (unsigned r = 0; r < gather->numResults(); ++r)
    if (gather->result(r)->hasUses()) {
      operands.push_back(gather->operand(r));
      kept.push_back(gather->result(r));
    }
  if (kept.size() == gather->numResults())
    return;
  if (!kept.empty()) {
    std::vector<TensorType> types;
    std::vector<std::string> names;
    for (Value *v : kept) {
      types.push_back(v->type());
      names.push_back(v->name());
      graph.rename(v, graph.uniqueName(v->name() + ".fp32"));
    }
    Op *again = graph.createOp(OpKind::AllGather, operands, gather->attrs(), types, names, gather);
    for (unsigned r = 0; r < kept.size(); ++r)
      graph.replaceAllUsesWith(kept[r], again->result(r));
  }
  graph.eraseOp(gather);
}

} // namespace

Value *updatedShard(const Value *weight, const Op &quantize) {
  if (quantize.attrs().has("scaling"))
    return nullptr; // current or block scaling: scales of the whole tensor's values
  unsigned index = 0;
  Op *gather = fp32Gather(weight, index);
  Op *adamw = gather ? defOf(gather->operand(index), OpKind::AdamW) : nullptr;
  Op *shard = adamw ? defOf(adamw->operand(0), OpKind::Shard) : nullptr;
  if (!shard || shard->operand(0) != weight || gather->operand(index) != adamw->result(0))
    return nullptr;
  for (const Op *user : weight->users())
    if (user != &quantize && user != shard && !(user->kind() == OpKind::Assign && user->operand(0) == weight))
      return nullptr; // read elsewhere: the whole fp32 weight stays
  return adamw->result(0);
}

llvm::Error gatherInFp8(Graph &graph, const std::vector<ShardedFp8Weight> &weights) {
  if (weights.empty())
    return llvm::Error::success();
  unsigned unused = 0;
  Op *firstGather = fp32Gather(weights.front().weight, unused);
  const int64_t ranks = *firstGather->attrs().getInt("ranks");
  Builder b(graph);
  std::vector<Value *> codes, amaxes, counts;
  for (const ShardedFp8Weight &w : weights) {
    codes.push_back(w.next->result(0));
    amaxes.push_back(w.next->result(1));
    counts.push_back(w.next->result(2));
  }
  // One call each: the codes gathered, the amaxes' maximum, the counts' sum.
  auto named = [&](Op *op, const std::vector<Value *> &from, const char *suffix) {
    for (unsigned r = 0; op && r < op->numResults(); ++r)
      graph.rename(op->result(r), graph.uniqueName(from[r]->name() + suffix));
    return op;
  };
  Op *gathered = named(b.createOp(OpKind::AllGather, codes, attrs({{"ranks", ranks}}), "fp8.gathered"), codes,
                       ".gathered");
  Op *amax = named(b.createOp(OpKind::AllReduce, amaxes, attrs({{"reduce", std::string("max")}}), "fp8.amax"),
                   amaxes, ".all");
  Op *count = named(b.createOp(OpKind::AllReduce, counts, attrs({{"reduce", std::string("sum")}}), "fp8.count"),
                    counts, ".all");
  if (!gathered || !amax || !count)
    return b.takeError();
  llvm::DenseSet<Op *> fp32Gathers;
  for (size_t i = 0; i < weights.size(); ++i) {
    const ShardedFp8Weight &w = weights[i];
    const TensorType whole = w.states[0]->type();
    Value *flat = b.create(OpKind::Slice, {gathered->result(unsigned(i))},
                           attrs({{"axis", int64_t(0)}, {"start", int64_t(0)}, {"size", whole.numElements()}}),
                           w.weight->name() + ".q_flat");
    std::vector<int64_t> shape(whole.shape.begin(), whole.shape.end());
    Value *q = b.create(OpKind::Reshape, {flat}, attrs({{"shape", shape}}), w.weight->name() + ".q_whole");
    b.create(OpKind::Assign, {w.states[0], q}, {}, "");
    b.create(OpKind::Assign, {w.states[1], amax->result(unsigned(i))}, {}, "");
    b.create(OpKind::Assign, {w.states[2], count->result(unsigned(i))}, {}, "");
    if (w.states.size() > 3) // the transpose the backward reads: the same codes transposed
      b.create(OpKind::Assign,
               {w.states[3], b.create(OpKind::Transpose, {q}, attrs({{"perm", std::vector<int64_t>{1, 0}}}),
                                      w.weight->name() + ".q_whole_t")},
               {}, "");
    // The weight: its shard, which AdamW reads and updates as it is, no longer rebuilt by the
    // fp32 gather.
    unsigned index = 0;
    Op *gather = fp32Gather(w.weight, index);
    Value *updated = gather->operand(index);
    Op *shard = updated->def()->operand(0)->def();
    Op *assign = nullptr;
    for (Op *user : w.weight->users())
      if (user->kind() == OpKind::Assign)
        assign = user;
    Op *reshape = assign->operand(1)->def(), *slice = reshape->operand(0)->def();
    graph.eraseOp(assign);
    graph.eraseOp(reshape);
    graph.eraseOp(slice);
    fp32Gathers.insert(gather);
    Op *param = w.weight->def();
    param->attrs().set("whole", shape);
    param->attrs().set("rank", *shard->attrs().getInt("rank"));
    param->attrs().set("ranks", ranks);
    w.weight->setType(shard->result()->type());
    graph.replaceAllUsesWith(shard->result(), w.weight);
    graph.eraseOp(shard);
    b.create(OpKind::Assign, {w.weight, updated}, {}, "");
  }
  for (Op *gather : fp32Gathers)
    dropUnread(graph, gather);
  return b.takeError();
}

} // namespace tgc
