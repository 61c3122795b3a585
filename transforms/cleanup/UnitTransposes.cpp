// unit-transposes: a transpose that moves only dimensions of size 1 leaves every element where
// it was (the other dimensions keep their order), so it becomes a reshape, which moves no data
// (the GPU runs none). A decode step's per-head transposes of q and k around RoPE ([B, 1, H, Dh]
// <-> [B, H, 1, Dh], one position a sequence) are such transposes: four launches a layer fewer.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class UnitTransposes : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &, Op *transpose) const override {
    if (transpose->kind() != OpKind::Transpose)
      return std::nullopt;
    auto perm = transpose->attrs().getInts("perm");
    const TensorType &x = transpose->operand(0)->type();
    if (!perm || perm->size() != x.rank())
      return std::nullopt;
    // The dimensions longer than 1, in their order after the transpose, must be in their order
    // before it.
    int64_t last = -1;
    for (int64_t d : *perm) {
      if (x.dim(size_t(d)) == 1)
        continue;
      if (d < last)
        return std::nullopt;
      last = d;
    }
    FusionMatch m;
    m.pattern = {transpose};
    Replacement &r = m.replacement;
    r.kind = OpKind::Reshape;
    r.operands = {transpose->operand(0)};
    const TensorType &y = transpose->result()->type();
    r.attrs.set("shape", std::vector<int64_t>(y.shape.begin(), y.shape.end()));
    r.replaces = {transpose->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createUnitTransposesPass() { return std::make_unique<UnitTransposes>(); }

} // namespace tgc
