// autodiff: appends the backward program of the graph's first output (a scalar loss), built
// from one gradient rule per op. The gradient of parameter p is the value %p.grad, and each one
// is added to the graph's outputs (the adamw pass consumes them).
#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/precision/Precision.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <fmt/format.h>
#include <numeric>

namespace tgc {
namespace {

/// What a gradient rule sees: the op, the gradients of its results (nullptr where a result
/// has none) and which operands need a gradient.
struct GradContext {
  Builder &b;
  const Op &op;
  llvm::ArrayRef<Value *> dys;
  llvm::SmallVector<bool, 4> needs;

  Value *x(unsigned i) const { return op.operand(i); }
  Value *dy() const { return dys[0]; }
  std::string name(unsigned i) const { return program::gradientOf(x(i)->name()); }
  Value *create(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs, unsigned i) {
    return b.create(kind, operands, std::move(attrs), name(i));
  }
};

using Grads = llvm::SmallVector<Value *, 4>;
using GradFn = llvm::Expected<Grads> (*)(GradContext &);

/// Sums `g` down to `target`'s shape when `target` was broadcast over leading dims.
Value *reduceToShapeOf(GradContext &c, Value *g, Value *target, unsigned i) {
  if (!g || g->type().shape == target->type().shape)
    return g;
  std::vector<int64_t> shape(target->type().shape.begin(), target->type().shape.end());
  return c.create(OpKind::ReduceTo, {g}, attrs({{"shape", shape}}), i);
}

llvm::Expected<Grads> notDifferentiable(GradContext &c) {
  return makeError("no gradient rule for {} (it is not differentiable)", c.op.name().str().c_str());
}


llvm::Expected<Grads> gradEmbedding(GradContext &c) {
  int64_t vocab = c.x(0)->type().dim(0);
  return Grads{c.create(OpKind::EmbeddingBackward, {c.dy(), c.x(1)}, attrs({{"vocab", vocab}}), 0),
               nullptr};
}

llvm::Expected<Grads> gradMatMul(GradContext &c) {
  // C = op_a(A) op_b(B); the four transpose cases, each operand's gradient in its own layout.
  Value *a = c.x(0), *b = c.x(1), *dc = c.dy();
  MatMulLayout layout = matmulLayout(c.op.attrs());
  bool ta = layout.transposeA, tb = layout.transposeB;
  // FP8 forward GEMMs get FP8 backward GEMMs: the output gradient is quantized (E5M2 under
  // hybrid) with scaling state of its own, then meets the saved FP8 operands (TE's dgrad and
  // wgrad). BF16 GEMMs keep BF16 operands in the backward.
  if (auto fp8 = fp8GemmChoice(c.op.attrs(), c.op.result()->name())) {
    std::string prefix = program::fp8StatePrefix(fp8->site, program::Fp8Role::GradOutput);
    Value *q = quantizeWithState(c.b, dc, prefix, fp8->gradFormat, fp8->history,
                                 Fp8ScalingChoice{fp8->currentMargin.has_value(), fp8->currentMargin.value_or(0),
                                                  fp8->block ? int64_t(1) : int64_t(0)});
    if (!q)
      return Grads{nullptr, nullptr};
    dc = q;
  }
  auto mm = [&](Value *l, Value *r, bool tl, bool tr, unsigned i) {
    AttrMap flags = matmulAttrs({tl, tr});
    copyGemmPrecision(c.op.attrs(), flags);
    return c.create(OpKind::MatMul, {l, r}, std::move(flags), i);
  };
  Grads grads{nullptr, nullptr};
  if (c.needs[0]) {
    // dA = dC op_b(B)^T, laid out as A; with transpose_a that is (dC op_b(B)^T)^T, formed with
    // dC on the left so that a B shared over the batch stays the rank-2 operand.
    Value *g = tb ? mm(dc, b, false, false, 0) : mm(dc, b, false, true, 0);
    if (ta) {
      std::vector<int64_t> perm(a->type().rank());
      std::iota(perm.begin(), perm.end(), 0);
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      g = c.create(OpKind::Transpose, {g}, attrs({{"perm", perm}}), 0);
    }
    grads[0] = g;
  }
  if (c.needs[1]) {
    bool shared = b->type().rank() == 2 && a->type().rank() > 2;
    if (shared && !ta) {
      // A weight shared over the batch: fold the batch into M so one GEMM sums over it.
      int64_t k = a->type().dim(-1), n = dc->type().dim(-1);
      int64_t rows = a->type().numElements() / k;
      Value *a2 = c.b.create(OpKind::Reshape, {a}, attrs({{"shape", std::vector<int64_t>{rows, k}}}),
                             a->name() + ".rows");
      Value *dc2 = c.b.create(OpKind::Reshape, {dc}, attrs({{"shape", std::vector<int64_t>{rows, n}}}),
                              dc->name() + ".rows");
      grads[1] = tb ? mm(dc2, a2, true, false, 1) : mm(a2, dc2, true, false, 1);
    } else {
      Value *g = nullptr;
      if (!ta)
        g = tb ? mm(dc, a, true, false, 1) : mm(a, dc, true, false, 1);
      else
        g = tb ? mm(dc, a, true, true, 1) : mm(a, dc, false, false, 1);
      grads[1] = reduceToShapeOf(c, g, b, 1);
    }
  }
  return grads;
}

llvm::Expected<Grads> gradAdd(GradContext &c) {
  return Grads{c.dy(), c.needs[1] ? reduceToShapeOf(c, c.dy(), c.x(1), 1) : nullptr};
}

llvm::Expected<Grads> gradMul(GradContext &c) {
  Grads grads{nullptr, nullptr};
  if (c.needs[0])
    grads[0] = c.create(OpKind::Mul, {c.dy(), c.x(1)}, {}, 0);
  if (c.needs[1])
    grads[1] = reduceToShapeOf(c, c.create(OpKind::Mul, {c.dy(), c.x(0)}, {}, 1), c.x(1), 1);
  return grads;
}

llvm::Expected<Grads> gradScale(GradContext &c) {
  return Grads{c.create(OpKind::Scale, {c.dy()}, c.op.attrs(), 0)};
}

llvm::Expected<Grads> gradGelu(GradContext &c) {
  return Grads{c.create(OpKind::GeluBackward, {c.dy(), c.x(0)}, {}, 0)};
}

llvm::Expected<Grads> gradSilu(GradContext &c) {
  return Grads{c.create(OpKind::SiluBackward, {c.dy(), c.x(0)}, {}, 0)};
}

llvm::Expected<Grads> gradSwiglu(GradContext &c) {
  return Grads{c.create(OpKind::SwigluBackward, {c.dy(), c.x(0)}, {}, 0)};
}

llvm::Expected<Grads> gradRope(GradContext &c) {
  // A rotation's transpose is its inverse: the gradient rotates dy back (at the same positions;
  // the positions themselves have none).
  AttrMap attrs = c.op.attrs();
  attrs.set("inverse", !attrs.getBool("inverse").value_or(false));
  if (c.op.numOperands() > 1)
    return Grads{c.create(OpKind::Rope, {c.dy(), c.x(1)}, std::move(attrs), 0), nullptr};
  return Grads{c.create(OpKind::Rope, {c.dy()}, std::move(attrs), 0)};
}

llvm::Expected<Grads> gradLayerNorm(GradContext &c) {
  Op *back = c.b.createOp(OpKind::LayerNormBackward, {c.dy(), c.x(0), c.x(1)}, c.op.attrs(),
                          c.name(0));
  if (!back)
    return Grads{nullptr, nullptr, nullptr};
  return Grads{back->result(0), back->result(1), back->result(2)};
}

llvm::Expected<Grads> gradRMSNorm(GradContext &c) {
  Op *back = c.b.createOp(OpKind::RMSNormBackward, {c.dy(), c.x(0), c.x(1)}, c.op.attrs(),
                          c.name(0));
  if (!back)
    return Grads{nullptr, nullptr};
  return Grads{back->result(0), back->result(1)};
}

llvm::Expected<Grads> gradReshape(GradContext &c) {
  const Shape &shape = c.x(0)->type().shape;
  return Grads{c.create(OpKind::Reshape, {c.dy()},
                        attrs({{"shape", std::vector<int64_t>(shape.begin(), shape.end())}}), 0)};
}

llvm::Expected<Grads> gradTranspose(GradContext &c) {
  std::vector<int64_t> perm = *c.op.attrs().getInts("perm"), inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i)
    inverse[perm[i]] = int64_t(i);
  return Grads{c.create(OpKind::Transpose, {c.dy()}, attrs({{"perm", inverse}}), 0)};
}

llvm::Expected<Grads> gradSlice(GradContext &c) {
  int64_t axis = *c.op.attrs().getInt("axis");
  return Grads{c.create(OpKind::Pad, {c.dy()},
                        attrs({{"axis", axis},
                               {"start", *c.op.attrs().getInt("start")},
                               {"size", c.x(0)->type().shape[axis]}}),
                        0)};
}

llvm::Expected<Grads> gradCausalMask(GradContext &c) {
  return Grads{c.create(OpKind::CausalMask, {c.dy()}, attrs({{"fill", 0.0}}), 0)};
}

llvm::Expected<Grads> gradSoftmax(GradContext &c) {
  return Grads{c.create(OpKind::SoftmaxBackward, {c.dy(), c.op.result()}, {}, 0)};
}

llvm::Expected<Grads> gradLogSoftmax(GradContext &c) {
  return Grads{c.create(OpKind::LogSoftmaxBackward, {c.dy(), c.op.result()}, {}, 0)};
}

llvm::Expected<Grads> gradNLLLoss(GradContext &c) {
  return Grads{c.create(OpKind::NLLLossBackward, {c.dy(), c.x(0), c.x(1)}, {}, 0), nullptr};
}

llvm::Expected<Grads> gradReduceTo(GradContext &c) {
  // Broadcast dy back over the summed leading dims: zeros of x's shape plus dy.
  Value *zeros = c.b.constant(c.name(0) + ".zeros", c.x(0)->type(), 0.0);
  return Grads{c.create(OpKind::Add, {zeros, c.dy()}, {}, 0)};
}

/// The gradient of result i, or zeros when the loss does not depend on that result.
Value *dyOrZeros(GradContext &c, unsigned i) {
  if (c.dys[i])
    return c.dys[i];
  return c.b.constant(c.op.result(i)->name() + ".grad.zeros", c.op.result(i)->type(), 0.0);
}

/// A fused backward op whose results are the gradients of the forward operands, in order.
llvm::Expected<Grads> fusedBackward(GradContext &c, OpKind kind, llvm::ArrayRef<Value *> leading) {
  llvm::SmallVector<Value *, 8> operands(leading.begin(), leading.end());
  operands.append(c.op.operands().begin(), c.op.operands().end());
  Op *back = c.b.createOp(kind, operands, c.op.attrs(), c.name(0));
  Grads grads;
  for (unsigned i = 0; i < c.op.numOperands(); ++i)
    grads.push_back(back ? back->result(i) : nullptr);
  return grads;
}

llvm::Expected<Grads> gradLayerNormLinear(GradContext &c) {
  llvm::SmallVector<Value *, 2> leading{dyOrZeros(c, 0)};
  if (c.op.numResults() > 1)
    leading.push_back(dyOrZeros(c, 1));
  return fusedBackward(c, OpKind::LayerNormLinearBackward, leading);
}

llvm::Expected<Grads> gradLayerNormMLP(GradContext &c) {
  // h (result 1) is kept for this rule; the fusion leaves nothing else reading it.
  if (c.dys[1])
    return makeError("no gradient rule for layer_norm_mlp when another op reads "
                     "its fc1 output %{}",
                     c.op.result(1)->name().c_str());
  return fusedBackward(c, OpKind::LayerNormMLPBackward, {dyOrZeros(c, 0), c.op.result(1)});
}

llvm::Expected<Grads> gradAttention(GradContext &c) {
  if (isHeadMajor(c.op.attrs()))
    return makeError("attention with head_major (keep-attention-heads) comes after autodiff");
  // lse is kept for this rule; the fusion leaves nothing else reading it.
  if (c.dys[1])
    return makeError("no gradient rule for attention when another op reads its lse %{}",
                     c.op.result(1)->name().c_str());
  return Grads{c.create(OpKind::AttentionBackward, {dyOrZeros(c, 0), c.x(0), c.op.result(0), c.op.result(1)},
                        c.op.attrs(), 0)};
}

llvm::Expected<Grads> gradFp8Attention(GradContext &c) {
  if (c.dys[1] || c.dys[2])
    return makeError("no gradient rule for fp8_attention when another op reads its lse or amax %{}",
                     c.op.result(1)->name().c_str());
  // dout quantized with state of its own (E5M2 under hybrid), as an FP8 GEMM's output
  // gradient; dS quantized inside the gradient at dP's state.
  auto fp8 = fp8GemmChoice(c.op.attrs(), c.op.result()->name());
  if (!fp8)
    return makeError("fp8_attention %{} has no fp8_grad (assign-precision sets it)", c.op.result()->name().c_str());
  Value *dout = quantizeWithState(c.b, dyOrZeros(c, 0), attentionStatePrefix(fp8->site, program::kAttentionDout),
                                  fp8->gradFormat, fp8->history,
                                  Fp8ScalingChoice{fp8->currentMargin.has_value(), fp8->currentMargin.value_or(0)});
  auto [dpScale, dpScaleInv] = scalingState(c.b, attentionStatePrefix(fp8->site, program::kAttentionDs), fp8->history);
  if (!dout)
    return Grads{nullptr, nullptr, nullptr, nullptr};
  AttrMap attrs;
  attrs.set("heads", *c.op.attrs().getInt("heads"));
  attrs.set("scale", *c.op.attrs().getFloat("scale"));
  return Grads{c.create(OpKind::Fp8AttentionBackward,
                        {dout, c.x(0), c.op.result(0), c.op.result(1), c.x(1), dout->def()->operand(2), c.x(2),
                         c.x(3), dpScale, dpScaleInv},
                        attrs, 0),
               nullptr, nullptr, nullptr};
}

llvm::Expected<Grads> gradResidualNorm(GradContext &c) {
  // sum = a + b, n = norm(sum): d sum = dys[0] + norm backward of dys[1] at sum.
  Value *sum = c.op.result(0), *total = c.dys[0];
  Grads grads(c.op.numOperands(), nullptr);
  if (c.dys[1]) {
    bool layerNorm = isLayerNorm(c.op.attrs());
    Op *back = c.b.createOp(layerNorm ? OpKind::LayerNormBackward : OpKind::RMSNormBackward,
                            {c.dys[1], sum, c.x(2)}, attrs({{"eps", *c.op.attrs().getFloat("eps")}}),
                            sum->name() + ".grad.norm");
    if (!back)
      return grads;
    grads[2] = back->result(1);
    if (layerNorm)
      grads[3] = back->result(2);
    Value *dx = back->result(0);
    total = total ? c.b.create(OpKind::Add, {total, dx}, {}, sum->name() + ".grad") : dx;
  }
  grads[0] = grads[1] = total;
  return grads;
}

/// The gradients of x @ w^T + b (operands x, w, b) from the gradient of that sum.
Grads linearWithBiasGrads(GradContext &c, Value *dsum) {
  if (!dsum)
    return Grads{nullptr, nullptr, nullptr};
  Value *x = c.x(0), *w = c.x(1);
  int64_t k = x->type().dim(-1), n = w->type().dim(0), rows = x->type().numElements() / k;
  Value *xRows = c.b.create(OpKind::Reshape, {x}, attrs({{"shape", std::vector<int64_t>{rows, k}}}),
                            x->name() + ".rows");
  Value *dRows = c.b.create(OpKind::Reshape, {dsum}, attrs({{"shape", std::vector<int64_t>{rows, n}}}),
                            dsum->name() + ".rows");
  AttrMap dgrad, wgrad = matmulAttrs({true, false});
  {
    copyGemmPrecision(c.op.attrs(), dgrad);
    copyGemmPrecision(c.op.attrs(), wgrad);
  }
  return Grads{c.needs[0] ? c.create(OpKind::MatMul, {dsum, w}, dgrad, 0) : nullptr,
               c.create(OpKind::MatMul, {dRows, xRows}, wgrad, 1),
               c.create(OpKind::ReduceTo, {dsum}, attrs({{"shape", std::vector<int64_t>{n}}}), 2)};
}

llvm::Expected<Grads> gradMatMulBias(GradContext &c) { return linearWithBiasGrads(c, c.dy()); }

llvm::Expected<Grads> gradMatMulBiasGelu(GradContext &c) {
  // y = gelu(pre), pre = x @ w^T + b (result 1, kept by the forward for this rule).
  Value *pre = c.op.result(1);
  Value *dpre = c.b.create(OpKind::GeluBackward, {dyOrZeros(c, 0), pre}, {}, pre->name() + ".grad");
  if (c.dys[1])
    dpre = c.b.create(OpKind::Add, {dpre, c.dys[1]}, {}, pre->name() + ".grad");
  return linearWithBiasGrads(c, dpre);
}

llvm::Expected<Grads> gradQuantize(GradContext &c) {
  // Straight through: the gradient of the quantized value is the gradient of its input (what
  // TE does); scales and amaxes get none.
  return Grads{c.dys[0], nullptr, nullptr};
}


llvm::Expected<Grads> gradMaskedSoftmax(GradContext &c) {
  return Grads{c.create(OpKind::MaskedSoftmaxBackward, {c.dy(), c.op.result()},
                        attrs({{"scale", *c.op.attrs().getFloat("scale")}}), 0)};
}

llvm::Expected<Grads> gradCrossEntropy(GradContext &c) {
  if (c.op.numOperands() > 2)
    return makeError("cross_entropy with its gradient (fuse-cross-entropy-grad) comes after autodiff");
  return Grads{c.create(OpKind::CrossEntropyBackward, {c.dy(), c.x(0), c.x(1)}, {}, 0), nullptr};
}

// Gradients of gradients and of the optimizer are not needed for training.

llvm::Expected<Grads> gradConcat(GradContext &c) {
  int64_t axis = *c.op.attrs().getInt("axis"), start = 0;
  Grads grads(c.op.numOperands(), nullptr);
  for (unsigned i = 0; i < c.op.numOperands(); ++i) {
    int64_t size = c.x(i)->type().shape[axis];
    if (c.needs[i])
      grads[i] = c.create(OpKind::Slice, {c.dy()}, attrs({{"axis", axis}, {"start", start}, {"size", size}}), i);
    start += size;
  }
  return grads;
}

// The rule of each op whose Gradient column says yes; the others have none.
#define GRAD_yes(Enum) &grad##Enum
#define GRAD_no(Enum) &notDifferentiable
const GradFn kGradFns[] = {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) GRAD_##Gradient(Enum),
#include "ir/Ops.def"
};
#undef GRAD_yes
#undef GRAD_no

