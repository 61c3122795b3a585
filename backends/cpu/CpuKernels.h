// The CPU reference kernels, one per op of ir/Ops.def: eval<Enum>(attributes, operands,
// results). Results arrive zero-filled with their types set. Fused ops are composed from the
// kernels of the ops they replace (CpuFusedKernels.cpp), so that both compute the same function.
#pragma once

#include "backends/Tensor.h"
#include "ir/Graph.h"

namespace tgc::cpu {

using Operands = llvm::ArrayRef<const Tensor *>;
using Results = llvm::MutableArrayRef<Tensor>;

#define OP(Enum, Name, MinOperands, MaxOperands, MaxResults, Gradient, Bf16Out, InPlace)                                       \
  llvm::Error eval##Enum(const AttrMap &attrs, Operands in, Results out);
#include "ir/Ops.def"

/// The GELU's tanh of each element (geluTanhInner), then the GELU (in: x, tanhs) and its
/// gradient (in: dy, x, tanhs) from it: the fused MLP gradient's activation and its gradient
/// of the same h with one tanh an element, the same bits as gelu and gelu_backward.
llvm::Error evalGeluInner(const AttrMap &attrs, Operands in, Results out);
llvm::Error evalGeluOf(const AttrMap &attrs, Operands in, Results out);
llvm::Error evalGeluGradientOf(const AttrMap &attrs, Operands in, Results out);

} // namespace tgc::cpu
