// fp8-weights: FP8-only weights between steps (Transformer Engine's quantized_model_init). A
// training step quantizes each FP8 layer's weight in its forward, from the fp32 master weight;
// with precision.fp8_weights this pass moves that quantize after AdamW: it quantizes the
// updated weight with the scale the step's fp8_update made (the scale the next forward would
// take), and its results (q, and q_t where a cast-transpose made one; amax; the count) are
// assigned to state. The forward, the backward and the scale update read that state instead:
// the weight exists in FP8 from one step to the next, the optimizer keeps the master.
//
// Under train.recompute (in the layers it names) a weight's transpose is not kept: the state holds q alone (the moved
// quantize writes no transpose), and the backward makes q_t before its first reader: under
// per-tensor scaling by transposing q's bytes (the same codes at the same scale), under block
// scaling by a quantize of the master weight at the state's scale, which are those that made q
// (the master and the scale change only at the step's end): the same bytes either way. That
// costs a transpose in the backward and saves the transposes' bytes between steps (as
// Transformer Engine keeps only the FP8 weight under quantized_model_init and transposes it
// where it needs to).
//
// The same bytes as without it: the next step's forward would have quantized the same weight
// with the same scale. The state is not drawn or checkpointed (init="prologue"): the executor's
// runPrologue makes it from the master weights and the scaling state, after initialisation and
// after a resume, by the moved quantize itself (Executor::runPrologue), so a resumed run
// continues bit for bit.
//
// Under ZeRO the updated shard is quantized and its codes gathered (ShardedFp8Weights.h).
#include "ir/Attributes.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"
#include "transforms/precision/Precision.h"
#include "transforms/precision/ShardedFp8Weights.h"

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
  Fp8Weights(bool enabled, const TrainConfig &train) : enabled_(enabled), train_(train) {}
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
    std::vector<ShardedFp8Weight> sharded;
    for (Op *quantize : moved) {
      Value *weight = quantize->operand(0);
      auto prefixOr = scalingStatePrefix(*quantize, "fp8-weights");
      if (!prefixOr)
        return prefixOr.takeError();
      const std::string &prefix = *prefixOr;
      Op *update = scaleUpdate(quantize->operand(1));
      // The state the forward reads: q, q_t, the amax and count the update folds in; under
      // recompute, q_t is made again before the backward's first reader instead.
      static const char *kSuffixes[] = {".data", ".amax", ".count", ".data_t"};
      unsigned kept = quantize->numResults();
      AttrMap nextAttrs = quantize->attrs();
      bool transposeInBackward = train_.recomputes(layerOf(prefix)) && kept == 4;
      if (transposeInBackward) {
        kept = 3;
        nextAttrs.erase(kTranspose);
      }
      llvm::SmallVector<Value *, 4> states;
      for (unsigned r = 0; r < kept; ++r) { // where the quantize was
        std::string name = prefix + kSuffixes[r];
        if (graph.lookup(name))
          return stringError(fmt::format("fp8-weights: the graph already has a value %{}", name));
        states.push_back(graph.createOp(OpKind::State, {}, attrs({{"init", std::string("prologue")}}),
                                        {quantize->result(r)->type()}, {name}, quantize)
                             ->result());
      }
      if (transposeInBackward)
        if (auto err = transposeInTheBackward(graph, quantize, states[0]))
          return std::move(err);
      // After the update, the next step's bytes: the new weight at the new scale (under ZeRO,
      // the rank's shard of it, whose codes are gathered: ShardedFp8Weights.h).
      Value *shard = updatedShard(weight, *quantize);
      if (shard)
        nextAttrs.erase(kTranspose);
      Op *next = b.createOp(OpKind::Quantize, {shard ? shard : assignedValue(weight), update->result(1), update->result(2)},
                            nextAttrs, prefix + ".next");
      if (!next)
        break;
      for (unsigned r = 0; r < kept; ++r) {
        graph.replaceAllUsesWith(quantize->result(r), states[r]);
        if (!shard)
          b.create(OpKind::Assign, {states[r], next->result(r)}, {}, "");
      }
      if (shard)
        sharded.push_back({weight, next, states});
      graph.eraseOp(quantize);
    }
    if (auto err = b.takeError())
      return std::move(err);
    if (auto err = gatherInFp8(graph, sharded))
      return std::move(err);
    return !moved.empty();
  }

private:
  /// Before the first reader of `quantize`'s q_t, what those readers read instead: under
  /// per-tensor scaling the bytes `data` (the state q) transposed, under block scaling a copy
  /// of the quantize (the master weight and the state's scale, unchanged until the step's end;
  /// block scales are laid out along each operand's reduction, so the transpose's are its own)
  /// whose q_t alone is read.
  static llvm::Error transposeInTheBackward(Graph &graph, Op *quantize, Value *data) {
    Value *transposed = quantize->result(3);
    if (transposed->users().empty())
      return llvm::Error::success();
    Op *first = nullptr;
    for (Op *op : graph.ops())
      if (llvm::is_contained(transposed->users(), op)) {
        first = op;
        break;
      }
    if (!quantizeOptions(quantize->attrs()).blockScaling) {
      AttrMap perm;
      perm.set("perm", std::vector<int64_t>{1, 0});
      Op *t = graph.createOp(OpKind::Transpose, {data}, std::move(perm), {transposed->type()},
                             {graph.uniqueName(data->name() + ".t")}, first);
      graph.replaceAllUsesWith(transposed, t->result());
      return llvm::Error::success();
    }
    graph.replaceAllUsesWith(transposed, copyOpBefore(graph, *quantize, first)->result(3));
    return llvm::Error::success();
  }

  bool enabled_;
  TrainConfig train_;
};

} // namespace

std::unique_ptr<Pass> createFp8WeightsPass(const PrecisionConfig &precision, const TrainConfig &train) {
  return std::make_unique<Fp8Weights>(precision.recipe == Recipe::Fp8 && precision.fp8Weights &&
                                      !precision.forwardOnly, train);
}

} // namespace tgc
