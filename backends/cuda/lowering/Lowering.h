// Lowering to CUDA: every op of a program that is not a GEMM (cuBLASLt), a reshape or a leaf
// becomes one or more launches of a kernel template of backends/cuda/kernels/*.cuh,
// instantiated with the op's shapes by a one-line wrapper (one emitter file per kernel family
// in this folder, dispatched by Families.cpp); ops whose wrappers would be the same text share
// one kernel. Before the kernels are written, the storage rules (StorageRules.cpp) choose which
// values are stored in BF16 and which cuDNN reads in place. The kernels of one program form one
// translation unit, compiled once by NVRTC against the embedded headers.
#pragma once

#include "backends/cuda/CudaProgram.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "ir/Graph.h"

#include <optional>

namespace tgc {

/// The attention cuDNN could run for `op`: an attention or its gradient on BF16 tensor cores at
/// a head dimension cuDNN's flash attention takes (a multiple of 8 up to 128); with qkvRows and
/// doutRows where the operands can be read where their GEMMs write them.
std::optional<CudnnAttentionShape> cudnnAttentionShape(const Graph &graph, const Op &op,
                                                       const LoweringOptions &options = LoweringOptions());

/// Whether cuDNN, running `forward` (an attention keeping its head-major q, k, v) and each of
/// its gradients, can read q, k and v in place from the rows of qkv: with storeBf16 and
/// bf16Rounding, qkv is a BF16 matmul_bias's (bias a parameter) that only `forward` reads, and
/// the copy only head-major gradients read. The executor then plans the forward and all those
/// gradients with CudnnAttentionShape::qkvRows, or none of them with cuDNN. A forward without a
/// gradient (two results: a prefill's, an evaluation's) reads the rows where qkv is that GEMM's
/// and otherwise read only by BF16 kv_writes (the prompt's keys and values into the caches).
bool cudnnReadsQkvRows(const Graph &graph, const Op &forward, const LoweringOptions &options);
/// Whether cuDNN, running `backward`, can read dout where its GEMM writes it: with storeBf16 and
/// bf16Rounding, dout is a BF16 matmul's that only `backward` reads.
bool cudnnReadsDoutRows(const Graph &graph, const Op &backward, const LoweringOptions &options);

/// Whether the GEMM `op` adds its bias from the executor's BF16 copy of the parameters: a
/// matmul_bias or matmul_bias_gelu of CudaProgram::bf16Rounding (cuBLASLt's BF16 and FP8
/// epilogues take a BF16 bias).
bool addsBf16Bias(const CudaProgram &program, const Op &op);

/// Generates the kernels of `graph`, or says which op has no lowering yet.
llvm::Expected<CudaProgram> lowerToCuda(const Graph &graph, LoweringOptions options = LoweringOptions());

} // namespace tgc
