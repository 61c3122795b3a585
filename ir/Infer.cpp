#include "ir/Infer.h"

#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "ir/InferRules.h"
#include "support/Error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc::infer {

/// Arithmetic ops take f32, bf16 or f16; FP8 tensors feed only GEMMs and layout ops.
llvm::Error requireFloat(const TensorType &t, llvm::StringRef what) {
  if (!isFloat(t.dtype) || isFp8(t.dtype))
    return makeError("{} must be an f32, bf16 or f16 tensor, got {}", what, t.str());
  return llvm::Error::success();
}

llvm::Error checkGemmDType(const AttrMap &attrs) {
  if (attrs.has(kGemmDtype) && !hasBf16Gemms(attrs))
    return makeError("attribute 'gemm_dtype' must be \"bf16\" (or absent for the operands' own type)");
  return llvm::Error::success();
}

llvm::Error requireSameDType(const TensorType &a, const TensorType &b) {
  if (a.dtype != b.dtype)
    return makeError("operand dtypes differ: {} and {}", a.str(), b.str());
  return llvm::Error::success();
}

llvm::Expected<double> requireFloatAttr(const AttrMap &attrs, llvm::StringRef key) {
  auto v = attrs.getFloat(key);
  if (!v)
    return makeError("missing float attribute '{}'", key.str());
  return *v;
}

llvm::Expected<std::vector<int64_t>> requireIntsAttr(const AttrMap &attrs, llvm::StringRef key) {
  auto v = attrs.getInts(key);
  if (!v)
    return makeError("missing integer-list attribute '{}'", key.str());
  return *v;
}

llvm::Expected<int64_t> requireIntAttr(const AttrMap &attrs, llvm::StringRef key) {
  auto v = attrs.getInt(key);
  if (!v)
    return makeError("missing integer attribute '{}'", key.str());
  return *v;
}

llvm::Expected<TypeList> inferLeaf(Operands, const AttrMap &, llvm::ArrayRef<TensorType> declared) {
  if (declared.size() != 1)
    return makeError("needs exactly one declared result type");
  if (auto err = checkTypeLimits(declared[0]))
    return std::move(err);
  return TypeList{declared[0]};
}

llvm::Expected<TypeList> inferInput(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> d) {
  return inferLeaf(ops, attrs, d);
}

llvm::Expected<TypeList> inferParam(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> d) {
  auto types = inferLeaf(ops, attrs, d);
  if (!types)
    return types.takeError();
  if (auto err = requireFloat((*types)[0], "a parameter"))
    return std::move(err);
  if (attrs.has("decay") && !attrs.getBool("decay"))
    return makeError("attribute 'decay' must be true or false");
  auto init = attrs.getString("init");
  if (!init)
    return makeError("missing string attribute 'init' (normal | zeros | ones)");
  if (*init == "normal") {
    auto std = requireFloatAttr(attrs, "std");
    if (!std)
      return std.takeError();
    if (!(*std > 0 && *std < 1e3))
      return makeError("'std' must be positive and finite, got {}", *std);
  } else if (*init != "zeros" && *init != "ones") {
    return makeError("unknown init '{}' (expected normal, zeros or ones)", *init);
  }
  if (attrs.has("whole"))
    if (auto err = checkShardOfWhole((*types)[0], attrs))
      return std::move(err);
  return types;
}

// A state the program's prologue makes (init="prologue", backends/Prologue.h: the FP8 weights
// between steps) may hold FP8; it is neither drawn nor bound.
llvm::Expected<TypeList> inferState(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> d) {
  if (attrs.getString("init") != "prologue")
    return inferParam(ops, attrs, d);
  auto types = inferLeaf(ops, attrs, d);
  if (!types)
    return types.takeError();
  if (!isFloat((*types)[0].dtype) && !isFp8((*types)[0].dtype))
    return makeError("a prologue's state must be a floating-point or FP8 tensor, got {}", (*types)[0].str());
  return types;
}

llvm::Expected<TypeList> inferConstant(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> d) {
  auto types = inferLeaf(ops, attrs, d);
  if (!types)
    return types.takeError();
  if (auto err = requireFloat((*types)[0], "a constant"))
    return std::move(err);
  auto value = requireFloatAttr(attrs, "value");
  if (!value)
    return value.takeError();
  return types;
}

