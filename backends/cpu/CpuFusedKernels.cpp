// CPU reference of the fused ops, composed from the kernels of the ops each one replaces, in
// the same order, so that a fused and an unfused program compute the same function. The fused
// gradients recompute what their forward op did not keep (the normalised input, activations,
// attention probabilities), as the GPU does.
#include "backends/cpu/CpuKernels.h"
#include "backends/cpu/Fp8Attention.h"
#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "ir/Rope.h"
#include "support/Error.h"
#include "support/Numerics.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace tgc::cpu {

namespace {

using EvalFn = llvm::Error (*)(const AttrMap &, Operands, Results);

TensorType withLastDim(TensorType type, int64_t last) {
  type.shape.back() = last;
  return type;
}

/// One kernel on fresh output of `type`. The kernels used here only fail on bad ids, which
/// none of these calls passes.
Tensor apply(EvalFn kernel, const AttrMap &a, std::initializer_list<const Tensor *> in,
             const TensorType &type) {
  Tensor out = Tensor::zeros(type);
  llvm::cantFail(kernel(a, in, llvm::MutableArrayRef<Tensor>(out)));
  return out;
}

/// A GEMM inside a fused op: the layout given, and the fused op's gemm_dtype.
Tensor gemm(const AttrMap &fused, MatMulLayout layout, const Tensor &a, const Tensor &b, const TensorType &type) {
  AttrMap flags = matmulAttrs(layout);
  copyGemmPrecision(fused, flags);
  return apply(evalMatMul, flags, {&a, &b}, type);
}

/// x @ weight^T (+ bias), weight stored [out, in]: the builder's linear layer.
Tensor linear(const AttrMap &fused, const Tensor &x, const Tensor &weight, const Tensor *bias) {
  TensorType type = withLastDim(x.type, weight.type.dim(0));
  if (isFp8(x.type.dtype)) // FP8 operands hold what the GEMM reads; the product is fp32
    type.dtype = DType::F32;
  Tensor y = gemm(fused, kTransposedWeight, x, weight, type);
  return bias ? apply(evalAdd, {}, {&y, bias}, y.type) : y;
}

Tensor norm(const AttrMap &a, const Tensor &x, const Tensor &gamma, const Tensor *beta) {
  if (beta)
    return apply(evalLayerNorm, a, {&x, &gamma, beta}, x.type);
  return apply(evalRMSNorm, a, {&x, &gamma}, x.type);
}

/// Rows of a [..., n] tensor as a [rows, n] matrix (the same data).
Tensor asRows(const Tensor &t) {
  Tensor r = t;
  int64_t n = t.type.dim(-1);
  r.type = TensorType(t.type.dtype, {t.size() / n, n});
  return r;
}

/// The gradients of a linear layer y = x @ w^T + b, as autodiff writes them: dx = dy @ w,
/// dw = dy_rows^T @ x_rows, db = the column sums of dy.
struct LinearGrads {
  Tensor dx, dw, db;
};
LinearGrads linearBackward(const AttrMap &fused, const Tensor &dy, const Tensor &x,
                           const Tensor &w, bool bias) {
  LinearGrads g;
  g.dx = gemm(fused, {}, dy, w, x.type);
  Tensor dyRows = asRows(dy), xRows = asRows(x);
  g.dw = gemm(fused, {true, false}, dyRows, xRows, w.type);
  if (bias)
    g.db = apply(evalReduceTo, attrs({{"shape", std::vector<int64_t>{w.type.dim(0)}}}), {&dy},
                 TensorType(dy.type.dtype, {w.type.dim(0)}));
  return g;
}

/// dx, dgamma, [dbeta] of the norm at x.
void normBackward(const AttrMap &a, const Tensor &dn, const Tensor &x, const Tensor &gamma,
                  bool layerNorm, Tensor &dx, Tensor &dgamma, Tensor *dbeta) {
  if (layerNorm) {
    Tensor outs[3] = {Tensor::zeros(x.type), Tensor::zeros(gamma.type), Tensor::zeros(gamma.type)};
    llvm::cantFail(evalLayerNormBackward(a, {&dn, &x, &gamma}, outs));
    dx = std::move(outs[0]);
    dgamma = std::move(outs[1]);
    *dbeta = std::move(outs[2]);
    return;
  }
  Tensor outs[2] = {Tensor::zeros(x.type), Tensor::zeros(gamma.type)};
  llvm::cantFail(evalRMSNormBackward(a, {&dn, &x, &gamma}, outs));
  dx = std::move(outs[0]);
  dgamma = std::move(outs[1]);
}

const Tensor *slot(Operands in, const FusedLayout &layout, FusedSlot s) {
  return layout.has(s) ? in[layout[s]] : nullptr;
}

/// Slices [start, start + size) of the last axis.
Tensor lastAxisSlice(const Tensor &t, int64_t start, int64_t size) {
  int64_t axis = int64_t(t.type.rank()) - 1;
  return apply(evalSlice, attrs({{"axis", axis}, {"start", start}, {"size", size}}), {&t},
               withLastDim(t.type, size));
}

/// The SwiGLU or GELU activation of fc1's output h.
Tensor activate(const Tensor &h, bool swiglu) {
  if (!swiglu)
    return apply(evalGelu, {}, {&h}, h.type);
  int64_t f = h.type.dim(-1) / 2;
  Tensor gate = lastAxisSlice(h, 0, f), up = lastAxisSlice(h, f, f);
  Tensor act = apply(evalSilu, {}, {&gate}, gate.type);
  return apply(evalMul, {}, {&act, &up}, act.type);
}

/// Gradient of the activation with respect to h.
Tensor activateBackward(const Tensor &da, const Tensor &h, bool swiglu) {
  if (!swiglu)
    return apply(evalGeluBackward, {}, {&da, &h}, h.type);
  int64_t f = h.type.dim(-1) / 2, axis = int64_t(h.type.rank()) - 1;
  Tensor gate = lastAxisSlice(h, 0, f), up = lastAxisSlice(h, f, f);
  Tensor act = apply(evalSilu, {}, {&gate}, gate.type);
  Tensor dact = apply(evalMul, {}, {&da, &up}, da.type);
  Tensor dup = apply(evalMul, {}, {&da, &act}, da.type);
  Tensor dgate = apply(evalSiluBackward, {}, {&dact, &gate}, gate.type);
  Tensor placedGate = apply(evalPad, attrs({{"axis", axis}, {"start", int64_t(0)}, {"size", 2 * f}}),
                            {&dgate}, h.type);
  Tensor placedUp = apply(evalPad, attrs({{"axis", axis}, {"start", f}, {"size", 2 * f}}), {&dup},
                          h.type);
  return apply(evalAdd, {}, {&placedGate, &placedUp}, h.type);
}

/// The intermediate tensors of causal attention on a packed qkv, as the unfused graph has them.
struct AttentionParts {
  Tensor q;       // [B, H, T, Dh], rotated under rope_theta
  Tensor k, v;    // [B, KV, T, Dh], k rotated under rope_theta
  Tensor probs;   // [B, H, T, T]
  Tensor lse;     // [B, H, T]: each query's log-sum-exp of its masked, scaled scores
};

const std::vector<int64_t> kSwapHeads{0, 2, 1, 3};

/// The shape of one attention op's tensors: AttentionHeads plus batch, length, head dimension.
struct AttentionDims {
  AttentionHeads h;
  RopeOptions rope; // under rope_theta
  int64_t B, T, Dh;
  DType dtype;
  TensorType heads(int64_t count, int64_t rows) const { return TensorType(dtype, {B, count, rows, Dh}); }
  /// A [B, H, T, X] tensor seen as [B, KV, G T, X]: the G query heads of a KV head are
  /// consecutive, so one batched product per KV head takes them all (as the builder's graph).
  TensorType groupedType(int64_t last) const { return TensorType(dtype, {B, h.kvHeads, h.group() * T, last}); }
  Tensor grouped(Tensor t) const {
    t.type = groupedType(t.type.dim(3));
    return t;
  }
  Tensor ungrouped(Tensor t) const {
    t.type = TensorType(dtype, {B, h.heads, T, t.type.dim(3)});
    return t;
  }
};

AttentionDims attentionDims(const AttrMap &a, const TensorType &qkv) {
  AttentionHeads h = attentionHeads(a);
  return {h, ropeOptions(a, "rope_theta"), qkv.dim(0), qkv.dim(1), qkv.dim(2) / (h.heads + 2 * h.kvHeads), qkv.dtype};
}

/// Heads [start, start + count) of rows [B, T, X] (X a multiple of Dh), head-major
/// [B, count, T, Dh].
Tensor headsOf(const AttentionDims &s, const Tensor &rows, int64_t start, int64_t count) {
  Tensor part = lastAxisSlice(rows, start * s.Dh, count * s.Dh);
  part.type = TensorType(s.dtype, {s.B, s.T, count, s.Dh}); // reshape: same data
  return apply(evalTranspose, attrs({{"perm", kSwapHeads}}), {&part}, s.heads(count, s.T));
}

/// Head-major [B, H, T, Dh] as rows `type` [B, T, H Dh].
Tensor rowsOf(const AttentionDims &s, const Tensor &heads, const TensorType &type) {
  Tensor rows = apply(evalTranspose, attrs({{"perm", kSwapHeads}}), {&heads},
                      TensorType(type.dtype, {s.B, s.T, heads.type.dim(1), s.Dh}));
  rows.type = type; // reshape [B, T, H, Dh] -> [B, T, H Dh]
  return rows;
}

/// The gradients of q, k and v, head-major, as the packed dqkv `qkvType`: each back to rows,
/// placed at q | k | v.
Tensor packedGradient(const AttentionDims &s, std::initializer_list<const Tensor *> grads, const TensorType &qkvType) {
  Tensor dqkv = Tensor::zeros(qkvType);
  int64_t start = 0, width = qkvType.dim(2);
  for (const Tensor *d : grads) {
    int64_t count = d->type.dim(1);
    Tensor merged = rowsOf(s, *d, TensorType(s.dtype, {s.B, s.T, count * s.Dh}));
    Tensor placed = apply(evalPad, attrs({{"axis", int64_t(2)}, {"start", start}, {"size", width}}), {&merged},
                          qkvType);
    dqkv = apply(evalAdd, {}, {&dqkv, &placed}, qkvType);
    start += count * s.Dh;
  }
  return dqkv;
}

/// q, k and v head-major from the packed qkv, q and k rotated under rope_theta.
void splitHeads(const AttentionDims &s, const Tensor &qkv, AttentionParts &p) {
  auto head = [&](int64_t start, int64_t count, bool rotate) {
    Tensor t = headsOf(s, qkv, start, count);
    if (!rotate || !s.h.ropeTheta)
      return t;
    return apply(evalRope, ropeAttrs(s.rope), {&t}, t.type);
  };
  p.q = head(0, s.h.heads, true);
  p.k = head(s.h.heads, s.h.kvHeads, true);
  p.v = head(s.h.heads + s.h.kvHeads, s.h.kvHeads, false);
}

/// The probabilities and lse of q, k (scores, scale, causal mask, softmax).
void attend(const AttrMap &a, const AttentionDims &s, AttentionParts &p) {
  int64_t T = s.T;
  TensorType scoresType(s.dtype, {s.B, s.h.heads, T, T});
  Tensor scores = s.ungrouped(gemm(a, kTransposedWeight, s.grouped(p.q), p.k, s.groupedType(T)));
  Tensor scaled = apply(evalScale, attrs({{"factor", *a.getFloat("scale")}}), {&scores}, scoresType);
  Tensor masked = apply(evalCausalMask, {}, {&scaled}, scoresType);
  p.probs = apply(evalSoftmax, {}, {&masked}, scoresType);
  p.lse = Tensor::zeros(TensorType(s.dtype, {s.B, s.h.heads, T}));
  for (int64_t row = 0; row < s.B * s.h.heads * T; ++row) {
    const float *x = &masked.data[row * T];
    double max = *std::max_element(x, x + T), sum = 0;
    for (int64_t j = 0; j < T; ++j)
      sum += std::exp(double(x[j]) - max);
    p.lse.data[row] = float(max + std::log(sum));
  }
}

} // namespace

