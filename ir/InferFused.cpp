// Type rules of the fused ops (LayerNorm+Linear/MLP, attention, the residual norm, the bias
// epilogues, cross-entropy and their gradients), FP8 scaling and the generation step.
#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "ir/InferRules.h"
#include "support/Error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc::infer {

llvm::Expected<std::string> requireChoice(const AttrMap &attrs, llvm::StringRef key,
                                          std::initializer_list<const char *> choices) {
  auto v = attrs.getString(key);
  if (!v)
    return makeError("missing string attribute '{}'", key.str());
  for (const char *c : choices)
    if (*v == c)
      return *v;
  return makeError("attribute '{}' has the unknown value '{}'", key.str(), *v);
}

/// Checks the norm part (x, gamma, [beta]) of a fused norm op laid out by `layout`.
llvm::Error checkFusedNorm(Operands ops, const AttrMap &attrs, const FusedLayout &layout) {
  if (auto norm = requireChoice(attrs, "norm", {"layer_norm", "rms_norm"}); !norm)
    return norm.takeError();
  if (auto err = checkGemmDType(attrs))
    return err;
  if (attrs.has("bias") && !attrs.getBool("bias"))
    return makeError("attribute 'bias' must be true or false");
  if (ops.size() != layout.numOperands())
    return makeError("expects {} operands for its attributes, got {}", layout.numOperands(), ops.size());
  llvm::SmallVector<TensorType, 3> norm{ops[layout[FusedSlot::X]], ops[layout[FusedSlot::Gamma]]};
  if (layout.has(FusedSlot::Beta))
    norm.push_back(ops[layout[FusedSlot::Beta]]);
  return checkNorm(norm, attrs);
}

/// A linear weight [out, in] applied to `in` features, and its optional bias [out].
llvm::Expected<int64_t> checkLinear(Operands ops, const FusedLayout &layout, FusedSlot w,
                                    FusedSlot b, const TensorType &x, int64_t in) {
  const TensorType &weight = ops[layout[w]];
  if (weight.dtype != x.dtype || weight.rank() != 2 || weight.dim(1) != in)
    return makeError("weight must be {}[out, {}], got {}", dtypeName(x.dtype).str(), in, weight.str());
  if (layout.has(b) && ops[layout[b]] != TensorType(x.dtype, {weight.dim(0)}))
    return makeError("bias must be [{}], got {}", weight.dim(0), ops[layout[b]].str());
  return weight.dim(0);
}

llvm::Expected<TypeList> inferLayerNormLinear(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  FusedLayout layout(OpKind::LayerNormLinear, attrs);
  if (auto err = checkFusedNorm(ops, attrs, layout))
    return std::move(err);
  const TensorType &x = ops[layout[FusedSlot::X]];
  auto out = checkLinear(ops, layout, FusedSlot::W1, FusedSlot::B1, x, x.dim(-1));
  if (!out)
    return out.takeError();
  TensorType y = x;
  y.shape.back() = *out;
  if (attrs.getBool("return_norm").value_or(false))
    return TypeList{y, x};
  return TypeList{y};
}

llvm::Expected<TypeList> inferLayerNormMLP(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  FusedLayout layout(OpKind::LayerNormMLP, attrs);
  if (auto err = checkFusedNorm(ops, attrs, layout))
    return std::move(err);
  auto activation = requireChoice(attrs, "activation", {"gelu", "swiglu"});
  if (!activation)
    return activation.takeError();
  const TensorType &x = ops[layout[FusedSlot::X]];
  auto hidden = checkLinear(ops, layout, FusedSlot::W1, FusedSlot::B1, x, x.dim(-1));
  if (!hidden)
    return hidden.takeError();
  int64_t ffn = *hidden;
  if (*activation == "swiglu") {
    if (ffn % 2)
      return makeError("swiglu needs an even fc1 width ([gate | up]), got {}", ffn);
    ffn /= 2;
  }
  auto out = checkLinear(ops, layout, FusedSlot::W2, FusedSlot::B2, x, ffn);
  if (!out)
    return out.takeError();
  if (*out != x.dim(-1))
    return makeError("fc2 must map back to {} features, got {}", x.dim(-1), *out);
  TensorType h = x;
  h.shape.back() = *hidden;
  return TypeList{x, h};
}