llvm::Expected<TypeList> inferAssign(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  if (ops[0] != ops[1])
    return makeError("assigns {} to a {}", ops[1].str(), ops[0].str());
  return TypeList{};
}

llvm::Expected<TypeList> inferEmbedding(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  const TensorType &table = ops[0], &ids = ops[1];
  if (table.rank() != 2)
    return makeError("table must be rank 2 [vocab, dim], got {}", table.str());
  if (auto err = requireFloat(table, "table"))
    return std::move(err);
  if (ids.dtype != DType::I32 || ids.rank() < 1)
    return makeError("ids must be an i32 tensor of rank >= 1, got {}", ids.str());
  Shape shape = ids.shape;
  shape.push_back(table.dim(1));
  return TypeList{TensorType(table.dtype, shape)};
}

llvm::Expected<TypeList> inferMatMul(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &a = ops[0], &b = ops[1];
  if (auto err = checkGemmDType(attrs))
    return std::move(err);
  // FP8 GEMMs (cuBLASLt on Hopper): E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; fp32 result.
  bool fp8 = isFp8(a.dtype) || isFp8(b.dtype);
  if (fp8 && (!isFp8(a.dtype) || !isFp8(b.dtype)))
    return makeError("an FP8 GEMM needs both operands in FP8, got {} and {}", a.str(), b.str());
  if (fp8 && a.dtype == DType::F8E5M2 && b.dtype == DType::F8E5M2)
    return makeError("E5M2 x E5M2 GEMMs are not supported (cuBLASLt), got {} and {}", a.str(), b.str());
  if (!fp8) {
    if (auto err = requireFloat(a, "lhs"))
      return std::move(err);
    if (auto err = requireSameDType(a, b))
      return std::move(err);
  }
  if (a.rank() < 2)
    return makeError("lhs must have rank >= 2, got {}", a.str());
  if (b.rank() != 2 && b.rank() != a.rank())
    return makeError("rhs must be rank 2 or have the lhs's rank {}, got {}", a.rank(), b.str());
  for (unsigned i = 0; i + 2 < b.rank(); ++i)
    if (a.shape[i] != b.shape[i])
      return makeError("batch dimensions differ: {} and {}", a.str(), b.str());
  bool ta = attrs.getBool("transpose_a").value_or(false);
  bool tb = attrs.getBool("transpose_b").value_or(false);
  int64_t m = ta ? a.dim(-1) : a.dim(-2), ka = ta ? a.dim(-2) : a.dim(-1);
  int64_t kb = tb ? b.dim(-1) : b.dim(-2), n = tb ? b.dim(-2) : b.dim(-1);
  if (ka != kb)
    return makeError("contraction dimensions differ: {} vs {} ({} x {}{}{})", ka, kb, a.str(), b.str(),
                ta ? ", transpose_a" : "", tb ? ", transpose_b" : "");
  Shape shape(a.shape.begin(), a.shape.end() - 2);
  shape.push_back(m);
  shape.push_back(n);
  return TypeList{TensorType(fp8 ? DType::F32 : a.dtype, shape)};
}

llvm::Expected<TypeList> inferBroadcastBinary(Operands ops) {
  const TensorType &a = ops[0], &b = ops[1];
  if (auto err = requireFloat(a, "lhs"))
    return std::move(err);
  if (auto err = requireSameDType(a, b))
    return std::move(err);
  bool suffix = b.rank() <= a.rank() &&
                std::equal(b.shape.begin(), b.shape.end(), a.shape.end() - b.rank());
  if (!suffix)
    return makeError("shape mismatch: rhs {} must equal lhs {} or a suffix of it", b.str(), a.str());
  return TypeList{a};
}

llvm::Expected<TypeList> inferAdd(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferBroadcastBinary(ops);
}
llvm::Expected<TypeList> inferMul(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferBroadcastBinary(ops);
}

llvm::Expected<TypeList> inferUnaryFloat(const TensorType &x) {
  if (auto err = requireFloat(x, "operand"))
    return std::move(err);
  return TypeList{x};
}