llvm::Error evalLayerNormLinear(const AttrMap &a, Operands in, Results out) {
  FusedLayout layout(OpKind::LayerNormLinear, a);
  Tensor n = norm(a, *in[layout[FusedSlot::X]], *in[layout[FusedSlot::Gamma]],
                  slot(in, layout, FusedSlot::Beta));
  out[0] = linear(a, n, *in[layout[FusedSlot::W1]], slot(in, layout, FusedSlot::B1));
  if (out.size() > 1)
    out[1] = std::move(n);
  return llvm::Error::success();
}

llvm::Error evalLayerNormMLP(const AttrMap &a, Operands in, Results out) {
  FusedLayout layout(OpKind::LayerNormMLP, a);
  bool swiglu = a.getString(kActivation) == "swiglu";
  Tensor n = norm(a, *in[layout[FusedSlot::X]], *in[layout[FusedSlot::Gamma]],
                  slot(in, layout, FusedSlot::Beta));
  Tensor h = linear(a, n, *in[layout[FusedSlot::W1]], slot(in, layout, FusedSlot::B1));
  Tensor act = activate(h, swiglu);
  out[0] = linear(a, act, *in[layout[FusedSlot::W2]], slot(in, layout, FusedSlot::B2));
  out[1] = std::move(h);
  return llvm::Error::success();
}