/// The attributes of the attention ops: gemm_dtype, scale, and heads (dividing d_model where
/// it is given: the query width the op's operands fix).
llvm::Error checkAttentionAttrs(const AttrMap &attrs, std::optional<int64_t> dModel = std::nullopt) {
  if (auto err = checkGemmDType(attrs))
    return err;
  auto heads = requireIntAttr(attrs, "heads");
  if (!heads)
    return heads.takeError();
  if (auto scale = requireFloatAttr(attrs, "scale"); !scale)
    return scale.takeError();
  if (*heads < 1 || (dModel && *dModel % *heads))
    return makeError("heads ({}) must divide d_model ({})", *heads, dModel.value_or(0));
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferAttention(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &qkv = ops[0];
  if (auto err = requireFloat(qkv, "qkv"))
    return std::move(err);
  if (auto err = checkAttentionAttrs(attrs)) // (the query width follows from the heads here)
    return std::move(err);
  AttentionHeads h = attentionHeads(attrs);
  if (h.kvHeads < 1 || h.heads % h.kvHeads)
    return makeError("kv_heads ({}) must divide heads ({})", h.kvHeads, h.heads);
  // qkv [B, T, (H + 2 KV) Dh]: the queries' D = H Dh, then the keys' and the values' KV Dh.
  int64_t per = h.heads + 2 * h.kvHeads;
  if (qkv.rank() != 3 || qkv.dim(-1) % per)
    return makeError("qkv must be [batch, seq, (heads + 2 kv_heads) head_dim] for {} heads and {} KV heads, got {}",
                     h.heads, h.kvHeads, qkv.str());
  int64_t dh = qkv.dim(-1) / per, d = h.heads * dh;
  if (h.ropeTheta && (dh % 2 || !(*h.ropeTheta > 1.0)))
    return makeError("rope_theta ({}) must exceed 1 and the head dimension ({}) be even", *h.ropeTheta, dh);
  TypeList types{TensorType(qkv.dtype, {qkv.dim(0), qkv.dim(1), d}),
                 TensorType(qkv.dtype, {qkv.dim(0), h.heads, qkv.dim(1)})};
  if (isHeadMajor(attrs))
    types.push_back(attentionHeadsType(qkv.dtype, h, qkv.dim(0), qkv.dim(1), dh));
  return types;
}

/// The positions operand of the generation ops: one per sequence, i32[B, 1].
static llvm::Error checkPositions(const TensorType &positions, int64_t batch) {
  if (positions != TensorType(DType::I32, {batch, 1}))
    return makeError("positions must be i32[{}, 1], one per sequence, got {}", batch, positions.str());
  return llvm::Error::success();
}

/// rope_theta on the cache ops (fuse-cache-rope): heads of an even width, a base above 1.
static llvm::Error checkCacheRope(const AttrMap &attrs, int64_t rowWidth, int64_t kvHeads) {
  std::optional<double> theta = attrs.getFloat("rope_theta");
  if (!theta)
    return llvm::Error::success();
  if (kvHeads < 1 || rowWidth % kvHeads || (rowWidth / kvHeads) % 2 || !(*theta > 1.0))
    return makeError("rope_theta ({}) must exceed 1 and the cache's {} KV heads share its row of {} in heads of "
                     "an even width",
                     *theta, kvHeads, rowWidth);
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferKvWrite(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &k = ops[0], &v = ops[1], &qkv = ops[2];
  if (auto err = requireFloat(k, "k_cache"))
    return std::move(err);
  if (k.rank() != 3 || k != v)
    return makeError("the caches must be one [B, T, D] type, got {} and {}", k.str(), v.str());
  // qkv [B, S, Dq + 2C]: the queries, then keys and values as wide as a cache row (C = D, or
  // kv_heads * head_dim under grouped-query attention, with Dq >= C).
  if (qkv.rank() != 3 || qkv.dtype != k.dtype || qkv.dim(0) != k.dim(0) || qkv.dim(2) < 3 * k.dim(2) ||
      qkv.dim(1) > k.dim(1))
    return makeError("qkv [B, S, Dq + 2D] with S <= T and Dq >= D does not match the caches {}: {}", k.str(),
                     qkv.str());
  if (ops.size() > 3)
    if (auto err = checkPositions(ops[3], k.dim(0)))
      return std::move(err);
  if (auto err = checkCacheRope(attrs, k.dim(2), attrs.getInt("kv_heads").value_or(0)))
    return std::move(err);
  return TypeList{k, v};
}

llvm::Expected<TypeList> inferDecodeAttention(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  const TensorType &qkv = ops[0], &k = ops[1], &v = ops[2];
  if (auto err = requireFloat(qkv, "qkv"))
    return std::move(err);
  // qkv [B, S, Dq + 2C] (S queries a sequence, S <= T), the caches [B, T, C]: C = Dq, or
  // kv_heads of the heads' width.
  int64_t queries = qkv.rank() == 3 && k.rank() == 3 ? qkv.dim(2) - 2 * k.dim(2) : 0;
  int64_t S = qkv.rank() == 3 ? qkv.dim(1) : 0;
  if (k.rank() != 3 || k != v || queries < k.dim(2) || S < 1 || S > k.dim(1) ||
      qkv != TensorType(k.dtype, {k.dim(0), S, queries + 2 * k.dim(2)}))
    return makeError("qkv [B, S, Dq + 2D] and the caches [B, T, D] do not match: {}, {} and {}", qkv.str(),
                     k.str(), v.str());
  if (writesCache(attrs) && S != 1)
    return makeError("write_cache writes one row a sequence: qkv must be [B, 1, ...], got {}", qkv.str());
  if (auto err = checkAttentionAttrs(attrs, queries))
    return std::move(err);
  int64_t heads = *attrs.getInt("heads"), kvHeads = attrs.getInt("kv_heads").value_or(heads);
  if (kvHeads < 1 || heads % kvHeads || k.dim(2) != kvHeads * (queries / heads))
    return makeError("kv_heads ({}) must divide heads ({}) and the caches hold kv_heads x {}, got {}", kvHeads, heads,
                     queries / heads, k.dim(2));
  if (auto err = checkPositions(ops[3], k.dim(0)))
    return std::move(err);
  if (auto err = checkCacheRope(attrs, k.dim(2), kvHeads))
    return std::move(err);
  TensorType out(k.dtype, {k.dim(0), S, queries});
  if (writesCache(attrs))
    return TypeList{out, k, v};
  return TypeList{out};
}

llvm::Expected<TypeList> inferArgmax(Operands ops, const AttrMap &, llvm::ArrayRef<TensorType>) {
  const TensorType &x = ops[0];
  if (auto err = requireFloat(x, "x"))
    return std::move(err);
  if (x.rank() < 1 || x.dim(-1) < 1)
    return makeError("x must have a non-empty last axis, got {}", x.str());
  return TypeList{TensorType(DType::I32, Shape(x.shape.begin(), x.shape.end() - 1))};
}

llvm::Expected<TypeList> inferSample(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> results) {
  auto rows = inferArgmax(ops.take_front(), attrs, results);
  if (!rows)
    return rows.takeError();
  const TensorType &counters = ops[1], &sampling = ops[2], &seed = ops[3];
  if (counters.dtype != DType::I32 || counters.shape != rows->front().shape)
    return makeError("counters must be {}, one per row, got {}", rows->front().str(), counters.str());
  if (sampling.dtype != DType::F32 || sampling.shape != Shape{3})
    return makeError("sampling must be f32[3] (temperature, top_p, top_k), got {}", sampling.str());
  if (seed.dtype != DType::I32 || seed.shape != Shape{2})
    return makeError("seed must be i32[2], got {}", seed.str());
  if (auto stride = attrs.getInt("stride"); stride && *stride < 0)
    return makeError("stride must be >= 0, got {}", *stride);
  return rows;
}

llvm::Expected<TypeList> inferResidualNorm(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto norm = requireChoice(attrs, "norm", {"layer_norm", "rms_norm"}); !norm)
    return norm.takeError();
  size_t expected = isLayerNorm(attrs) ? 4 : 3;
  if (ops.size() != expected)
    return makeError("expects {} operands for its norm, got {}", expected, ops.size());
  if (ops[0] != ops[1])
    return makeError("residual operands differ: {} and {}", ops[0].str(), ops[1].str());
  if (auto err = checkNorm(ops.drop_front(), attrs))
    return std::move(err);
  return TypeList{ops[0], ops[0]};
}

/// x [..., K] @ weight [N, K]^T + bias [N]: the result type of the bias epilogues.
llvm::Expected<TensorType> inferLinearWithBias(Operands ops, const AttrMap &attrs) {
  const TensorType &x = ops[0], &w = ops[1], &bias = ops[2];
  if (auto err = checkGemmDType(attrs))
    return std::move(err);
  // FP8 operands (fuse-fp8-bias: an FP8 product and its bias add): fp32 bias and result, the
  // operand types matmul's.
  bool fp8 = isFp8(x.dtype) || isFp8(w.dtype);
  if (!fp8)
    if (auto err = requireFloat(x, "input"))
      return std::move(err);
  if (x.rank() < 2 || w.rank() != 2 || (!fp8 && w.dtype != x.dtype) || w.dim(1) != x.dim(-1))
    return makeError("x [..., K] and weight [N, K] do not match: {} and {}", x.str(), w.str());
  if (fp8) { // the FP8 type pairs cuBLASLt multiplies, as matmul checks them
    AttrMap transposed = attrs;
    transposed.set("transpose_b", true);
    if (auto product = inferMatMul({x, w}, transposed, {}); !product)
      return product.takeError();
  }
  DType out = fp8 ? DType::F32 : x.dtype;
  if (bias != TensorType(out, {w.dim(0)}))
    return makeError("bias must be {}[{}], got {}", dtypeName(out).str(), w.dim(0), bias.str());
  TensorType y = x;
  y.dtype = out;
  y.shape.back() = w.dim(0);
  return y;
}
llvm::Expected<TypeList> inferMatMulBias(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto y = inferLinearWithBias(ops, attrs);
  if (!y)
    return y.takeError();
  return TypeList{*y};
}
llvm::Expected<TypeList> inferMatMulBiasGelu(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto y = inferLinearWithBias(ops, attrs);
  if (!y)
    return y.takeError();
  return TypeList{*y, *y};
}

llvm::Expected<TypeList> inferMatMulDGelu(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto y = inferMatMul(ops.take_front(2), attrs, {});
  if (!y)
    return y.takeError();
  if ((*y)[0].dtype != DType::F32 || ops[2] != (*y)[0])
    return makeError("h must be the product's type {}, got {}", (*y)[0].str(), ops[2].str());
  return y;
}

llvm::Expected<TypeList> inferResidualNormLinear(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto norm = requireChoice(attrs, "norm", {"layer_norm", "rms_norm"}); !norm)
    return norm.takeError();
  if (attrs.has("bias") && !attrs.getBool("bias"))
    return makeError("attribute 'bias' must be true or false");
  if (attrs.has("activation"))
    if (auto activation = requireChoice(attrs, "activation", {"gelu", "swiglu"}); !activation)
      return activation.takeError();
  bool bias = attrs.getBool("bias").value_or(false), swiglu = attrs.getString("activation") == "swiglu";
  if (swiglu && bias)
    return makeError("activation \"swiglu\" takes a product without a bias");
  size_t normOperands = isLayerNorm(attrs) ? 4 : 3, expected = normOperands + 1 + bias;
  if (ops.size() != expected)
    return makeError("expects {} operands for its attributes, got {}", expected, ops.size());
  auto sum = inferResidualNorm(ops.take_front(normOperands), attrs, {});
  if (!sum)
    return sum.takeError();
  llvm::SmallVector<TensorType, 3> linear{(*sum)[1], ops[normOperands]};
  if (bias)
    linear.push_back(ops[normOperands + 1]);
  if (bias) {
    auto y = inferLinearWithBias(linear, attrs);
    if (!y)
      return y.takeError();
    return TypeList{(*sum)[0], *y};
  }
  AttrMap product = attrs;
  product.set("transpose_b", true);
  auto y = inferMatMul(linear, product, {});
  if (!y)
    return y.takeError();
  if (!swiglu)
    return TypeList{(*sum)[0], (*y)[0]};
  // SwiGLU of the product's halves [gate | up]: half as wide.
  TensorType h = (*y)[0];
  if (h.dim(-1) % 2)
    return makeError("activation \"swiglu\" needs an even number of outputs, got {}", h.str());
  h.shape.back() /= 2;
  return TypeList{(*sum)[0], h};
}