llvm::Expected<TypeList> inferScale(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto factor = requireFloatAttr(attrs, "factor");
  if (!factor)
    return factor.takeError();
  return inferUnaryFloat(ops[0]);
}
llvm::Expected<TypeList> inferGelu(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferUnaryFloat(ops[0]);
}
llvm::Expected<TypeList> inferSilu(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferUnaryFloat(ops[0]);
}
llvm::Expected<TypeList> inferSwiglu(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  const TensorType &h = ops[0];
  if (auto err = requireFloat(h, "h"))
    return std::move(err);
  if (h.rank() < 1 || h.dim(-1) % 2)
    return makeError("h must be [..., 2 F] (gate | up), got {}", h.str());
  TensorType out = h;
  out.shape.back() /= 2;
  return TypeList{out};
}
llvm::Expected<TypeList> inferRope(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto theta = requireFloatAttr(attrs, "theta");
  if (!theta)
    return theta.takeError();
  if (!(*theta > 1.0))
    return makeError("attribute 'theta' must be above 1, got {}", *theta);
  const TensorType &x = ops[0];
  if (x.rank() < 2 || x.dim(-1) % 2 != 0)
    return makeError("rope needs x of rank >= 2 whose last axis (the head dimension) is even, got {}", x.str());
  if (ops.size() > 1) { // a decode step's positions, within the cache's length
    if (x.rank() < 3 || ops[1] != TensorType(DType::I32, {x.dim(0), 1}))
      return makeError("rope's positions must be i32[{}, 1], one per sequence of x [B, ..., S, Dh] ({}), got {}",
                       x.rank() ? x.dim(0) : 0, x.str(), ops[1].str());
    auto length = requireIntAttr(attrs, "length");
    if (!length)
      return length.takeError();
    if (*length < x.dim(-2) || *length > (int64_t(1) << 24))
      return makeError("rope's length (the positions it may rotate) must be from {} to 2^24, got {}", x.dim(-2),
                       *length);
  } else if (attrs.getInt("length")) {
    return makeError("rope's attribute 'length' belongs to a positions operand");
  }
  return inferUnaryFloat(x);
}

llvm::Error checkNorm(Operands ops, const AttrMap &attrs) {
  const TensorType &x = ops[0];
  if (auto err = requireFloat(x, "input"))
    return err;
  auto eps = requireFloatAttr(attrs, "eps");
  if (!eps)
    return eps.takeError();
  if (!(*eps > 0 && *eps < 1))
    return makeError("'eps' must be in (0, 1), got {}", *eps);
  if (x.rank() < 1)
    return makeError("input must have rank >= 1");
  for (size_t i = 1; i < ops.size(); ++i) {
    if (auto err = requireSameDType(x, ops[i]))
      return err;
    if (ops[i].rank() != 1 || ops[i].dim(0) != x.dim(-1))
      return makeError("norm weight must be [{}], got {}", x.dim(-1), ops[i].str());
  }
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferLayerNorm(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto err = checkNorm(ops, attrs))
    return std::move(err);
  return TypeList{ops[0]};
}
llvm::Expected<TypeList> inferRMSNorm(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  return inferLayerNorm(ops, attrs, {});
}

llvm::Expected<TypeList> inferReshape(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto shape = requireIntsAttr(attrs, "shape");
  if (!shape)
    return shape.takeError();
  TensorType result(ops[0].dtype, *shape);
  if (auto err = checkTypeLimits(result))
    return std::move(err);
  if (result.numElements() != ops[0].numElements())
    return makeError("cannot reshape {} ({} elements) to {} ({} elements)", ops[0].str(),
                ops[0].numElements(), result.str(), result.numElements());
  return TypeList{result};
}

llvm::Expected<TypeList> inferTranspose(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto perm = requireIntsAttr(attrs, "perm");
  if (!perm)
    return perm.takeError();
  const TensorType &x = ops[0];
  if (perm->size() != x.rank())
    return makeError("perm has {} entries for a rank-{} operand", perm->size(), x.rank());
  std::vector<bool> seen(x.rank(), false);
  Shape shape;
  for (int64_t p : *perm) {
    if (p < 0 || p >= int64_t(x.rank()) || seen[p])
      return makeError("perm [{}] is not a permutation of 0..{}", fmt::join(*perm, ","), x.rank() - 1);
    seen[p] = true;
    shape.push_back(x.shape[p]);
  }
  return TypeList{TensorType(x.dtype, shape)};
}

