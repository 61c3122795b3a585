// What the files of type rules (Infer.cpp: the basic ops and the dispatch; InferFused.cpp: the
// fused, FP8 and generation ops; InferPrecision.cpp: quantize and fp8_update;
// InferCollectives.cpp: data parallelism's) share: each op's rule infer<Enum>, dispatched from
// the op table, and the checks they have in common. Internal to ir/.
#pragma once

#include "ir/Infer.h"

namespace tgc::infer {

using Operands = llvm::ArrayRef<TensorType>;

/// A scalar's type: the losses, the scales and the optimizer's step values.
inline const TensorType kScalar(DType::F32, {});

#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) \
  llvm::Expected<TypeList> infer##Enum(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType> declared);
#include "ir/Ops.def"

/// Arithmetic ops take f32, bf16 or f16; FP8 tensors feed only GEMMs and layout ops.
llvm::Error requireFloat(const TensorType &t, llvm::StringRef what);
/// gemm_dtype, where present, is "bf16".
llvm::Error checkGemmDType(const AttrMap &attrs);
llvm::Expected<double> requireFloatAttr(const AttrMap &attrs, llvm::StringRef key);
llvm::Expected<int64_t> requireIntAttr(const AttrMap &attrs, llvm::StringRef key);
/// A norm's x [..., D], gamma [D] (and beta [D]) and eps.
llvm::Error checkNorm(Operands ops, const AttrMap &attrs);
/// A parameter {whole, rank, ranks}: ZeRO rank `rank`'s shard of a tensor of shape `whole`,
/// f32[ceil(N / ranks)] (InferCollectives.cpp).
llvm::Error checkShardOfWhole(const TensorType &type, const AttrMap &attrs);

} // namespace tgc::infer
