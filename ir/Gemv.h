// Which products the GPU runs as gemv.cuh's kernels (a few rows against a weight, the decode
// step's linear layers) instead of cuBLASLt: the backend lowers them so, and the fusions that put
// a norm into such a product's prologue (fuse-residual-norm-gemv) or the GELU into its epilogue
// (fuse-gemv-gelu) ask the same question.
#pragma once

#include "ir/Attributes.h"
#include "ir/Graph.h"

namespace tgc {

/// How gemv.cuh runs a product of few rows, if it does.
enum class FewRows {
  None,   ///< cuBLASLt's
  Gemv,   ///< 1 to 8 rows: warps over columns and slices of K (K a multiple of 8), which can
          ///< normalise the rows first; 2 to 8 rows on tensor cores where Tensor's shape allows
          ///< (the backend's choice)
  Tensor, ///< 9 to 64 rows: mma.sync tiles over slices of K (K a multiple of 32, N at most 16384)
};

/// Products of at most this many rows run as gemv.cuh's kernels (rows past it: cuBLASLt, whose
/// tiles of 64 rows and more then fill).
constexpr int64_t kMaxFewRows = 64;
/// The tensor-core kernel takes products of at most this many columns: each of its blocks reads
/// all the rows of x for a few columns, which past it (a vocabulary's head) costs more than
/// cuBLASLt's tiles (BENCHMARKS.md, session 13).
constexpr int64_t kMaxTensorColumns = 16384;

/// A BF16 product x @ w^T (+ bias, or + bias then GELU) of few rows against a parameter [N, K]:
/// which of gemv.cuh's kernels runs it.
inline FewRows fewRows(const Op &op) {
  if (op.kind() != OpKind::MatMul && op.kind() != OpKind::MatMulBias && op.kind() != OpKind::MatMulBiasGelu)
    return FewRows::None;
  const AttrMap &a = op.attrs();
  if (!hasBf16Gemms(a) || a.getBool("transpose_a").value_or(false) ||
      (op.kind() == OpKind::MatMul && !a.getBool("transpose_b").value_or(false)))
    return FewRows::None;
  const Value *x = op.operand(0), *w = op.operand(1);
  if (x->type().dtype != DType::F32 || w->type().dtype != DType::F32 || w->type().rank() != 2 ||
      !w->def() || w->def()->kind() != OpKind::Param)
    return FewRows::None;
  int64_t K = w->type().dim(1);
  if (x->type().dim(-1) != K)
    return FewRows::None;
  int64_t rows = x->type().numElements() / K;
  if (rows <= 8 && K % 8 == 0)
    return FewRows::Gemv;
  if (rows <= kMaxFewRows && K % 32 == 0 && w->type().dim(0) <= kMaxTensorColumns)
    return FewRows::Tensor;
  return FewRows::None;
}

/// A product of at most 8 rows (the GEMV kernels, which can normalise their rows first).
inline bool isGemv(const Op &op) { return fewRows(op) == FewRows::Gemv; }

} // namespace tgc