/// The axis, start and size attributes of slice and pad, with the axis checked against `x`.
struct AxisRange {
  int64_t axis, start, size;
};
llvm::Expected<AxisRange> axisRange(const AttrMap &attrs, const TensorType &x) {
  AxisRange r{};
  for (auto [key, out] : {std::pair{"axis", &r.axis}, {"start", &r.start}, {"size", &r.size}}) {
    auto v = requireIntAttr(attrs, key);
    if (!v)
      return v.takeError();
    *out = *v;
  }
  if (r.axis < 0 || r.axis >= int64_t(x.rank()))
    return makeError("axis {} out of range for {}", r.axis, x.str());
  return r;
}

llvm::Expected<TypeList> inferSlice(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &x = ops[0];
  auto r = axisRange(attrs, x);
  if (!r)
    return r.takeError();
  if (r->start < 0 || r->size <= 0 || r->start > x.shape[r->axis] - r->size)
    return makeError("slice [{}, {}) out of range for dimension {} of size {}", r->start,
                r->start + r->size, r->axis, x.shape[r->axis]);
  TensorType result = x;
  result.shape[r->axis] = r->size;
  return TypeList{result};
}

llvm::Expected<TypeList> inferConcat(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto axis = requireIntAttr(attrs, "axis");
  if (!axis)
    return axis.takeError();
  TensorType result = ops[0];
  if (auto err = requireFloat(result, "operand 0"))
    return std::move(err);
  if (*axis < 0 || *axis >= int64_t(result.rank()))
    return makeError("axis {} out of range for {}", *axis, result.str());
  for (size_t i = 1; i < ops.size(); ++i) {
    const TensorType &t = ops[i];
    bool joins = t.dtype == result.dtype && t.rank() == result.rank();
    for (unsigned d = 0; joins && d < t.rank(); ++d)
      joins = int64_t(d) == *axis || t.shape[d] == result.shape[d];
    if (!joins)
      return makeError("operand {} is {}, which does not join {} along axis {}", i, t.str(), ops[0].str(), *axis);
    result.shape[*axis] += t.shape[*axis];
  }
  return TypeList{result};
}

llvm::Expected<TypeList> inferCausalMask(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &x = ops[0];
  if (attrs.has("fill") && !attrs.getFloat("fill"))
    return makeError("attribute 'fill' must be a float");
  if (auto err = requireFloat(x, "scores"))
    return std::move(err);
  if (x.rank() < 2 || x.dim(-1) != x.dim(-2))
    return makeError("scores must be [..., T, T], got {}", x.str());
  return TypeList{x};
}

llvm::Expected<TypeList> inferRowwise(const TensorType &x) {
  if (auto err = requireFloat(x, "operand"))
    return std::move(err);
  if (x.rank() < 1)
    return makeError("operand must have rank >= 1");
  return TypeList{x};
}
llvm::Expected<TypeList> inferSoftmax(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferRowwise(ops[0]);
}
llvm::Expected<TypeList> inferLogSoftmax(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferRowwise(ops[0]);
}

/// Scores [..., T, T] and a float attribute `scale`: what masked_softmax and its gradient read.
llvm::Error checkMaskedSoftmax(const TensorType &scores, const AttrMap &attrs) {
  auto scale = requireFloatAttr(attrs, "scale");
  if (!scale)
    return scale.takeError();
  if (auto err = requireFloat(scores, "scores"))
    return err;
  if (scores.rank() < 2 || scores.dim(-1) != scores.dim(-2))
    return makeError("scores must be [..., T, T], got {}", scores.str());
  return llvm::Error::success();
}
llvm::Expected<TypeList> inferMaskedSoftmax(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto err = checkMaskedSoftmax(ops[0], attrs))
    return std::move(err);
  return TypeList{ops[0]};
}

llvm::Expected<TypeList> inferNLLLoss(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  const TensorType &logp = ops[0], &targets = ops[1];
  if (auto err = requireFloat(logp, "log-probabilities"))
    return std::move(err);
  if (logp.rank() < 2)
    return makeError("log-probabilities must be [..., vocab], got {}", logp.str());
  Shape expected(logp.shape.begin(), logp.shape.end() - 1);
  if (targets.dtype != DType::I32 || targets.shape != expected)
    return makeError("targets must be i32{}, got {}",
                TensorType(DType::I32, expected).str().substr(3), targets.str());
  return TypeList{TensorType(DType::F32, {})};
}

// Gradients.

