// Typed access to the attributes that several layers read: each attribute's spelling and
// meaning are decided here, once, and the passes, backends and tests ask these functions.
#pragma once

#include "ir/Types.h"
#include "support/Numerics.h"

#include "llvm/ADT/StringRef.h"

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
/// head-major ([3, B, H, T, Dh]), which its gradient reads instead of qkv (keep-attention-heads).
inline constexpr llvm::StringLiteral kHeadMajor = "head_major";
inline bool isHeadMajor(const AttrMap &attrs) { return attrs.getBool(kHeadMajor).value_or(false); }
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

} // namespace tgc