/// The head-major copy (attentionHeadsType): q's data, then k's, then v's.
static Tensor joinHeads(const AttentionParts &p, const TensorType &type) {
  Tensor out = Tensor::zeros(type);
  auto at = out.data.begin();
  for (const Tensor *t : {&p.q, &p.k, &p.v})
    at = std::copy(t->data.begin(), t->data.end(), at);
  return out;
}
static void splitCopy(const AttentionDims &s, const Tensor &copy, AttentionParts &p) {
  p.q = Tensor::zeros(s.heads(s.h.heads, s.T));
  p.k = Tensor::zeros(s.heads(s.h.kvHeads, s.T));
  p.v = p.k;
  auto at = copy.data.begin();
  for (Tensor *t : {&p.q, &p.k, &p.v}) {
    std::copy_n(at, t->data.size(), t->data.begin());
    at += std::ptrdiff_t(t->data.size());
  }
}

llvm::Error evalAttention(const AttrMap &a, Operands in, Results out) {
  AttentionDims s = attentionDims(a, in[0]->type);
  AttentionParts p;
  splitHeads(s, *in[0], p);
  attend(a, s, p);
  Tensor context = s.ungrouped(gemm(a, {}, s.grouped(p.probs), p.v, s.groupedType(s.Dh)));
  out[0] = rowsOf(s, context, TensorType(out[0].type));
  out[1] = std::move(p.lse);
  if (out.size() > 2) // head_major
    out[2] = joinHeads(p, out[2].type);
  return llvm::Error::success();
}

