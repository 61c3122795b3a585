// expand-layernorm-fused: how the GPU runs layer_norm_linear, layer_norm_mlp and their
// gradients. Each becomes, in its place, the norm kernel and the cuBLASLt GEMMs it stands for,
// with the GEMMs' epilogues (matmul_bias; in fp32 matmul_bias_gelu's GELU_AUX_BIAS), as
// Transformer Engine runs LayerNormLinear and LayerNormMLP: a norm kernel that writes the
// GEMM's operand, then the GEMMs. The values between them are the op's own: nothing else reads
// them.
//
// The gradients read what the forward's expansion computed: the normalised input, and in the
// MLP the activation of fc1's output h, as Transformer Engine's LayerNormLinear and LayerNormMLP
// keep them (the GEMMs' BF16 operands; the same values the fused op would recompute, by the same
// kernels). With `recompute` (train.recompute, tgc --recompute) the gradients recompute them
// instead, as the fused op defines: a norm kernel and an elementwise kernel, no GEMM; then
// neither is alive between the forward and the backward, which is the memory the fusion can
// save, at the cost of those kernels. Each expansion is the fused op's CPU reference
// (CpuFusedKernels.cpp) written as ops, in the same order, so the result is the same function.
#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

#include <map>
#include <tuple>

namespace tgc {
namespace {

/// Builds the expansion of one fused op just before it.
class Expansion {
public:
  Expansion(Graph &graph, Op &fused)
      : b_(graph), fused_(fused), layout_(fused.kind(), fused.attrs()),
        base_(fused.result()->name()) {
    b_.setInsertionPoint(&fused);
  }

  Value *operand(FusedSlot slot) const {
    return layout_.has(slot) ? fused_.operand(layout_[slot]) : nullptr;
  }
  bool has(FusedSlot slot) const { return layout_.has(slot); }
  Op &op() const { return fused_; }
  bool layerNorm() const { return has(FusedSlot::Beta); }

  Value *create(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap a, llvm::StringRef suffix) {
    return b_.create(kind, operands, std::move(a), base_ + "." + suffix.str());
  }
  Op *createOp(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap a, llvm::StringRef suffix) {
    return b_.createOp(kind, operands, std::move(a), base_ + "." + suffix.str());
  }

  /// The GEMM flags: the layout given, and the fused op's gemm_dtype.
  AttrMap gemmAttrs(MatMulLayout layout = {}) const {
    AttrMap a = matmulAttrs(layout);
    copyGemmDType(fused_, a);
    return a;
  }

  /// A forward value's name: in a gradient's expansion, a recomputation says so.
  std::string forward(llvm::StringRef suffix) const {
    return (has(FusedSlot::Dy) ? "recomputed." : "") + suffix.str();
  }

  Value *norm() {
    Value *x = operand(FusedSlot::X), *gamma = operand(FusedSlot::Gamma);
    AttrMap a = attrs({{"eps", *fused_.attrs().getFloat("eps")}});
    if (layerNorm())
      return create(OpKind::LayerNorm, {x, gamma, operand(FusedSlot::Beta)}, a, forward("norm"));
    return create(OpKind::RMSNorm, {x, gamma}, a, forward("norm"));
  }

  /// x @ w^T (+ bias): the BIAS epilogue where there is a bias.
  Value *linear(Value *x, Value *w, Value *bias, llvm::StringRef suffix) {
    if (bias)
      return create(OpKind::MatMulBias, {x, w, bias}, gemmAttrs(), suffix);
    return create(OpKind::MatMul, {x, w}, gemmAttrs(kTransposedWeight), suffix);
  }

  /// fc1's output h and the activation of it.
  struct Activation {
    Value *h = nullptr, *act = nullptr;
  };
  bool swiglu() const { return fused_.attrs().getString(kActivation) == "swiglu"; }

  /// `kept`: the gradient reads this h (kept, not recomputed).
  Activation fc1(Value *n, bool kept) {
    Value *w1 = operand(FusedSlot::W1), *b1 = operand(FusedSlot::B1);
    // The GELU_AUX_BIAS epilogue, h its second result. Under BF16 only where the gradient reads
    // the h kept: fuse-dgelu's DGELU epilogue then reads it and the GPU writes both in BF16
    // (CudaProgram::bf16Rounding). The epilogue with fp32 outputs is slower than the BIAS
    // epilogue and a GELU kernel writing BF16 (BENCHMARKS.md, sessions 6 and 16), and a few-row
    // product (a decode step) is a GEMV that applies the GELU itself.
    if (!swiglu() && b1 && (kept || !hasBf16Gemms(fused_.attrs()))) {
      Op *gemm = createOp(OpKind::MatMulBiasGelu, {n, w1, b1}, gemmAttrs(), forward("act"));
      Activation r;
      if (gemm) {
        r.h = gemm->result(1);
        r.act = gemm->result(0);
      }
      return r;
    }
    return activate(linear(n, w1, b1, forward("fc1")));
  }

