// adamw: the optimizer step as IR. Consumes the %p.grad outputs of autodiff and appends global
// gradient-norm clipping, the learning-rate schedule and one adamw op per parameter, whose new
// values are assigned back to the parameter and its two moments (state, fp32).
// Under ZeRO (shard: optimizer or gradients) each rank updates its shard of each parameter: the
// gradients are shards (ZeRO-2: data-parallel's reduce_scatter; ZeRO-1: this rank's part of each
// all-reduced gradient, a shard op here), the moments are state of the shard's size (1 / ranks
// of the memory), the norm's sum of squares is all-reduced, and one all_gather rebuilds the
// parameters from the updated shards.
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Passes.h"

#include <fmt/format.h>

namespace tgc {
namespace {

class AdamWPass : public Pass {
public:
  AdamWPass(TrainConfig config, DataParallelOptions dataParallel) : config_(config), dataParallel_(dataParallel) {}
  llvm::Expected<bool> run(Graph &graph) override {
    if (graph.lookup(program::kStep))
      return stringError("graph already has a %step: is the optimizer already there?");
    // Parameters with a gradient, in program order.
    std::vector<std::pair<Value *, Value *>> trained;
    for (Op *op : graph.ops())
      if (op->kind() == OpKind::Param)
        if (Value *g = graph.lookup(program::gradientOf(op->result()->name())))
          trained.emplace_back(op->result(), g);
    if (trained.empty())
      return stringError("no parameter has a gradient: run autodiff before adamw");
    // The gradients leave the outputs: the update consumes them.
    for (unsigned i = graph.outputs().size(); i-- > 0;)
      for (auto &[param, grad] : trained)
        if (graph.outputs()[i] == grad) {
          graph.removeOutput(i);
          break;
        }

    const bool sharded = dataParallel_.shardOptimizer && dataParallel_.ranks > 1;
    const int64_t ranks = sharded ? dataParallel_.ranks : 1;
    Builder b(graph);
    const AttrMap mine = attrs({{"ranks", ranks}, {"rank", int64_t(dataParallel_.rank)}}); // the rank's shards
    // ZeRO-2's gradients are this rank's shards (reduce_scatter); ZeRO-1's are whole (all_reduce),
    // and the update takes this rank's part of each, as of the parameter.
    for (auto &[param, grad] : trained) {
      const TensorType shard(DType::F32, {(param->type().numElements() + ranks - 1) / ranks});
      if (!sharded || grad->type() == shard)
        continue;
      if (grad->type() != param->type())
        return stringError(fmt::format("%{} is {}, neither %{}'s type nor a shard of it", grad->name(),
                                       grad->type().str(), param->name()));
      grad = b.create(OpKind::Shard, {grad}, mine, grad->name() + ".shard");
    }
    Value *step = b.input(program::kStep.str(), TensorType(DType::I32, {}));
    // Global norm over all gradients, summed in program order (deterministic); the last sum is
    // the program's output kGradNormSquared (sharded: the shards' sums, then over the ranks).
    const std::string total = sharded ? "grad_norm.local" : program::kGradNormSquared.str();
    Value *sumSquares = nullptr;
    for (size_t i = 0; i < trained.size(); ++i) {
      Value *grad = trained[i].second;
      bool last = i + 1 == trained.size();
      std::string name = last && i == 0 ? total : grad->name() + ".sumsq";
      Value *s = b.create(OpKind::SumSquares, {grad}, {}, name);
      if (sumSquares)
        s = b.create(OpKind::Add, {sumSquares, s}, {}, last ? total : "grad_norm.partial");
      sumSquares = s;
    }
    if (sharded)
      sumSquares = b.create(OpKind::AllReduce, {sumSquares}, attrs({{"reduce", std::string("sum")}}),
                            program::kGradNormSquared.str());
    Value *clip = b.create(OpKind::ClipScale, {sumSquares}, attrs({{"max_norm", config_.gradClip}}),
                           "grad_clip");
    Value *lr = b.create(OpKind::LRSchedule, {step},
                         attrs({{"lr", config_.lr},
                                {"min_lr", config_.lr * config_.minLrRatio},
                                {"warmup", config_.warmup},
                                {"steps", config_.steps}}),
                         program::kLearningRate.str());
    std::vector<std::pair<Value *, Value *>> shards; // (parameter, its updated shard)
    for (auto &[param, grad] : trained) {
      const std::string &p = param->name();
      Value *target = sharded ? b.create(OpKind::Shard, {param}, mine, p + ".shard") : param;
      Value *moment1 = stateLike(b, program::adamMomentOf(p, 1), target->type());
      Value *moment2 = stateLike(b, program::adamMomentOf(p, 2), target->type());
      // Weight decay only where the builder asked for it (linear weights, not norms, biases or
      // embeddings, unless the model file says so).
      bool decay = param->def()->attrs().getBool("decay").value_or(false);
      Op *update = b.createOp(OpKind::AdamW, {target, grad, moment1, moment2, lr, clip, step},
                              attrs({{"beta1", config_.beta1},
                                     {"beta2", config_.beta2},
                                     {"eps", config_.eps},
                                     {"weight_decay", decay ? config_.weightDecay : 0.0}}),
                              p + ".new");
      if (!update)
        break;
      if (sharded)
        shards.emplace_back(param, update->result(0));
      else
        b.create(OpKind::Assign, {param, update->result(0)}, {}, "");
      b.create(OpKind::Assign, {moment1, update->result(1)}, {}, "");
      b.create(OpKind::Assign, {moment2, update->result(2)}, {}, "");
    }
    if (!shards.empty())
      gatherParameters(graph, b, shards, ranks);
    if (auto err = b.takeError())
      return std::move(err);
    graph.addOutput(lr);
    graph.addOutput(sumSquares);
    return true;
  }

private:
  /// The parameters rebuilt from every rank's updated shard: one all_gather, then each one's
  /// first elements in its shape, assigned back.
  static void gatherParameters(Graph &graph, Builder &b, const std::vector<std::pair<Value *, Value *>> &shards,
                               int64_t ranks) {
    std::vector<Value *> updated;
    for (auto &[param, shard] : shards)
      updated.push_back(shard);
    Op *gather = b.createOp(OpKind::AllGather, updated, attrs({{"ranks", ranks}}),
                            graph.uniqueName(shards.front().first->name() + ".gathered"));
    if (!gather)
      return;
    for (size_t i = 0; i < shards.size(); ++i) {
      Value *param = shards[i].first;
      const TensorType &type = param->type();
      Value *all = gather->result(unsigned(i));
      if (i > 0)
        graph.rename(all, graph.uniqueName(param->name() + ".gathered"));
      Value *first = b.create(OpKind::Slice, {all}, attrs({{"axis", int64_t(0)}, {"start", int64_t(0)}, {"size", type.numElements()}}),
                              param->name() + ".flat");
      std::vector<int64_t> shape(type.shape.begin(), type.shape.end());
      Value *whole = b.create(OpKind::Reshape, {first}, attrs({{"shape", shape}}), param->name() + ".new");
      b.create(OpKind::Assign, {param, whole}, {}, "");
    }
  }
  static Value *stateLike(Builder &b, const std::string &name, const TensorType &type) {
    return b.state(name, type, attrs({{"init", std::string("zeros")}}));
  }
  TrainConfig config_;
  DataParallelOptions dataParallel_;
};

} // namespace

std::unique_ptr<Pass> createAdamWPass(const TrainConfig &config, const DataParallelOptions &dataParallel) {
  return std::make_unique<AdamWPass>(config, dataParallel);
}

} // namespace tgc