namespace {
/// The emulation's shape and S's scales of an FP8 attention over q (E4M3 [B, T, 3D]).
Fp8AttentionShape fp8Shape(const AttentionDims &s, const AttrMap &a) {
  Fp8AttentionShape e;
  e.B = s.B, e.T = s.T, e.H = s.h.heads, e.DH = s.Dh;
  e.scale = float(*a.getFloat("scale"));
  return e;
}
} // namespace

// FP8 attention by the emulation of cuDNN's (Fp8Attention.h) on q, k, v split as attention
// splits them. FP8 operands hold their codes times scale_inv, so the emulation's q, k, v and
// dout descales are 1 (the ops' q_scale_inv and dout_scale_inv are the GPU's); S's and dP's
// scales are the state operands; out and dqkv are BF16 values.
llvm::Error evalFp8Attention(const AttrMap &a, Operands in, Results out) {
  AttentionDims s = attentionDims(a, in[0]->type);
  AttentionParts p;
  splitHeads(s, *in[0], p);
  Fp8AttentionScales c;
  c.scaleS = in[2]->data[0], c.descaleS = in[3]->data[0];
  Fp8AttentionForward f = fp8AttentionForward(fp8Shape(s, a), p.q.data, p.k.data, p.v.data, c);
  p.q.data = std::move(f.out);
  out[0] = rowsOf(s, p.q, TensorType(out[0].type));
  out[1].data = std::move(f.stats); // [B, H, T], as lse
  out[2].data[0] = f.amaxS;
  return llvm::Error::success();
}

llvm::Error evalFp8AttentionBackward(const AttrMap &a, Operands in, Results out) {
  AttentionDims s = attentionDims(a, in[1]->type);
  AttentionParts p;
  splitHeads(s, *in[1], p);
  Fp8AttentionShape e = fp8Shape(s, a);
  e.grad = in[0]->type.dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  Fp8AttentionScales c;
  c.scaleS = in[6]->data[0], c.descaleS = in[7]->data[0];
  c.scaleDP = in[8]->data[0], c.descaleDP = in[9]->data[0];
  Tensor outHeads = headsOf(s, *in[2], 0, s.h.heads), doutHeads = headsOf(s, *in[0], 0, s.h.heads);
  Fp8AttentionGradients g = fp8AttentionBackward(e, p.q.data, p.k.data, p.v.data, outHeads.data, doutHeads.data, c);
  p.q.data = std::move(g.dq), p.k.data = std::move(g.dk), p.v.data = std::move(g.dv);
  out[0] = packedGradient(s, {&p.q, &p.k, &p.v}, out[0].type);
  out[1].data[0] = g.amaxDP;
  return llvm::Error::success();
}

