// fuse-gelu-quantize: an FP8 operand that is a GELU, or the gradient of one, quantized by its
// reader.
// - quantize(gelu(h), scale, scale_inv), the GELU read by the quantize alone, becomes
//   quantize(h, scale, scale_inv) {activation="gelu"}: the quantize applies the GELU as it reads
//   h, and the GELU's fp32 values (fc2's input: four bytes an element, written and read back)
//   are never stored. Transformer Engine's GELU writes fc2's FP8 operand the same way.
// - quantize(gelu_backward(dy, h) {bias_grad}, scale, scale_inv) {transpose=true}, the gradient
//   read by the quantize alone, becomes quantize(dy, scale, scale_inv, h)
//   {activation="gelu_backward", bias_grad}: fc1's output gradient (the largest gradient of a
//   layer) is made, summed into fc1's bias gradient and cast to FP8 and its transpose in one pass,
//   and never stored in fp32 (TE's dgelu + cast-transpose + dbias). The GPU's kernel for it is a
//   cast-transpose: the fusion asks for transpose=true, which legalize-fp8-gemm has set where the
//   sides allow it.
// - The same for SwiGLU (fuse-swiglu's, an FP8 MLP's): quantize(swiglu(h)) becomes quantize(h)
//   {activation="swiglu"} (h [..., 2F] read once, fc2's FP8 input [..., F] written), and
//   quantize(swiglu_backward(dy, h)) {transpose=true} becomes quantize(dy, scale, scale_inv, h)
//   {activation="swiglu_backward"}: fc1's output gradient [..., 2F] and its transpose in FP8,
//   never in fp32.
// Under block scaling the same.
// The same bits on the CPU interpreter (the same activation or gradient, then the same rounding).
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseGeluQuantize : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *quantize) const override {
    if (quantize->kind() != OpKind::Quantize || quantizeOptions(quantize->attrs()).activation != QuantizeActivation::None)
      return std::nullopt;
    // The op the quantize reads and the activation that applies it as it reads.
    static constexpr std::pair<OpKind, QuantizeActivation> kProducers[] = {
        {OpKind::Gelu, QuantizeActivation::Gelu},
        {OpKind::GeluBackward, QuantizeActivation::GeluBackward},
        {OpKind::Swiglu, QuantizeActivation::Swiglu},
        {OpKind::SwigluBackward, QuantizeActivation::SwigluBackward}};
    Op *producer = quantize->operand(0)->def();
    auto it = llvm::find_if(kProducers, [&](const auto &p) { return producer && producer->kind() == p.first; });
    if (it == std::end(kProducers) || soleUser(graph, producer->result()) != quantize)
      return std::nullopt;
    bool gradient = readsHidden(it->second); // the gradients read h too, in a cast-transpose
    QuantizeOptions options = quantizeOptions(quantize->attrs());
    if (gradient && !options.transpose)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {producer, quantize};
    Replacement &r = m.replacement;
    r.kind = OpKind::Quantize;
    r.attrs = quantize->attrs();
    setQuantizeActivation(r.attrs, it->second);
    r.operands = {producer->operand(0), quantize->operand(1), quantize->operand(2)};
    for (unsigned i = 0; i < quantize->numResults(); ++i)
      r.replaces.push_back(quantize->result(i));
    if (gradient) {
      r.operands.push_back(producer->operand(1));
      if (producer->numResults() > 1) { // its bias_grad
        setBiasGrad(r.attrs);
        r.replaces.push_back(producer->result(1));
      }
    }
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseGeluQuantizePass() { return std::make_unique<FuseGeluQuantize>(); }

} // namespace tgc