llvm::Expected<TypeList> inferCrossEntropy(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto types = inferNLLLoss(ops.take_front(2), attrs, {});
  if (!types || ops.size() < 3)
    return types;
  if (ops[2] != TensorType(DType::F32, {}))
    return makeError("dloss must be f32[], got {}", ops[2].str());
  types->push_back(ops[0]);
  return types;
}

/// Backward ops: (dy, [dnorm] or [h], forward operands) -> gradients of the forward operands.
llvm::Expected<TypeList> inferFusedBackward(OpKind forwardKind, OpKind kind, Operands ops,
                                            const AttrMap &attrs) {
  FusedLayout layout(kind, attrs);
  if (ops.size() != layout.numOperands())
    return makeError("expects {} operands for its attributes, got {}", layout.numOperands(), ops.size());
  Operands forward = ops.drop_front(layout.forwardBegin());
  auto results = forwardKind == OpKind::LayerNormLinear ? inferLayerNormLinear(forward, attrs, {})
                                                        : inferLayerNormMLP(forward, attrs, {});
  if (!results)
    return results.takeError();
  if (ops[layout[FusedSlot::Dy]] != (*results)[0])
    return makeError("dy must be {}, got {}", (*results)[0].str(), ops[layout[FusedSlot::Dy]].str());
  if (layout.has(FusedSlot::DNorm) && ops[layout[FusedSlot::DNorm]] != forward[0])
    return makeError("dnorm must be {}, got {}", forward[0].str(), ops[layout[FusedSlot::DNorm]].str());
  if (layout.has(FusedSlot::Hidden) && ops[layout[FusedSlot::Hidden]] != (*results)[1])
    return makeError("h must be {}, got {}", (*results)[1].str(), ops[layout[FusedSlot::Hidden]].str());
  return TypeList(forward.begin(), forward.end());
}