namespace {
/// Sequence b's position from a positions operand, checked against the cache length T (rows
/// needed: that position and the `rows - 1` after it).
llvm::Expected<int64_t> positionOf(const Tensor &positions, int64_t b, int64_t rows, int64_t T) {
  int64_t pos = positions.ints[b];
  if (pos < 0 || pos + rows > T)
    return makeError("position {} of sequence {} is outside the cache [0, {})", pos + rows - 1 < T ? pos : pos + rows - 1,
                     b, T);
  return pos;
}
} // namespace

namespace {
/// Under rope_theta (fuse-cache-rope): qkv [B, S, Dq + 2C] with the queries and keys of row s
/// of sequence b rotated at position positions[b] + s (s without positions) of a table of the
/// cache's T positions, heads C / kv_heads wide (kv_heads: the op's, else its heads): what the
/// rope ops the pass took computed, the same bits. Without rope_theta, qkv as it is.
llvm::Expected<Tensor> rotatedForCache(const AttrMap &a, const Tensor &qkv, const Tensor *positions, int64_t C,
                                       int64_t T) {
  if (!a.has("rope_theta"))
    return qkv;
  int64_t B = qkv.type.dim(0), S = qkv.type.dim(1), W = qkv.type.dim(2);
  int64_t dh = C / a.getInt("kv_heads").value_or(a.getInt("heads").value_or(1)), half = dh / 2;
  std::vector<float> table = ropeTable(ropeOptions(a, "rope_theta"), T, dh);
  Tensor rotated = qkv;
  for (int64_t b = 0; b < B; ++b) {
    int64_t first = positions ? positions->ints[size_t(b)] : 0;
    if (first < 0 || first + S > T)
      return makeError("position {} of sequence {} is outside rope's length [0, {})", first, b, T);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t head = 0; head < (W - C) / dh; ++head) { // the queries' heads, then the keys'
        float *x = &rotated.data[size_t((b * S + s) * W + head * dh)];
        int64_t t = first + s;
        for (int64_t i = 0; i < half; ++i)
          rotatePair(x[i], x[i + half], table[size_t(t * half + i)], table[size_t((T + t) * half + i)]);
      }
  }
  return rotated;
}
} // namespace

llvm::Error evalKvWrite(const AttrMap &a, Operands in, Results out) {
  // Under gemm_dtype="bf16" the cache holds BF16 values: the keys and values are rounded as
  // they are written, as the attention over the cache would round them when reading.
  auto rotated = rotatedForCache(a, *in[2], in.size() > 3 ? in[3] : nullptr, in[0]->type.dim(2), in[0]->type.dim(1));
  if (!rotated)
    return rotated.takeError();
  const Tensor &qkv = *rotated;
  bool bf16 = hasBf16Gemms(a);
  int64_t B = in[0]->type.dim(0), T = in[0]->type.dim(1), D = in[0]->type.dim(2), S = qkv.type.dim(1);
  int64_t W = qkv.type.dim(2), keys = W - 2 * D; // the queries' width: keys at [W - 2D, W - D)
  for (int r = 0; r < 2; ++r)
    out[r].data = in[r]->data;
  for (int64_t b = 0; b < B; ++b) {
    int64_t first = 0;
    if (in.size() > 3) {
      auto pos = positionOf(*in[3], b, S, T);
      if (!pos)
        return pos.takeError();
      first = *pos;
    }
    for (int64_t s = 0; s < S; ++s)
      for (int r = 0; r < 2; ++r) // keys are qkv's columns [W - 2D, W - D), values [W - D, W)
        for (int64_t d = 0; d < D; ++d) {
          float x = qkv.data[(b * S + s) * W + keys + r * D + d];
          out[r].data[(b * T + first + s) * D + d] = bf16 ? roundToBf16(x) : x;
        }
  }
  return llvm::Error::success();
}

