// fp8-update: after autodiff, one fp8_update per quantized tensor: its amax goes into the
// history, the history rolls and the scale follows (fp8.md), all assigned to the tensor's
// scaling state when the step ends. Only training programs run it: evaluation and generation
// do not move the scales, as in TE. Under block scaling the scales are each block's own: the
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
    std::vector<Op *> quantizes;
    for (Op *op : graph.ops()) {
      if (op->kind() == OpKind::Fp8Update)
        return stringError("fp8-update already ran on this graph");
      if (op->kind() == OpKind::Quantize)
        quantizes.push_back(op);
    }
    Builder b(graph);
    for (Op *q : quantizes) {
      Value *scale = q->operand(1), *scaleInv = q->operand(2);
      auto prefixOr = scalingStatePrefix(*q, "fp8-update");
      if (!prefixOr)
        return prefixOr.takeError();
      const std::string &prefix = *prefixOr;
      Value *history = graph.lookup(prefix + ".amax_history");
      Value *saturations = graph.lookup(prefix + ".saturations");
      if (!history || !saturations)
        return stringError(fmt::format("no amax history or saturation count for {}", prefix));
      AttrMap attrs;
      setFp8Format(attrs, fp8FormatOf(q->attrs()));
      setFp8Margin(attrs, config_.margin);
      attrs.set("algo", config_.amaxComputeAlgo);
      // Block scaling's largest block scale, kept to be shown: its state is placed before the
      // update that writes it in place (the executor places leaves in program order).
      Value *largest = q->result(1)->type().rank() == 1
                           ? b.state(prefix + ".block_scale_max", TensorType(DType::F32, {}),
                                     tgc::attrs({{"init", std::string("zeros")}}))
                           : nullptr;
      Op *update = b.createOp(OpKind::Fp8Update,
                              {history, scale, q->result(1), saturations, q->result(2)}, attrs,
                              prefix + ".update");
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
    return !quantizes.empty();
  }

private:
  PrecisionConfig config_;
};

} // namespace

std::unique_ptr<Pass> createFp8UpdatePass(const PrecisionConfig &config) {
  return std::make_unique<Fp8Update>(config);
}

} // namespace tgc
