// keep-attention-heads: the GPU's tensor-core attention reads q, k and v head-major in BF16,
// which its forward and its gradient each made from the packed qkv (a pass over it in fp32 each).
// Here the forward returns its head-major copy as a third result and the gradient reads that in
// qkv's place: one conversion a layer less, and the fp32 qkv need not live until the backward
// (the copy, stored in BF16, is half its size). The values are the same: the copy holds what the
// gradient would have made.
#include "ir/Attributes.h"
#include "ir/Infer.h"
#include "transforms/Passes.h"

namespace tgc {
namespace {

/// A copy of `old` with `attrs`, `operands` and the result types inferred, in its place; its
/// results take over the old results' uses and names.
llvm::Expected<Op *> replaceOp(Graph &graph, Op *old, llvm::ArrayRef<Value *> operands, AttrMap attrs) {
  auto types = inferResultTypes(old->kind(), operands, attrs);
  if (!types)
    return types.takeError();
  std::vector<std::string> names, temporary;
  for (unsigned i = 0; i < types->size(); ++i) {
    names.push_back(i < old->numResults() ? old->result(i)->name() : old->result()->name() + ".heads");
    temporary.push_back(graph.uniqueName(names.back() + ".new"));
  }
  Op *op = graph.createOp(old->kind(), operands, std::move(attrs), *types, temporary, old);
  for (unsigned i = 0; i < old->numResults(); ++i)
    graph.replaceAllUsesWith(old->result(i), op->result(i));
  graph.eraseOp(old);
  for (unsigned i = 0; i < op->numResults(); ++i)
    graph.rename(op->result(i), graph.lookup(names[i]) ? graph.uniqueName(names[i]) : names[i]);
  return op;
}

class KeepAttentionHeads : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    bool changed = false;
    for (Op *back : graph.ops()) {
      if (back->kind() != OpKind::AttentionBackward || isHeadMajor(back->attrs()))
        continue;
      Value *qkv = back->operand(1);
      Op *forward = back->operand(2)->def();
      // Legality: the gradient of this forward (its out and lse, the same qkv), which the GPU
      // runs on tensor cores (the kernels that read head-major operands).
      int64_t heads = back->attrs().getInt("heads").value_or(0);
      if (forward->kind() != OpKind::Attention || forward->numResults() != 2 || forward->operand(0) != qkv ||
          back->operand(3) != forward->result(1) || heads <= 0 ||
          !attentionOnTensorCores(back->attrs(), qkv->type().dim(-1) / 3 / heads))
        continue;
      AttrMap attrs = forward->attrs();
      attrs.set(kHeadMajor, true);
      auto newForward = replaceOp(graph, forward, {qkv}, attrs);
      if (!newForward)
        return newForward.takeError();
      AttrMap backAttrs = back->attrs();
      backAttrs.set(kHeadMajor, true);
      auto newBack = replaceOp(graph, back,
                               {back->operand(0), (*newForward)->result(2), back->operand(2), back->operand(3)},
                               backAttrs);
      if (!newBack)
        return newBack.takeError();
      changed = true;
    }
    return changed;
  }
};

} // namespace

std::unique_ptr<Pass> createKeepAttentionHeadsPass() { return std::make_unique<KeepAttentionHeads>(); }

} // namespace tgc