namespace {
/// What attention computes for the row of each query's position (query s of sequence b at
/// positions[b] + s), in the same steps: scores (a GEMM: BF16 operands under gemm_dtype, fp32
/// sums), scale, softmax (max in float, sum in double), probabilities times values (a GEMM
/// again). `out` is zero.
llvm::Error attendOverCache(const AttrMap &a, const Tensor &qkv, const Tensor &k, const Tensor &v,
                            const Tensor &positions, Tensor &out) {
  // The queries [0, Dq) of qkv's row; query head h reads cache head h / (heads / kv_heads).
  int64_t B = k.type.dim(0), T = k.type.dim(1), C = k.type.dim(2), S = qkv.type.dim(1), W = qkv.type.dim(2);
  int64_t Dq = W - 2 * C;
  int64_t H = *a.getInt("heads"), Dh = Dq / H, G = H / a.getInt("kv_heads").value_or(H);
  float scale = float(*a.getFloat("scale"));
  bool bf16 = hasBf16Gemms(a);
  auto r = [bf16](float x) { return bf16 ? roundToBf16(x) : x; };
  for (int64_t row = 0; row < B * S; ++row) {
    int64_t b = row / S;
    auto position = positionOf(positions, b, S, T);
    if (!position)
      return position.takeError();
    int64_t pos = *position + row % S;
    Tensor scores = Tensor::zeros(TensorType(DType::F32, {pos + 1}));
    for (int64_t h = 0; h < H; ++h) {
      const float *qh = &qkv.data[row * W + h * Dh];
      for (int64_t j = 0; j <= pos; ++j) {
        const float *kj = &k.data[(b * T + j) * C + h / G * Dh];
        float dot = 0.0f;
        for (int64_t d = 0; d < Dh; ++d)
          dot += r(qh[d]) * r(kj[d]);
        scores.data[j] = dot * scale;
      }
      Tensor probs = apply(evalSoftmax, {}, {&scores}, scores.type);
      float *o = &out.data[row * Dq + h * Dh];
      for (int64_t j = 0; j <= pos; ++j) {
        float p = r(probs.data[j]);
        const float *vj = &v.data[(b * T + j) * C + h / G * Dh];
        for (int64_t d = 0; d < Dh; ++d)
          o[d] += p * r(vj[d]);
      }
    }
  }
  return llvm::Error::success();
}
} // namespace

llvm::Error evalDecodeAttention(const AttrMap &a, Operands in, Results out) {
  // Under rope_theta the query is rotated at its position first (and the key kv_write writes).
  auto qkv = rotatedForCache(a, *in[0], in[3], in[1]->type.dim(2), in[1]->type.dim(1));
  if (!qkv)
    return qkv.takeError();
  if (!writesCache(a))
    return attendOverCache(a, *qkv, *in[1], *in[2], *in[3], out[0]);
  // fuse-kv-write's: the kv_write first, then the attention over the caches it wrote.
  if (llvm::Error err = evalKvWrite(a, {in[1], in[2], in[0], in[3]}, out.drop_front()))
    return err;
  return attendOverCache(a, *qkv, out[1], out[2], *in[3], out[0]);
}

llvm::Error evalResidualNorm(const AttrMap &a, Operands in, Results out) {
  out[0] = apply(evalAdd, {}, {in[0], in[1]}, in[0]->type);
  out[1] = norm(a, out[0], *in[2], in.size() > 3 ? in[3] : nullptr);
  return llvm::Error::success();
}

llvm::Error evalResidualNormLinear(const AttrMap &a, Operands in, Results out) {
  // residual_norm, then the product of its norm (matmul_bias, or matmul {transpose_b}), then the
  // GELU where there is one: the ops fuse-residual-norm-gemv replaced, in their order.
  size_t normOperands = isLayerNorm(a) ? 4 : 3;
  Tensor residual[2];
  if (llvm::Error err = evalResidualNorm(a, in.take_front(normOperands), residual))
    return err;
  bool bias = a.getBool("bias").value_or(false);
  Tensor y = linear(a, residual[1], *in[normOperands], bias ? in[normOperands + 1] : nullptr);
  out[0] = std::move(residual[0]);
  if (a.getString(kActivation) == "swiglu")
    out[1] = activate(y, true);
  else
    out[1] = a.getString(kActivation) == "gelu" ? apply(evalGelu, {}, {&y}, y.type) : std::move(y);
  return llvm::Error::success();
}

llvm::Error evalMaskedSoftmax(const AttrMap &a, Operands in, Results out) {
  const TensorType &type = in[0]->type;
  Tensor scaled = apply(evalScale, attrs({{"factor", *a.getFloat("scale")}}), {in[0]}, type);
  Tensor masked = apply(evalCausalMask, {}, {&scaled}, type);
  return evalSoftmax({}, {&masked}, out);
}