llvm::Expected<TypeList> inferReduceTo(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto shape = requireIntsAttr(attrs, "shape");
  if (!shape)
    return shape.takeError();
  const TensorType &x = ops[0];
  if (auto err = requireFloat(x, "operand"))
    return std::move(err);
  TensorType result(x.dtype, *shape);
  bool suffix = result.rank() <= x.rank() &&
                std::equal(result.shape.begin(), result.shape.end(), x.shape.end() - result.rank());
  if (!suffix)
    return makeError("shape {} is not a suffix of {}", result.str(), x.str());
  return TypeList{result};
}

llvm::Expected<TypeList> inferPad(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &x = ops[0];
  auto r = axisRange(attrs, x);
  if (!r)
    return r.takeError();
  if (r->start < 0 || r->size <= 0 || x.shape[r->axis] > r->size - r->start)
    return makeError("cannot place {} elements at {} of a dimension of size {}", x.shape[r->axis],
                r->start, r->size);
  TensorType result = x;
  result.shape[r->axis] = r->size;
  return TypeList{result};
}

llvm::Expected<TypeList> inferEmbeddingBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &dy = ops[0], &ids = ops[1];
  auto vocab = requireIntAttr(attrs, "vocab");
  if (!vocab)
    return vocab.takeError();
  if (auto err = requireFloat(dy, "dy"))
    return std::move(err);
  Shape expected(dy.shape.begin(), dy.shape.end() - (dy.rank() ? 1 : 0));
  if (dy.rank() < 2 || ids.dtype != DType::I32 || ids.shape != expected)
    return makeError("dy {} and ids {} do not match", dy.str(), ids.str());
  return TypeList{TensorType(dy.dtype, {*vocab, dy.dim(-1)})};
}

llvm::Expected<TypeList> inferSameAsOperands(Operands ops) {
  if (auto err = requireFloat(ops[0], "dy"))
    return std::move(err);
  for (const TensorType &t : ops.drop_front())
    if (t != ops[0])
      return makeError("operand types differ: {} and {}", ops[0].str(), t.str());
  return TypeList{ops[0]};
}

llvm::Expected<TypeList> inferGeluBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto types = inferSameAsOperands(ops);
  if (types && attrs.getBool("bias_grad").value_or(false)) {
    if (ops[0].rank() < 1)
      return makeError("bias_grad needs dx of rank >= 1");
    types->push_back(TensorType(DType::F32, {ops[0].dim(-1)}));
  }
  return types;
}
llvm::Expected<TypeList> inferSiluBackward(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferSameAsOperands(ops);
}
llvm::Expected<TypeList> inferSwigluBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto forward = inferSwiglu(ops.drop_front(), attrs, {});
  if (!forward)
    return forward.takeError();
  if (ops[0] != (*forward)[0])
    return makeError("dy must be {}, swiglu's output, got {}", (*forward)[0].str(), ops[0].str());
  return TypeList{ops[1]};
}
llvm::Expected<TypeList> inferSoftmaxBackward(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferSameAsOperands(ops);
}
llvm::Expected<TypeList> inferLogSoftmaxBackward(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  return inferSameAsOperands(ops);
}
llvm::Expected<TypeList> inferMaskedSoftmaxBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto err = checkMaskedSoftmax(ops[1], attrs))
    return std::move(err);
  return inferSameAsOperands(ops);
}

llvm::Expected<TypeList> inferLayerNormBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (ops[0] != ops[1])
    return makeError("dy {} and x {} differ", ops[0].str(), ops[1].str());
  if (ops.size() > 3 && ops[3] != ops[1])
    return makeError("dres {} and x {} differ", ops[3].str(), ops[1].str());
  if (auto err = checkNorm(ops.slice(1, 2), attrs))
    return std::move(err);
  if (attrs.has("dx_sums") && !attrs.getBool("dx_sums"))
    return makeError("attribute 'dx_sums' must be true or false");
  if (attrs.getBool("dx_sums").value_or(false))
    return TypeList{ops[1], ops[2], ops[2], ops[2]};
  return TypeList{ops[1], ops[2], ops[2]};
}

llvm::Expected<TypeList> inferRMSNormBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (ops[0] != ops[1])
    return makeError("dy {} and x {} differ", ops[0].str(), ops[1].str());
  if (ops.size() > 3 && ops[3] != ops[1])
    return makeError("dres {} and x {} differ", ops[3].str(), ops[1].str());
  if (auto err = checkNorm(ops.slice(1, 2), attrs))
    return std::move(err);
  return TypeList{ops[1], ops[2]};
}