  /// The activation of fc1's output h.
  Activation activate(Value *h) {
    Activation r;
    r.h = h;
    if (!h)
      return r;
    // SwiGLU: one op reading h's [gate | up] halves where they lie.
    r.act = create(swiglu() ? OpKind::Swiglu : OpKind::Gelu, {h}, {}, forward("act"));
    return r;
  }

  /// d(activation) -> dh.
  Value *activationGrad(Value *dact, const Activation &fwd) {
    return create(swiglu() ? OpKind::SwigluBackward : OpKind::GeluBackward, {dact, fwd.h}, {}, "dh");
  }

  /// The gradients of y = x @ w^T (+ b) from dy, as autodiff writes them.
  struct LinearGrads {
    Value *dx = nullptr, *dw = nullptr, *db = nullptr;
  };
  LinearGrads linearGrads(Value *dy, Value *x, Value *w, bool bias, llvm::StringRef name) {
    LinearGrads g;
    if (!dy || !x || !w)
      return g;
    int64_t k = x->type().dim(-1), n = w->type().dim(0), rows = x->type().numElements() / k;
    std::string s = name.str();
    g.dx = create(OpKind::MatMul, {dy, w}, gemmAttrs(), s + ".dx");
    Value *dyRows = create(OpKind::Reshape, {dy}, attrs({{"shape", std::vector<int64_t>{rows, n}}}),
                           s + ".dy.rows");
    Value *xRows = create(OpKind::Reshape, {x}, attrs({{"shape", std::vector<int64_t>{rows, k}}}),
                          s + ".x.rows");
    g.dw = create(OpKind::MatMul, {dyRows, xRows}, gemmAttrs({true, false}), s + ".dw");
    if (bias)
      g.db = create(OpKind::ReduceTo, {dy}, attrs({{"shape", std::vector<int64_t>{n}}}), s + ".db");
    return g;
  }

  /// dx, dgamma and (layer norm) dbeta from the gradient of the normalised input.
  Op *normGrad(Value *dn) {
    OpKind kind = layerNorm() ? OpKind::LayerNormBackward : OpKind::RMSNormBackward;
    return createOp(kind, {dn, operand(FusedSlot::X), operand(FusedSlot::Gamma)},
                    attrs({{"eps", *fused_.attrs().getFloat("eps")}}), "dx");
  }

  /// The fused op's results, in order, become `values`.
  llvm::Error finish(llvm::ArrayRef<Value *> values) {
    if (auto err = b_.takeError())
      return err;
    Graph &graph = b_.graph();
    if (values.size() != fused_.numResults())
      return makeError("expanding {}: {} values for its {} results", fused_.name().str().c_str(), values.size(),
                       fused_.numResults());
    std::vector<std::string> names;
    for (unsigned i = 0; i < fused_.numResults(); ++i) {
      names.push_back(fused_.result(i)->name());
      graph.replaceAllUsesWith(fused_.result(i), values[i]);
    }
    graph.eraseOp(&fused_);
    for (unsigned i = 0; i < values.size(); ++i)
      if (!graph.lookup(names[i]))
        graph.rename(values[i], names[i]);
    return llvm::Error::success();
  }

private:
  Builder b_;
  Op &fused_;
  FusedLayout layout_;
  std::string base_;
};

/// What the forward expansions computed that their gradients read again: each norm by its
/// (x, gamma, beta), each activation by fc1's output h. Empty under `recompute`.
class Kept {
public:
  explicit Kept(const TrainConfig &train) : train_(train) {}

