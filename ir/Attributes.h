// Typed access to the attributes that several layers read: each attribute's spelling and
// meaning are decided here, once, and the passes, backends and tests ask these functions.
#pragma once

#include "ir/Types.h"
#include "support/Numerics.h"

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>
#include <utility>

namespace tgc {

/// gemm_dtype="bf16": the op's GEMMs (its own, or those inside a fused op) read their operands
/// rounded to BF16 and sum in fp32. Absent: they read the operands' own type.
inline constexpr llvm::StringLiteral kGemmDtype = "gemm_dtype";
inline bool hasBf16Gemms(const AttrMap &attrs) { return attrs.getString(kGemmDtype) == "bf16"; }
inline void setBf16Gemms(AttrMap &attrs) { attrs.set(kGemmDtype, std::string("bf16")); }
/// Gives `to` the GEMM precision of `from` (an op that replaces or differentiates another).
inline void copyGemmPrecision(const AttrMap &from, AttrMap &to) {
  if (auto dtype = from.getString(kGemmDtype))
    to.set(kGemmDtype, *dtype);
}
inline bool sameGemmPrecision(const AttrMap &a, const AttrMap &b) {
  return a.getString(kGemmDtype) == b.getString(kGemmDtype);
}

/// head_major=true on attention and attention_backward: the forward also returns q, k and v
/// head-major (attentionHeadsType), which its gradient reads instead of qkv (keep-attention-heads).
inline constexpr llvm::StringLiteral kHeadMajor = "head_major";
inline bool isHeadMajor(const AttrMap &attrs) { return attrs.getBool(kHeadMajor).value_or(false); }

/// The attention ops' heads: `heads` query heads and `kv_heads` key/value heads (absent: as
/// many; fewer is grouped-query attention, query head h reading KV head h / (heads / kv_heads),
/// Llama's repeat_kv), and rope_theta where q and k are rotated (RoPE, ir/Rope.h's table at
/// positions 0..T-1) inside the op. The packed qkv row is q (heads) | k (kv_heads) | v (kv_heads).
struct AttentionHeads {
  int64_t heads = 0, kvHeads = 0;
  std::optional<double> ropeTheta;
  int64_t group() const { return heads / kvHeads; }
  /// qkv's row width at head dimension dh.
  int64_t width(int64_t dh) const { return (heads + 2 * kvHeads) * dh; }
  bool grouped() const { return kvHeads != heads; }
};
inline AttentionHeads attentionHeads(const AttrMap &attrs) {
  int64_t heads = attrs.getInt("heads").value_or(0);
  return {heads, attrs.getInt("kv_heads").value_or(heads), attrs.getFloat("rope_theta")};
}
/// The head-major copy of q, k and v: q [B, H, T, Dh], then k and v [B, KV, T, Dh], one after
/// the other; typed [3, B, H, T, Dh] where KV = H, else [(H + 2 KV) B, T, Dh].
inline TensorType attentionHeadsType(DType dtype, const AttentionHeads &h, int64_t B, int64_t T, int64_t dh) {
  if (!h.grouped())
    return TensorType(dtype, {3, B, h.heads, T, dh});
  return TensorType(dtype, {(h.heads + 2 * h.kvHeads) * B, T, dh});
}
/// Whether the GPU runs an attention of this head dimension on tensor cores (attention.cuh's
/// BF16 kernels, which read q, k and v head-major in BF16): under gemm_dtype, head dimensions
/// that are multiples of 16 up to 256.
inline bool attentionOnTensorCores(const AttrMap &attrs, int64_t headDim) {
  return hasBf16Gemms(attrs) && headDim % 16 == 0 && headDim <= 256;
}

/// write_cache=true on decode_attention: it writes this step's keys and values into the caches
/// it reads (fuse-kv-write) and returns them, as the kv_write it replaces did.
inline constexpr llvm::StringLiteral kWriteCache = "write_cache";
inline bool writesCache(const AttrMap &attrs) { return attrs.getBool(kWriteCache).value_or(false); }

/// The FP8 element format of a quantize or fp8_update op: format="e4m3" or "e5m2".
inline constexpr llvm::StringLiteral kFp8Format = "format";
inline Fp8Format fp8FormatOf(const AttrMap &attrs) {
  return attrs.getString(kFp8Format) == "e5m2" ? Fp8Format::E5M2 : Fp8Format::E4M3;
}

/// transpose_a / transpose_b on matmul (and the GEMMs a lowering makes): which operands are read
/// transposed. Only a true flag is stored, so the IR text names what is transposed.
inline constexpr llvm::StringLiteral kTransposeA = "transpose_a", kTransposeB = "transpose_b";
struct MatMulLayout {
  bool transposeA = false, transposeB = false;
};
inline MatMulLayout matmulLayout(const AttrMap &attrs) {
  return {attrs.getBool(kTransposeA).value_or(false), attrs.getBool(kTransposeB).value_or(false)};
}
inline void setMatmulLayout(AttrMap &attrs, MatMulLayout layout) {
  for (auto [key, on] : {std::pair{kTransposeA, layout.transposeA}, std::pair{kTransposeB, layout.transposeB}}) {
    if (on)
      attrs.set(key, true);
    else
      attrs.erase(key);
  }
}
/// The attributes of a GEMM with `layout` (and nothing else).
inline AttrMap matmulAttrs(MatMulLayout layout) {
  AttrMap attrs;
  setMatmulLayout(attrs, layout);
  return attrs;
}
/// A product by a weight stored [N, K] (a linear layer's y = x w^T): transpose_b alone.
inline constexpr MatMulLayout kTransposedWeight{false, true};

/// The options of a quantize op (fp8.md): its format (kFp8Format above), its scaling
/// (scaling="current" with margin M: the tensor's own amax; absent: the delayed scale it is
/// given), transpose=true (it also writes the transpose, for the wgrad), activation="gelu" or
/// "gelu_backward" (fuse-gelu-quantize: it quantizes the GELU of its input, or the GELU's
/// gradient), "swiglu" or "swiglu_backward" (the same for SwiGLU: swiglu(h) [..., F] of h
/// [..., 2F], or swiglu_backward(dy, h) [..., 2F]), activation="cross_entropy_backward"
/// (fuse-cross-entropy-quantize: it quantizes the loss's gradient of the logits it is given, and
/// gives the loss) and bias_grad=true (with gelu_backward: it also sums that gradient's
/// columns). fp8_update takes the margin too. scaling="block" with block_rows=1 or 128 is
/// Transformer Engine's Float8BlockScaling: a scale for each block of 1 x 128 (block_rows=1) or
/// 128 x 128 values along the last dimension, from the block's own amax, a power of two
/// (fp8.md); the transpose of a 1 x 128-scaled tensor is quantized again from the input in
/// blocks along the other dimension, as the wgrad reads it.
enum class QuantizeActivation { None, Gelu, GeluBackward, Swiglu, SwigluBackward, CrossEntropyBackward };
struct QuantizeOptions {
  Fp8Format format = Fp8Format::E4M3;
  bool currentScaling = false;
  bool blockScaling = false;
  int64_t blockRows = 1; // under block scaling: 1 (1 x 128 blocks) or 128 (128 x 128)
  int64_t margin = 0;
  bool transpose = false;
  QuantizeActivation activation = QuantizeActivation::None;
  bool biasGrad = false;
};
inline constexpr int64_t kFp8BlockSize = 128; // the side of a block-scaling block
/// Where cuBLASLt reads the block scales of a block-scaled operand of `rows` rows of `cols`
/// (its reduction, contiguous): 1 x 128 blocks as [cols/128][rows], 128 x 128 blocks as
/// [rows/128][ceil4(cols/128)] (BENCHMARKS.md, session 32). The index of element (r, k)'s
/// block, and the floats the scales take.
inline int64_t blockScaleIndex(int64_t r, int64_t k, int64_t rows, int64_t cols, int64_t blockRows) {
  int64_t padded = (cols / kFp8BlockSize + 3) / 4 * 4;
  return blockRows == 1 ? k / kFp8BlockSize * rows + r : r / kFp8BlockSize * padded + k / kFp8BlockSize;
}
inline int64_t blockScaleCount(int64_t rows, int64_t cols, int64_t blockRows) {
  return blockRows == 1 ? cols / kFp8BlockSize * rows : rows / kFp8BlockSize * ((cols / kFp8BlockSize + 3) / 4 * 4);
}
inline constexpr llvm::StringLiteral kBlockRows = "block_rows";
inline constexpr llvm::StringLiteral kScaling = "scaling", kMargin = "margin", kTranspose = "transpose",
                                     kActivation = "activation", kBiasGrad = "bias_grad";
inline const char *fp8FormatName(Fp8Format format) { return format == Fp8Format::E5M2 ? "e5m2" : "e4m3"; }
inline const char *activationName(QuantizeActivation a) {
  switch (a) {
  case QuantizeActivation::Gelu:
    return "gelu";
  case QuantizeActivation::GeluBackward:
    return "gelu_backward";
  case QuantizeActivation::Swiglu:
    return "swiglu";
  case QuantizeActivation::SwigluBackward:
    return "swiglu_backward";
  case QuantizeActivation::CrossEntropyBackward:
    return "cross_entropy_backward";
  case QuantizeActivation::None:
    break;
  }
  return "";
}
/// The activations whose quantize reads a second operand h (operand 3): the gradients'.
inline bool readsHidden(QuantizeActivation a) {
  return a == QuantizeActivation::GeluBackward || a == QuantizeActivation::SwigluBackward;
}
inline QuantizeOptions quantizeOptions(const AttrMap &attrs) {
  QuantizeOptions q;
  q.format = fp8FormatOf(attrs);
  q.currentScaling = attrs.getString(kScaling) == "current";
  q.blockScaling = attrs.getString(kScaling) == "block";
  q.blockRows = attrs.getInt(kBlockRows).value_or(1);
  q.margin = attrs.getInt(kMargin).value_or(0);
  q.transpose = attrs.getBool(kTranspose).value_or(false);
  auto activation = attrs.getString(kActivation);
  q.activation = activation == "gelu"                     ? QuantizeActivation::Gelu
                 : activation == "gelu_backward"          ? QuantizeActivation::GeluBackward
                 : activation == "swiglu"                 ? QuantizeActivation::Swiglu
                 : activation == "swiglu_backward"        ? QuantizeActivation::SwigluBackward
                 : activation == "cross_entropy_backward" ? QuantizeActivation::CrossEntropyBackward
                                                          : QuantizeActivation::None;
  q.biasGrad = attrs.getBool(kBiasGrad).value_or(false);
  return q;
}
/// The margin of a quantize under current scaling, or of an fp8_update.
inline int64_t fp8Margin(const AttrMap &attrs) { return attrs.getInt(kMargin).value_or(0); }
inline void setFp8Format(AttrMap &attrs, Fp8Format format) { attrs.set(kFp8Format, std::string(fp8FormatName(format))); }
inline void setFp8Margin(AttrMap &attrs, int64_t margin) { attrs.set(kMargin, margin); }
inline void setCurrentScaling(AttrMap &attrs, int64_t margin) {
  attrs.set(kScaling, std::string("current"));
  setFp8Margin(attrs, margin);
}
inline void setBlockScaling(AttrMap &attrs, int64_t blockRows) {
  attrs.set(kScaling, std::string("block"));
  attrs.set(kBlockRows, blockRows);
}
inline void setQuantizeTranspose(AttrMap &attrs) { attrs.set(kTranspose, true); }
inline void setQuantizeActivation(AttrMap &attrs, QuantizeActivation a) {
  attrs.set(kActivation, std::string(activationName(a)));
}
inline void setBiasGrad(AttrMap &attrs) { attrs.set(kBiasGrad, true); }

/// How assign-precision chose to run a linear layer's GEMM in FP8, left on the matmul for
/// autodiff, which quantizes the output gradient the same way: the layer's site (its scaling
/// state's name), the gradient's format (E5M2 under hybrid), the amax history's length, and
/// under current scaling the margin; under block scaling `block` (the gradient in 1 x 128 blocks).
struct Fp8GemmChoice {
  std::string site;
  Fp8Format gradFormat = Fp8Format::E5M2;
  int64_t history = 1;
  std::optional<int64_t> currentMargin;
  bool block = false;
};
inline constexpr llvm::StringLiteral kFp8Site = "fp8_site", kFp8Grad = "fp8_grad", kFp8History = "fp8_history",
                                     kFp8CurrentMargin = "fp8_current_margin", kFp8Block = "fp8_block";
inline bool hasFp8GemmChoice(const AttrMap &attrs) { return attrs.has(kFp8Site); }
/// The choice on a matmul, if assign-precision made one; `fallbackSite` names a site left out.
inline std::optional<Fp8GemmChoice> fp8GemmChoice(const AttrMap &attrs, const std::string &fallbackSite) {
  auto grad = attrs.getString(kFp8Grad);
  if (!grad)
    return std::nullopt;
  Fp8GemmChoice c;
  c.site = attrs.getString(kFp8Site).value_or(fallbackSite);
  c.gradFormat = *grad == "e5m2" ? Fp8Format::E5M2 : Fp8Format::E4M3;
  c.history = attrs.getInt(kFp8History).value_or(1);
  c.currentMargin = attrs.getInt(kFp8CurrentMargin);
  c.block = attrs.getBool(kFp8Block).value_or(false);
  return c;
}
inline void setFp8GemmChoice(AttrMap &attrs, const Fp8GemmChoice &c) {
  attrs.set(kFp8Site, c.site);
  attrs.set(kFp8Grad, std::string(fp8FormatName(c.gradFormat)));
  attrs.set(kFp8History, c.history);
  if (c.currentMargin)
    attrs.set(kFp8CurrentMargin, *c.currentMargin);
  if (c.block)
    attrs.set(kFp8Block, true);
}

} // namespace tgc
