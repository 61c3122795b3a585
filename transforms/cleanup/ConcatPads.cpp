// concat-pads: autodiff sums the gradients of slices of one tensor (attention's q, k and v taken
// out of the qkv projection) as add(add(pad(dv), pad(dk)), pad(dq)): each pad writes the whole
// tensor, mostly zeros, and each add reads two of them. Where the pads tile the axis, that sum
// is concat(dq, dk, dv): one pass that writes each element once. (A zero's sign is the only
// thing that can differ: pad's +0 plus a -0 is +0, which concat leaves as -0.)
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

#include <algorithm>

namespace tgc {
namespace {

class ConcatPads : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *root) const override {
    if (root->kind() != OpKind::Add || root->operand(0)->type() != root->operand(1)->type())
      return std::nullopt;
    // The leaves of the tree of adds under root, each read by its add only. The pattern lists
    // each op after the one reading it; reversed, each comes before its reader and root last,
    // which is the order applyReplacement inserts and erases by.
    FusionMatch m;
    llvm::SmallVector<Op *, 8> pads;
    llvm::SmallVector<Op *, 8> pending{root};
    while (!pending.empty()) {
      Op *add = pending.pop_back_val();
      m.pattern.push_back(add);
      for (Value *v : add->operands()) {
        if (soleUser(graph, v) != add || add->operand(0) == add->operand(1))
          return std::nullopt;
        if (Op *inner = definedBy(v, OpKind::Add); inner && v->type() == root->result()->type())
          pending.push_back(inner);
        else if (Op *pad = definedBy(v, OpKind::Pad)) {
          pads.push_back(pad);
          m.pattern.push_back(pad);
        }
        else
          return std::nullopt;
      }
    }
    // Legality: the pads place along one axis ranges that tile it, with nothing left zero.
    int64_t axis = *pads[0]->attrs().getInt("axis");
    std::sort(pads.begin(), pads.end(), [](Op *a, Op *b) {
      return *a->attrs().getInt("start") < *b->attrs().getInt("start");
    });
    int64_t covered = 0;
    for (Op *pad : pads) {
      if (*pad->attrs().getInt("axis") != axis || *pad->attrs().getInt("start") != covered)
        return std::nullopt;
      covered += pad->operand(0)->type().shape[axis];
      m.replacement.operands.push_back(pad->operand(0));
    }
    if (covered != root->result()->type().shape[axis])
      return std::nullopt;
    m.replacement.kind = OpKind::Concat;
    m.replacement.attrs.set("axis", axis);
    m.replacement.replaces = {root->result()};
    std::reverse(m.pattern.begin(), m.pattern.end());
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createConcatPadsPass() { return std::make_unique<ConcatPads>(); }

} // namespace tgc