  /// The norm of the fused op's input: the forward's, or a new one.
  Value *norm(Expansion &e) {
    auto key = normKey(e);
    if (auto it = norms_.find(key); it != norms_.end())
      return it->second;
    Value *n = e.norm();
    if (!recomputes(e) && !e.has(FusedSlot::Dy))
      norms_[key] = n;
    return n;
  }
  /// fc1 and its activation, in a forward expansion.
  Expansion::Activation fc1(Expansion &e, Value *n) {
    Op &op = e.op();
    bool hRead = op.numResults() > 1 && !op.result(1)->users().empty();
    Expansion::Activation a = e.fc1(n, !recomputes(e) && hRead);
    if (!recomputes(e) && a.h)
      activations_[a.h] = a;
    return a;
  }
  /// The activation of h in a gradient: the forward's, or a new one.
  Expansion::Activation activation(Expansion &e, Value *h) {
    if (auto it = activations_.find(h); it != activations_.end())
      return it->second;
    return e.activate(h);
  }

private:
  using NormKey = std::tuple<Value *, Value *, Value *>;
  static NormKey normKey(Expansion &e) {
    return {e.operand(FusedSlot::X), e.operand(FusedSlot::Gamma), e.operand(FusedSlot::Beta)};
  }
  /// Whether the expanded op's layer recomputes (train.recompute, recompute_layers).
  bool recomputes(Expansion &e) const { return train_.recomputes(layerOf(e.op().result()->name())); }
  TrainConfig train_;
  std::map<NormKey, Value *> norms_;
  llvm::DenseMap<Value *, Expansion::Activation> activations_;
};

llvm::Error expandLayerNormLinear(Graph &graph, Op &op, Kept &kept) {
  Expansion e(graph, op);
  Value *n = kept.norm(e);
  Value *y = e.linear(n, e.operand(FusedSlot::W1), e.operand(FusedSlot::B1), "out");
  if (op.numResults() > 1)
    return e.finish({y, n});
  return e.finish({y});
}

llvm::Error expandLayerNormMLP(Graph &graph, Op &op, Kept &kept) {
  Expansion e(graph, op);
  Value *n = kept.norm(e);
  Expansion::Activation fc1 = kept.fc1(e, n);
  Value *y = e.linear(fc1.act, e.operand(FusedSlot::W2), e.operand(FusedSlot::B2), "out");
  return e.finish({y, fc1.h});
}

/// dx, dgamma, [dbeta] of the norm, then the layer's own gradients.
llvm::SmallVector<Value *, 8> normGrads(Expansion &e, Value *dn) {
  Op *back = e.normGrad(dn);
  if (!back)
    return {};
  llvm::SmallVector<Value *, 8> grads{back->result(0), back->result(1)};
  if (e.layerNorm())
    grads.push_back(back->result(2));
  return grads;
}

llvm::Error expandLayerNormLinearBackward(Graph &graph, Op &op, Kept &kept) {
  Expansion e(graph, op);
  bool bias = e.has(FusedSlot::B1);
  Value *n = kept.norm(e);
  auto g = e.linearGrads(e.operand(FusedSlot::Dy), n, e.operand(FusedSlot::W1), bias, "linear");
  Value *dn = g.dx;
  if (Value *dnorm = e.operand(FusedSlot::DNorm))
    dn = e.create(OpKind::Add, {dn, dnorm}, {}, "dnorm");
  auto grads = normGrads(e, dn);
  grads.push_back(g.dw);
  if (bias)
    grads.push_back(g.db);
  return e.finish(grads);
}

llvm::Error expandLayerNormMLPBackward(Graph &graph, Op &op, Kept &kept) {
  Expansion e(graph, op);
  bool bias = e.has(FusedSlot::B1);
  Value *n = kept.norm(e);
  Expansion::Activation fwd = kept.activation(e, e.operand(FusedSlot::Hidden));
  auto g2 = e.linearGrads(e.operand(FusedSlot::Dy), fwd.act, e.operand(FusedSlot::W2), bias, "fc2");
  Value *dh = e.activationGrad(g2.dx, fwd);
  auto g1 = e.linearGrads(dh, n, e.operand(FusedSlot::W1), bias, "fc1");
  auto grads = normGrads(e, g1.dx);
  grads.push_back(g1.dw);
  if (bias)
    grads.push_back(g1.db);
  grads.push_back(g2.dw);
  if (bias)
    grads.push_back(g2.db);
  return e.finish(grads);
}

class ExpandLayerNormFused : public Pass {
public:
  explicit ExpandLayerNormFused(const TrainConfig &train) : train_(train) {}

  llvm::Expected<bool> run(Graph &graph) override {
    bool changed = false;
    Kept kept(train_); // the forward's ops come before their gradients'
    for (Op *op : graph.ops()) {
      llvm::Error err = llvm::Error::success();
      switch (op->kind()) {
      case OpKind::LayerNormLinear:
        err = expandLayerNormLinear(graph, *op, kept);
        break;
      case OpKind::LayerNormMLP:
        err = expandLayerNormMLP(graph, *op, kept);
        break;
      case OpKind::LayerNormLinearBackward:
        err = expandLayerNormLinearBackward(graph, *op, kept);
        break;
      case OpKind::LayerNormMLPBackward:
        err = expandLayerNormMLPBackward(graph, *op, kept);
        break;
      default:
        continue;
      }
      if (err)
        return std::move(err);
      changed = true;
    }
    return changed;
  }

private:
  TrainConfig train_;
};

} // namespace

std::unique_ptr<Pass> createExpandLayerNormFusedPass(const TrainConfig &train) {
  return std::make_unique<ExpandLayerNormFused>(train);
}

} // namespace tgc
