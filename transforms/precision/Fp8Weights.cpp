// fp8-weights: FP8-only weights between steps (Transformer Engine's quantized_model_init). A
// training step quantizes each FP8 layer's weight in its forward, from the fp32 master weight;
// with precision.fp8_weights this pass moves that quantize after AdamW: it quantizes the
// updated weight with the scale the step's fp8_update made (the scale the next forward would
// take), and its results (q, and q_t where a cast-transpose made one; amax; the count) are
// assigned to state. The forward, the backward and the scale update read that state instead:
// the weight exists in FP8 from one step to the next, the optimizer keeps the master.
//
// The same bytes as without it: the next step's forward would have quantized the same weight
// with the same scale. The state is not drawn or checkpointed (init="prologue"): the executor's
// runPrologue makes it from the master weights and the scaling state, after initialisation and
// after a resume, by the moved quantize itself (Executor::runPrologue), so a resumed run
// continues bit for bit.
#include "ir/Attributes.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/precision/Precision.h"

#include <fmt/format.h>

namespace tgc {
namespace {

/// The fp8_update of the scaling state whose scale is `scale`.
Op *scaleUpdate(Value *scale) {
  for (Op *user : scale->users())
    if (user->kind() == OpKind::Fp8Update && user->operand(1) == scale)
      return user;
  return nullptr;
}

class Fp8Weights : public Pass {
public:
  explicit Fp8Weights(bool enabled) : enabled_(enabled) {}
  llvm::Expected<bool> run(Graph &graph) override {
    if (!enabled_)
      return false;
    std::vector<Op *> moved;
    for (Op *op : graph.ops()) {
      if (op->kind() != OpKind::Quantize || !op->operand(0)->def() ||
          op->operand(0)->def()->kind() != OpKind::Param)
        continue;
      QuantizeOptions options = quantizeOptions(op->attrs());
      if (options.activation != QuantizeActivation::None || options.biasGrad)
        continue;
      if (!assignedValue(op->operand(0)) || !scaleUpdate(op->operand(1)))
        continue; // a frozen weight, or no scale update: nothing happens between steps
      moved.push_back(op);
    }
    Builder b(graph);
    for (Op *quantize : moved) {
      Value *weight = quantize->operand(0);
      auto prefixOr = scalingStatePrefix(*quantize, "fp8-weights");
      if (!prefixOr)
        return prefixOr.takeError();
      const std::string &prefix = *prefixOr;
      Op *update = scaleUpdate(quantize->operand(1));
      // The state the forward reads: q, q_t, the amax and count the update folds in.
      static const char *kSuffixes[] = {".data", ".amax", ".count", ".data_t"};
      llvm::SmallVector<Value *, 4> states;
      for (unsigned r = 0; r < quantize->numResults(); ++r) { // where the quantize was
        std::string name = prefix + kSuffixes[r];
        if (graph.lookup(name))
          return stringError(fmt::format("fp8-weights: the graph already has a value %{}", name));
        states.push_back(graph.createOp(OpKind::State, {}, attrs({{"init", std::string("prologue")}}),
                                        {quantize->result(r)->type()}, {name}, quantize)
                             ->result());
      }
      // After the update, the next step's bytes: the new weight at the new scale.
      Op *next = b.createOp(OpKind::Quantize, {assignedValue(weight), update->result(1), update->result(2)},
                            quantize->attrs(), prefix + ".next");
      if (!next)
        break;
      for (unsigned r = 0; r < quantize->numResults(); ++r) {
        graph.replaceAllUsesWith(quantize->result(r), states[r]);
        b.create(OpKind::Assign, {states[r], next->result(r)}, {}, "");
      }
      graph.eraseOp(quantize);
    }
    if (auto err = b.takeError())
      return std::move(err);
    return !moved.empty();
  }

private:
  bool enabled_;
};

} // namespace

std::unique_ptr<Pass> createFp8WeightsPass(const PrecisionConfig &precision) {
  return std::make_unique<Fp8Weights>(precision.recipe == Recipe::Fp8 && precision.fp8Weights &&
                                      !precision.forwardOnly);
}

} // namespace tgc