llvm::Expected<TypeList> inferNLLLossBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (ops[0] != kScalar)
    return makeError("dloss must be f32[], got {}", ops[0].str());
  auto loss = inferNLLLoss(ops.drop_front(), attrs, {});
  if (!loss)
    return loss.takeError();
  return TypeList{ops[1]};
}

// Optimizer.

llvm::Expected<TypeList> inferSumSquares(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  if (auto err = requireFloat(ops[0], "operand"))
    return std::move(err);
  return TypeList{kScalar};
}

llvm::Expected<TypeList> inferClipScale(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto maxNorm = requireFloatAttr(attrs, "max_norm");
  if (!maxNorm)
    return maxNorm.takeError();
  if (!(*maxNorm >= 0))
    return makeError("'max_norm' must be >= 0, got {}", *maxNorm);
  if (ops[0] != kScalar)
    return makeError("operand must be f32[], got {}", ops[0].str());
  return TypeList{kScalar};
}

llvm::Expected<TypeList> inferLRSchedule(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  for (const char *key : {"lr", "min_lr"})
    if (auto v = requireFloatAttr(attrs, key); !v)
      return v.takeError();
  for (const char *key : {"warmup", "steps"})
    if (auto v = requireIntAttr(attrs, key); !v)
      return v.takeError();
  if (ops[0] != TensorType(DType::I32, {}))
    return makeError("step must be i32[], got {}", ops[0].str());
  return TypeList{kScalar};
}

llvm::Expected<TypeList> inferAdamW(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  for (const char *key : {"beta1", "beta2", "eps", "weight_decay"})
    if (auto v = requireFloatAttr(attrs, key); !v)
      return v.takeError();
  const TensorType &p = ops[0];
  if (auto err = requireFloat(p, "param"))
    return std::move(err);
  for (int i = 1; i < 4; ++i)
    if (ops[i] != p)
      return makeError("param, grad, m and v must have one type: {} vs {}", p.str(), ops[i].str());
  if (ops[4] != kScalar || ops[5] != kScalar)
    return makeError("lr and clip must be f32[]");
  if (ops[6] != TensorType(DType::I32, {}))
    return makeError("step must be i32[], got {}", ops[6].str());
  return TypeList{p, p, p};
}

// Fused ops.

using InferFn = llvm::Expected<TypeList> (*)(Operands, const AttrMap &, llvm::ArrayRef<TensorType>);
const InferFn kInferFns[] = {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) &infer##Enum,
#include "ir/Ops.def"
};

} // namespace tgc::infer

namespace tgc {

using infer::kInferFns;

llvm::Error checkTypeLimits(const TensorType &type) {
  if (type.rank() > kMaxRank)
    return makeError("rank {} exceeds the limit of {}", type.rank(), kMaxRank);
  int64_t elements = 1;
  for (int64_t d : type.shape) {
    if (d <= 0)
      return makeError("dimension {} in {} must be positive", d, type.str());
    if (d > kMaxDim)
      return makeError("dimension {} in {} exceeds the limit of {}", d, type.str(), kMaxDim);
    if (elements > kMaxElements / d)
      return makeError("{} has more than {} elements", type.str(), kMaxElements);
    elements *= d;
  }
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferResultTypes(OpKind kind, llvm::ArrayRef<TensorType> operands,
                                          const AttrMap &attrs,
                                          llvm::ArrayRef<TensorType> declared) {
  const OpInfo &info = opInfo(kind);
  if (operands.size() < info.minOperands || operands.size() > info.maxOperands) {
    if (info.minOperands == info.maxOperands)
      return makeError("expects {} operand{}, got {}", info.minOperands,
                  info.minOperands == 1 ? "" : "s", operands.size());
    return makeError("expects {} to {} operands, got {}", info.minOperands, info.maxOperands,
                operands.size());
  }
  auto types = kInferFns[static_cast<unsigned>(kind)](operands, attrs, declared);
  if (!types)
    return types.takeError();
  for (const TensorType &t : *types)
    if (auto err = checkTypeLimits(t))
      return std::move(err);
  return types;
}

llvm::Expected<TypeList> inferResultTypes(OpKind kind, llvm::ArrayRef<Value *> operands,
                                          const AttrMap &attrs) {
  llvm::SmallVector<TensorType, 4> types;
  for (Value *v : operands)
    types.push_back(v->type());
  return inferResultTypes(kind, types, attrs);
}

} // namespace tgc
