// adamw: the optimizer step as IR. Consumes the %p.grad outputs of autodiff and appends global
// gradient-norm clipping, the learning-rate schedule and one adamw op per parameter, whose new
// values are assigned back to the parameter and its two moments (state, fp32).
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Passes.h"

namespace tgc {
namespace {

class AdamWPass : public Pass {
public:
  explicit AdamWPass(TrainConfig config) : config_(config) {}
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

    Builder b(graph);
    Value *step = b.input(program::kStep.str(), TensorType(DType::I32, {}));
    // Global norm over all gradients, summed in program order (deterministic); the last sum is
    // the program's output kGradNormSquared.
    Value *sumSquares = nullptr;
    for (size_t i = 0; i < trained.size(); ++i) {
      Value *grad = trained[i].second;
      bool last = i + 1 == trained.size();
      std::string name = last && i == 0 ? program::kGradNormSquared.str() : grad->name() + ".sumsq";
      Value *s = b.create(OpKind::SumSquares, {grad}, {}, name);
      if (sumSquares)
        s = b.create(OpKind::Add, {sumSquares, s}, {}, last ? program::kGradNormSquared.str() : "grad_norm.partial");
      sumSquares = s;
    }
    Value *clip = b.create(OpKind::ClipScale, {sumSquares}, attrs({{"max_norm", config_.gradClip}}),
                           "grad_clip");
    Value *lr = b.create(OpKind::LRSchedule, {step},
                         attrs({{"lr", config_.lr},
                                {"min_lr", config_.lr * config_.minLrRatio},
                                {"warmup", config_.warmup},
                                {"steps", config_.steps}}),
                         program::kLearningRate.str());
    for (auto &[param, grad] : trained) {
      const std::string &p = param->name();
      Value *moment1 = stateLike(b, program::adamMomentOf(p, 1), param->type());
      Value *moment2 = stateLike(b, program::adamMomentOf(p, 2), param->type());
      // Weight decay only where the builder asked for it (linear weights, not norms, biases or
      // embeddings, unless the model file says so).
      bool decay = param->def()->attrs().getBool("decay").value_or(false);
      Op *update = b.createOp(OpKind::AdamW, {param, grad, moment1, moment2, lr, clip, step},
                              attrs({{"beta1", config_.beta1},
                                     {"beta2", config_.beta2},
                                     {"eps", config_.eps},
                                     {"weight_decay", decay ? config_.weightDecay : 0.0}}),
                              p + ".new");
      if (!update)
        break;
      b.create(OpKind::Assign, {param, update->result(0)}, {}, "");
      b.create(OpKind::Assign, {moment1, update->result(1)}, {}, "");
      b.create(OpKind::Assign, {moment2, update->result(2)}, {}, "");
    }
    if (auto err = b.takeError())
      return std::move(err);
    graph.addOutput(lr);
    graph.addOutput(sumSquares);
    return true;
  }

private:
  static Value *stateLike(Builder &b, const std::string &name, const TensorType &type) {
    return b.state(name, type, attrs({{"init", std::string("zeros")}}));
  }
  TrainConfig config_;
};

} // namespace

std::unique_ptr<Pass> createAdamWPass(const TrainConfig &config) {
  return std::make_unique<AdamWPass>(config);
}

} // namespace tgc
