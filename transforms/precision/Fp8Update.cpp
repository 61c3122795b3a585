// fp8-update: after autodiff, one fp8_update per quantized tensor: its amax goes into the
// history, the history rolls and the scale follows (fp8.md), all assigned to the tensor's
// scaling state when the step ends. Only training programs run it: evaluation and generation
// do not move the scales, as in TE. FP8 attention's probabilities and dS (quantized inside
// cuDNN's attention) update their states from the amaxes the attention ops return. Under block scaling the scales are each block's own: the
// update's history and scale go unread, and the state keeps the statistics to show (the
// largest block scale of the last step, the values flushed to zero in `saturations`).
#include "ir/Attributes.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/precision/Precision.h"

#include <fmt/format.h>

namespace tgc {
namespace {

class Fp8Update : public Pass {
public:
  explicit Fp8Update(PrecisionConfig config) : config_(std::move(config)) {}
  llvm::Expected<bool> run(Graph &graph) override {
    // Each producer of an amax: a quantize (its state read through operand 1, the amax and the
    // saturation count its results 1 and 2), and FP8 attention's probabilities and dS, which
    // cuDNN quantizes inside without counting (their count a zero).
    struct Producer {
      Op *op;
      unsigned scaleOperand, amaxResult;
      int countResult; // -1: none
      Fp8Format format;
    };
    std::vector<Producer> producers;
    for (Op *op : graph.ops()) {
      if (op->kind() == OpKind::Fp8Update)
        return stringError("fp8-update already ran on this graph");
      if (op->kind() == OpKind::Quantize)
        producers.push_back({op, 1, 1, 2, fp8FormatOf(op->attrs())});
      if (op->kind() == OpKind::Fp8Attention)
        producers.push_back({op, 2, 2, -1, Fp8Format::E4M3});
      if (op->kind() == OpKind::Fp8AttentionBackward)
        producers.push_back({op, 8, 1, -1,
                             op->operand(0)->type().dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3});
    }
    Builder b(graph);
    Value *noCount = nullptr;
    for (const Producer &p : producers) {
      Op *q = p.op;
      Value *scale = q->operand(p.scaleOperand), *scaleInv = q->operand(p.scaleOperand + 1);
      auto prefixOr = scalingStatePrefix(*q, "fp8-update", p.scaleOperand);
      if (!prefixOr)
        return prefixOr.takeError();
      const std::string &prefix = *prefixOr;
      Value *history = graph.lookup(prefix + ".amax_history");
      Value *saturations = graph.lookup(prefix + ".saturations");
      if (!history || !saturations)
        return stringError(fmt::format("no amax history or saturation count for {}", prefix));
      if (p.countResult < 0 && !noCount) { // first in the program, before anything that may read it
        AttrMap zero;
        zero.set("value", 0.0);
        noCount = graph.createOp(OpKind::Constant, {}, std::move(zero), {TensorType(DType::F32, {})},
                                 {graph.uniqueName("fp8.no_saturations")}, graph.ops().front())
                      ->result(0);
      }
      Value *count = p.countResult < 0 ? noCount : q->result(unsigned(p.countResult));
      AttrMap attrs;
      setFp8Format(attrs, p.format);
      setFp8Margin(attrs, config_.margin);
      attrs.set("algo", config_.amaxComputeAlgo);
      // Block scaling's largest block scale, kept to be shown: its state is placed before the
      // update that writes it in place (the executor places leaves in program order).
      Value *largest = q->kind() == OpKind::Quantize && q->result(1)->type().rank() == 1
                           ? b.state(prefix + ".block_scale_max", TensorType(DType::F32, {}),
                                     tgc::attrs({{"init", std::string("zeros")}}))
                           : nullptr;
      Op *update = b.createOp(OpKind::Fp8Update, {history, scale, q->result(p.amaxResult), saturations, count},
                              attrs, prefix + ".update");
      if (!update)
        break;
      b.create(OpKind::Assign, {history, update->result(0)}, {}, "");
      b.create(OpKind::Assign, {scale, update->result(1)}, {}, "");
      b.create(OpKind::Assign, {scaleInv, update->result(2)}, {}, "");
      b.create(OpKind::Assign, {saturations, update->result(3)}, {}, "");
      if (largest)
        b.create(OpKind::Assign, {largest, update->result(4)}, {}, "");
    }
    if (auto err = b.takeError())
      return std::move(err);
    return !producers.empty();
  }

private:
  PrecisionConfig config_;
};

} // namespace

std::unique_ptr<Pass> createFp8UpdatePass(const PrecisionConfig &config) {
  return std::make_unique<Fp8Update>(config);
}

} // namespace tgc