llvm::Error evalMaskedSoftmaxBackward(const AttrMap &a, Operands in, Results out) {
  const TensorType &type = in[1]->type;
  Tensor dmasked = apply(evalSoftmaxBackward, {}, {in[0], in[1]}, type);
  Tensor dscaled = apply(evalCausalMask, attrs({{"fill", 0.0}}), {&dmasked}, type);
  return evalScale(attrs({{"factor", *a.getFloat("scale")}}), {&dscaled}, out);
}

llvm::Error evalMatMulBias(const AttrMap &a, Operands in, Results out) {
  out[0] = linear(a, *in[0], *in[1], in[2]);
  return llvm::Error::success();
}

llvm::Error evalMatMulBiasGelu(const AttrMap &a, Operands in, Results out) {
  out[1] = linear(a, *in[0], *in[1], in[2]);
  out[0] = apply(evalGelu, {}, {&out[1]}, out[1].type);
  return llvm::Error::success();
}

llvm::Error evalMatMulDGelu(const AttrMap &a, Operands in, Results out) {
  Tensor product = apply(evalMatMul, a, {in[0], in[1]}, out[0].type);
  return evalGeluBackward({}, {&product, in[2]}, out);
}

llvm::Error evalCrossEntropy(const AttrMap &a, Operands in, Results out) {
  const Tensor &logits = *in[0], &targets = *in[1];
  Tensor logp = apply(evalLogSoftmax, {}, {&logits}, logits.type);
  if (llvm::Error err = evalNLLLoss({}, {&logp, &targets}, out.take_front()))
    return err;
  if (in.size() < 3) // with dloss: the gradient as cross_entropy_backward takes it
    return llvm::Error::success();
  return evalCrossEntropyBackward(a, {in[2], &logits, &targets}, out.drop_front());
}

llvm::Error evalLayerNormLinearBackward(const AttrMap &a, Operands in, Results out) {
  FusedLayout layout(OpKind::LayerNormLinearBackward, a);
  const Tensor &x = *in[layout[FusedSlot::X]], &gamma = *in[layout[FusedSlot::Gamma]];
  const Tensor &w = *in[layout[FusedSlot::W1]];
  bool layerNorm = layout.has(FusedSlot::Beta);
  Tensor n = norm(a, x, gamma, slot(in, layout, FusedSlot::Beta));
  LinearGrads g = linearBackward(a, *in[layout[FusedSlot::Dy]], n, w, layout.has(FusedSlot::B1));
  if (layout.has(FusedSlot::DNorm))
    g.dx = apply(evalAdd, {}, {&g.dx, in[layout[FusedSlot::DNorm]]}, g.dx.type);
  unsigned r = 0;
  Tensor dx, dgamma, dbeta;
  normBackward(a, g.dx, x, gamma, layerNorm, dx, dgamma, &dbeta);
  out[r++] = std::move(dx);
  out[r++] = std::move(dgamma);
  if (layerNorm)
    out[r++] = std::move(dbeta);
  out[r++] = std::move(g.dw);
  if (layout.has(FusedSlot::B1))
    out[r++] = std::move(g.db);
  return llvm::Error::success();
}

llvm::Error evalLayerNormMLPBackward(const AttrMap &a, Operands in, Results out) {
  FusedLayout layout(OpKind::LayerNormMLPBackward, a);
  bool swiglu = a.getString(kActivation) == "swiglu";
  const Tensor &x = *in[layout[FusedSlot::X]], &gamma = *in[layout[FusedSlot::Gamma]];
  const Tensor &w1 = *in[layout[FusedSlot::W1]], &w2 = *in[layout[FusedSlot::W2]];
  bool layerNorm = layout.has(FusedSlot::Beta), bias = layout.has(FusedSlot::B1);
  // Recompute the normalised input, and the activation from the h the forward kept (a GELU's
  // tanh once, for the activation and its gradient).
  Tensor n = norm(a, x, gamma, slot(in, layout, FusedSlot::Beta));
  const Tensor &h = *in[layout[FusedSlot::Hidden]];
  Tensor tanhs = swiglu ? Tensor{} : apply(evalGeluInner, {}, {&h}, h.type);
  Tensor act = swiglu ? activate(h, swiglu) : apply(evalGeluOf, {}, {&h, &tanhs}, h.type);
  LinearGrads g2 = linearBackward(a, *in[layout[FusedSlot::Dy]], act, w2, bias);
  Tensor dh = swiglu ? activateBackward(g2.dx, h, swiglu)
                     : apply(evalGeluGradientOf, {}, {&g2.dx, &h, &tanhs}, h.type);
  LinearGrads g1 = linearBackward(a, dh, n, w1, bias);
  Tensor dx, dgamma, dbeta;
  normBackward(a, g1.dx, x, gamma, layerNorm, dx, dgamma, &dbeta);
  unsigned r = 0;
  out[r++] = std::move(dx);
  out[r++] = std::move(dgamma);
  if (layerNorm)
    out[r++] = std::move(dbeta);
  out[r++] = std::move(g1.dw);
  if (bias)
    out[r++] = std::move(g1.db);
  out[r++] = std::move(g2.dw);
  if (bias)
    out[r++] = std::move(g2.db);
  return llvm::Error::success();
}

