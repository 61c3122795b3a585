// Which products the GPU runs as gemv.cuh's kernel (a few rows against a weight, the decode
// step's linear layers) instead of cuBLASLt: the backend lowers them so, and the fusion that puts
// a norm into such a product's prologue (fuse-residual-norm-gemv) asks the same question.
#pragma once

#include "ir/Attributes.h"
#include "ir/Graph.h"

namespace tgc {

/// A BF16 product of at most 8 rows against a parameter [N, K] (K a multiple of 8), x @ w^T
/// (+ bias). (A tensor-core kernel for 9 to 64 rows, 8 warps a block over slices of K with
/// 4-byte fragment loads, ran slower than cuBLASLt: BENCHMARKS.md, session 9.)
inline bool isGemv(const Op &op) {
  if (op.kind() != OpKind::MatMul && op.kind() != OpKind::MatMulBias)
    return false;
  const AttrMap &a = op.attrs();
  if (!hasBf16Gemms(a) || a.getBool("transpose_a").value_or(false) ||
      (op.kind() == OpKind::MatMul && !a.getBool("transpose_b").value_or(false)))
    return false;
  const Value *x = op.operand(0), *w = op.operand(1);
  if (x->type().dtype != DType::F32 || w->type().dtype != DType::F32 || w->type().rank() != 2 ||
      !w->def() || w->def()->kind() != OpKind::Param)
    return false;
  int64_t K = w->type().dim(1);
  return K % 8 == 0 && x->type().dim(-1) == K && x->type().numElements() / K <= 8;
}

} // namespace tgc
