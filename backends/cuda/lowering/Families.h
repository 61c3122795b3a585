// The kernel families of the GPU lowering: one emitter a family, each in its own file beside
// the others in this folder and instantiating the templates of one header of
// backends/cuda/kernels. Families.cpp says which family lowers each op of ir/Ops.def.
#pragma once

#include "backends/cuda/lowering/Emitter.h"

namespace tgc {

llvm::Error emitElementwise(const Op &op, Emitter &e); // Elementwise.cpp: elementwise.cuh, embedding.cuh
llvm::Error emitLayout(const Op &op, Emitter &e);      // Layout.cpp: layout.cuh
llvm::Error emitNorm(const Op &op, Emitter &e);        // Norms.cpp: norms.cuh
llvm::Error emitSoftmax(const Op &op, Emitter &e);     // Softmax.cpp: softmax.cuh
llvm::Error emitLoss(const Op &op, Emitter &e);        // Loss.cpp: loss.cuh
llvm::Error emitReduction(const Op &op, Emitter &e);   // Reduce.cpp: reduce.cuh, embedding.cuh
llvm::Error emitOptimizer(const Op &op, Emitter &e);   // Optimizer.cpp: optimizer.cuh
llvm::Error emitFp8(const Op &op, Emitter &e);         // Fp8.cpp: fp8.cuh
llvm::Error emitAttention(const Op &op, Emitter &e);   // Attention.cpp: attention.cuh (or cuDNN)
llvm::Error emitDecode(const Op &op, Emitter &e);      // Decode.cpp: decode.cuh
llvm::Error emitGemv(const Op &op, Emitter &e);        // Gemv.cpp: gemv.cuh
llvm::Error emitResidualNormGemv(const Op &op, Emitter &e); // Gemv.cpp: gemv.cuh

/// How the GPU runs an op kind: by a kernel family's launches, as a cuBLASLt GEMM, bound or
/// aliased by the executor, or not at all (a fused op the GPU pipeline expands first).
// NotYet: an op the CPU interpreter runs and the GPU has no kernel for yet (a clear error).
enum class GpuLowering { Family, Gemm, Leaf, Alias, Assign, Collective, Expanded, NotYet };
struct GpuLoweringInfo {
  GpuLowering how = GpuLowering::Expanded;
  const char *where = nullptr; // the emitter's file (Family), the library, or the expanding pass
  /// The family's emitter (for a GEMM: of its few-row form, a GEMV); null where none writes kernels.
  llvm::Error (*emit)(const Op &, Emitter &) = nullptr;
};
/// Which way the GPU lowers ops of `kind`; every kind of ir/Ops.def has an entry (the switch in
/// Families.cpp has no default, and -Werror=switch makes a missing one a build error).
GpuLoweringInfo gpuLoweringOf(OpKind kind);

/// Writes op `op`'s kernels with its family's emitter.
llvm::Error emitOp(const Op &op, Emitter &e);

} // namespace tgc