class Autodiff : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    if (graph.outputs().empty() || graph.outputs()[0]->type() != TensorType(DType::F32, {}))
      return stringError("autodiff needs a scalar f32 loss as the graph's first output");
    Value *loss = graph.outputs()[0];
    std::vector<Op *> forward = graph.ops();
    // Values that depend on a parameter need gradients; the rest (data, constants) do not.
    llvm::DenseSet<const Value *> requiresGrad;
    for (Op *op : forward) {
      bool any = op->kind() == OpKind::Param;
      for (Value *v : op->operands())
        any |= requiresGrad.count(v) != 0;
      if (op->kind() == OpKind::Param && graph.lookup(program::gradientOf(op->result()->name())))
        return stringError("graph is already differentiated (%" + op->result()->name() + ".grad exists)");
      for (unsigned i = 0; i < op->numResults() && any; ++i)
        if (isFloat(op->result(i)->type().dtype))
          requiresGrad.insert(op->result(i));
    }
    Builder b(graph);
    llvm::DenseMap<const Value *, Value *> grads;
    grads[loss] = b.constant(program::gradientOf(loss->name()), loss->type(), 1.0);
    for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
      Op *op = *it;
      if (isLeaf(op->kind()))
        continue;
      llvm::SmallVector<Value *, 3> dys;
      bool any = false;
      for (unsigned i = 0; i < op->numResults(); ++i) {
        dys.push_back(grads.lookup(op->result(i)));
        any |= dys.back() != nullptr;
      }
      if (!any)
        continue;
      GradContext context{b, *op, dys, {}};
      bool needed = false;
      for (Value *v : op->operands()) {
        context.needs.push_back(requiresGrad.count(v) != 0);
        needed |= context.needs.back();
      }
      if (!needed)
        continue;
      // Rules of multi-result ops accept results without a gradient (nullptr).
      auto operandGrads = kGradFns[static_cast<unsigned>(op->kind())](context);
      if (!operandGrads)
        return operandGrads.takeError();
      if (auto err = b.takeError())
        return std::move(err);
      for (unsigned i = 0; i < op->numOperands(); ++i) {
        Value *g = i < operandGrads->size() ? (*operandGrads)[i] : nullptr;
        if (!g || !context.needs[i])
          continue;
        Value *v = op->operand(i);
        Value *&acc = grads[v];
        acc = acc ? b.create(OpKind::Add, {acc, g}, {}, program::gradientOf(v->name())) : g;
      }
      if (auto err = b.takeError())
        return std::move(err);
    }
    // Name each parameter's final gradient %p.grad and return it.
    llvm::DenseSet<Value *> claimed;
    for (Op *op : forward) {
      if (op->kind() != OpKind::Param || !grads.count(op->result()))
        continue;
      Value *g = grads[op->result()];
      // A value that is already another parameter's gradient (add(%p1, %p2)) or a leaf gets
      // a copy of its own, so that every %p.grad is a distinct value.
      if (claimed.count(g) || isLeaf(g->def()->kind()))
        g = b.create(OpKind::Scale, {g}, attrs({{"factor", 1.0}}), program::gradientOf(op->result()->name()));
      claimed.insert(g);
      std::string wanted = program::gradientOf(op->result()->name());
      if (g->name() != wanted) {
        if (Value *other = graph.lookup(wanted))
          graph.rename(other, graph.uniqueName(wanted + ".part"));
        graph.rename(g, wanted);
      }
      graph.addOutput(g);
    }
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createAutodiffPass() { return std::make_unique<Autodiff>(); }

} // namespace tgc