llvm::Expected<TypeList> inferLayerNormLinearBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  return inferFusedBackward(OpKind::LayerNormLinear, OpKind::LayerNormLinearBackward, ops, attrs);
}
llvm::Expected<TypeList> inferLayerNormMLPBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  return inferFusedBackward(OpKind::LayerNormMLP, OpKind::LayerNormMLPBackward, ops, attrs);
}

llvm::Expected<TypeList> inferAttentionBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  TensorType qkv = ops[1];
  if (isHeadMajor(attrs)) { // the head-major copy -> the packed [B, T, (H + 2 KV) Dh] it holds
    const TensorType &t = ops[1];
    AttentionHeads h = attentionHeads(attrs);
    int64_t per = h.heads + 2 * h.kvHeads;
    if (!h.grouped() && (t.rank() != 5 || t.dim(0) != 3))
      return makeError("head-major qkv must be [3, batch, heads, seq, head_dim], got {}", t.str());
    if (h.grouped() && (t.rank() != 3 || h.heads < 1 || t.dim(0) % per))
      return makeError("head-major qkv must be [(heads + 2 kv_heads) batch, seq, head_dim], got {}", t.str());
    qkv = h.grouped() ? TensorType(t.dtype, {t.dim(0) / per, t.dim(1), per * t.dim(2)})
                      : TensorType(t.dtype, {t.dim(1), t.dim(3), 3 * t.dim(2) * t.dim(4)});
  }
  auto forward = inferAttention(qkv, attrs, {});
  if (!forward)
    return forward.takeError();
  if (ops[0] != (*forward)[0])
    return makeError("dout must be {}, got {}", (*forward)[0].str(), ops[0].str());
  if (ops[2] != (*forward)[0])
    return makeError("out must be {}, got {}", (*forward)[0].str(), ops[2].str());
  if (ops[3] != (*forward)[1])
    return makeError("lse must be {}, got {}", (*forward)[1].str(), ops[3].str());
  if (isHeadMajor(attrs) && ops[1] != (*forward)[2])
    return makeError("head-major qkv must be {}, got {}", (*forward)[2].str(), ops[1].str());
  return TypeList{qkv};
}

