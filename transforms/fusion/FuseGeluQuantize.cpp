// fuse-gelu-quantize: an FP8 layer's input that is a GELU, quantized by the GELU's reader.
// quantize(gelu(h), scale, scale_inv), the GELU read by the quantize alone, becomes
// quantize(h, scale, scale_inv) {activation="gelu"}: the quantize applies the GELU as it reads
// h, and the GELU's fp32 values (fc2's input: four bytes an element, written and read back)
// are never stored. Transformer Engine's GELU writes fc2's FP8 operand the same way. The same
// bits on the CPU interpreter (the same GELU, then the same rounding).
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseGeluQuantize : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *quantize) const override {
    if (quantize->kind() != OpKind::Quantize || quantize->attrs().has("activation"))
      return std::nullopt;
    Op *gelu = definedBy(quantize->operand(0), OpKind::Gelu);
    if (!gelu || soleUser(graph, gelu->result()) != quantize)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {gelu, quantize};
    Replacement &r = m.replacement;
    r.kind = OpKind::Quantize;
    r.attrs = quantize->attrs();
    r.attrs.set("activation", std::string("gelu"));
    r.operands = {gelu->operand(0), quantize->operand(1), quantize->operand(2)};
    for (unsigned i = 0; i < quantize->numResults(); ++i)
      r.replaces.push_back(quantize->result(i));
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseGeluQuantizePass() { return std::make_unique<FuseGeluQuantize>(); }

} // namespace tgc
