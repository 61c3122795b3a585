// fuse-swiglu: the builder's SwiGLU, mul(silu(slice(h, gate)), slice(h, up)), becomes
// swiglu(h), where fuse-layernorm-mlp left it (an FP8 MLP, whose quantizes stand between its
// norm and GEMMs): one read of h, no copies of its halves, and autodiff's gradient of it is one
// swiglu_backward instead of two muls, a silu_backward and the concat of the halves. The same
// arithmetic in the same order (ir/Ops.def): the same bits.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseSwiglu : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *mul) const override {
    auto swiglu = matchSwiglu(graph, mul);
    if (!swiglu)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {swiglu->gate, swiglu->up, swiglu->silu, swiglu->mul};
    m.replacement.kind = OpKind::Swiglu;
    m.replacement.operands = {swiglu->h};
    m.replacement.replaces = {mul->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseSwigluPass() { return std::make_unique<FuseSwiglu>(); }

} // namespace tgc