/// The attention an FP8 attention computes: its E4M3 q [B, T, 3D] (one KV head a query head, no
/// rope: what cuDNN's FP8 attention takes), its state scalars from `first` on, and the types of
/// the attention's out and lse (f32: BF16 values).
static llvm::Expected<TypeList> fp8AttentionTypes(Operands ops, size_t first, const AttrMap &attrs) {
  const TensorType &q = ops[first];
  if (q.dtype != DType::F8E4M3)
    return makeError("q must be the E4M3 packed qkv, got {}", q.str());
  AttentionHeads h = attentionHeads(attrs);
  if (h.grouped() || h.ropeTheta)
    return makeError("FP8 attention takes neither kv_heads nor rope_theta");
  auto types = inferAttention(TensorType(DType::F32, q.shape), attrs, {});
  if (!types)
    return types.takeError();
  for (size_t i = first + 1; i < ops.size(); ++i)
    if (ops[i] != TensorType(DType::F32, {}))
      return makeError("operand {} (a scale) must be f32[], got {}", i, ops[i].str());
  return types;
}

llvm::Expected<TypeList> inferFp8Attention(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (isHeadMajor(attrs))
    return makeError("FP8 attention reads q in place: no head_major");
  auto types = fp8AttentionTypes(ops, 0, attrs);
  if (!types)
    return types.takeError();
  types->push_back(TensorType(DType::F32, {})); // amax_s
  return types;
}

llvm::Expected<TypeList> inferFp8AttentionBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  // (dout_q, q, out, lse, scales...): the scales from operand 4 on; q's type checked first.
  llvm::SmallVector<TensorType, 8> rest{ops[1]};
  rest.append(ops.begin() + 4, ops.end());
  auto forward = fp8AttentionTypes(rest, 0, attrs);
  if (!forward)
    return forward.takeError();
  const TensorType &dout = ops[0];
  if (!isFp8(dout.dtype) || dout.shape != (*forward)[0].shape)
    return makeError("dout must be FP8 {}, got {}", TensorType(DType::F8E5M2, (*forward)[0].shape).str(), dout.str());
  if (ops[2] != (*forward)[0])
    return makeError("out must be {}, got {}", (*forward)[0].str(), ops[2].str());
  if (ops[3] != (*forward)[1])
    return makeError("lse must be {}, got {}", (*forward)[1].str(), ops[3].str());
  return TypeList{TensorType(DType::F32, ops[1].shape), TensorType(DType::F32, {})};
}

llvm::Expected<TypeList> inferCrossEntropyBackward(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  return inferNLLLossBackward(ops, attrs, {});
}

} // namespace tgc::infer