// The reference recomputes the probabilities from qkv as the unfused graph has them; the
// forward's out and lse (operands 2 and 3) are what the GPU's kernels read instead. Under
// rope_theta the gradients of the rotated q and k are rotated back (rope's own gradient).
llvm::Error evalAttentionBackward(const AttrMap &a, Operands in, Results out) {
  const TensorType &qkvType = out[0].type;
  AttentionDims s = attentionDims(a, qkvType);
  AttentionParts p;
  if (isHeadMajor(a))
    splitCopy(s, *in[1], p);
  else
    splitHeads(s, *in[1], p);
  attend(a, s, p);
  int64_t B = s.B, T = s.T, H = s.h.heads, Dh = s.Dh;
  DType dt = s.dtype;
  Tensor split = *in[0];
  split.type = TensorType(dt, {B, T, H, Dh});
  Tensor dcontext = apply(evalTranspose, attrs({{"perm", kSwapHeads}}), {&split}, p.q.type);
  Tensor dprobs = s.ungrouped(gemm(a, kTransposedWeight, s.grouped(dcontext), p.v, s.groupedType(T)));
  Tensor dv = gemm(a, {true, false}, s.grouped(p.probs), s.grouped(dcontext), p.v.type);
  Tensor dmasked = apply(evalSoftmaxBackward, {}, {&dprobs, &p.probs}, p.probs.type);
  Tensor dscaled = apply(evalCausalMask, attrs({{"fill", 0.0}}), {&dmasked}, p.probs.type);
  Tensor dscores = apply(evalScale, attrs({{"factor", *a.getFloat("scale")}}), {&dscaled}, p.probs.type);
  Tensor dq = s.ungrouped(gemm(a, {}, s.grouped(dscores), p.k, s.groupedType(Dh)));
  Tensor dk = gemm(a, {true, false}, s.grouped(dscores), s.grouped(p.q), p.k.type);
  if (s.h.ropeTheta)
    for (Tensor *d : {&dq, &dk})
      *d = apply(evalRope, ropeAttrs({s.rope.theta, true, s.rope.scaling}), {d}, d->type);
  out[0] = packedGradient(s, {&dq, &dk, &dv}, qkvType);
  return llvm::Error::success();
}

// swiglu and its gradient: the kernels of the ops they replace, in their order (activate and
// activateBackward, as layer_norm_mlp {swiglu} computes them).
llvm::Error evalSwiglu(const AttrMap &, Operands in, Results out) {
  out[0] = activate(*in[0], true);
  return llvm::Error::success();
}
llvm::Error evalSwigluBackward(const AttrMap &, Operands in, Results out) {
  out[0] = activateBackward(*in[0], *in[1], true);
  return llvm::Error::success();
}

llvm::Error evalCrossEntropyBackward(const AttrMap &, Operands in, Results out) {
  // The log-probabilities recomputed, then nll_loss's and log_softmax's gradients: the unfused
  // graph's arithmetic, so that a BF16 LM head rounds the same dlogits either way.
  const Tensor &dloss = *in[0], &logits = *in[1], &targets = *in[2];
  Tensor logp = apply(evalLogSoftmax, {}, {&logits}, logits.type);
  Tensor dlogp = Tensor::zeros(logits.type);
  if (llvm::Error err = evalNLLLossBackward({}, {&dloss, &logp, &targets}, Results(dlogp)))
    return err;
  return evalLogSoftmaxBackward({}, {&dlogp, &logp}, out);
}

} // namespace tgc::cpu
