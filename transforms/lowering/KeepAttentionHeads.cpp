// keep-attention-heads: the GPU's tensor-core attention reads q, k and v head-major in BF16,
// which its forward and its gradient each made from the packed qkv (a pass over it in fp32 each).
// Here the forward returns its head-major copy as a third result and the gradient reads that in
// qkv's place: one conversion a layer less, and the fp32 qkv need not live until the backward
// (the copy, stored in BF16, is half its size). The values are the same: the copy holds what the
// gradient would have made (under RoPE, q and k rotated, as the gradient's conversion rotates
// them).
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

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
      // qkv's rows hold H query heads and 2 KV key and value heads (grouped-query attention).
      AttentionHeads h = attentionHeads(back->attrs());
      if (forward->kind() != OpKind::Attention || forward->numResults() != 2 || forward->operand(0) != qkv ||
          back->operand(3) != forward->result(1) || h.heads <= 0 || h.kvHeads <= 0 ||
          !attentionOnTensorCores(back->attrs(), qkv->type().dim(-1) / (h.heads + 2 * h.kvHeads)))
        continue;
      // Each op is replaced in its place (the forward's results keep their names, the copy is
      // out.heads), so the order holds without a sort.
      Replacement withCopy{OpKind::Attention, {qkv}, forward->attrs(), {forward->result(0), forward->result(1)},
                           {forward->result(0)->name() + ".heads"}};
      withCopy.attrs.set(kHeadMajor, true);
      if (auto err = applyReplacement(graph, {forward}, std::move(withCopy), nullptr, /*sort=*/false))
        return std::move(err);
      Op *kept = back->operand(2)->def(); // the new forward: out is its result now
      Replacement readsCopy{OpKind::AttentionBackward,
                            {back->operand(0), kept->result(2), back->operand(2), back->operand(3)},
                            back->attrs(),
                            {back->result()},
                            {}};
      readsCopy.attrs.set(kHeadMajor, true);
      if (auto err = applyReplacement(graph, {back}, std::move(readsCopy), nullptr, /*sort=*/false))
        return std::move(err);
      changed = true;
    }
    return changed;
  }
};

} // namespace

std::unique_ptr<Pass> createKeepAttentionHeadsPass() { return std::make_unique<KeepAttentionHeads>(); }

} // namespace tgc
