// The storage rules (StorageRules.cpp): where each value of a lowered program lives in BF16
// rather than fp32, chosen before any kernel is written. lowerToCuda calls them in this order:
// chooseBf16Caches and chooseBf16Heads before the parameter layout, the others after it.
#pragma once

#include "backends/cuda/CudaProgram.h"

namespace tgc {

/// The KV caches only BF16 writes and BF16 decode attention read: stored in BF16.
void chooseBf16Caches(const Graph &graph, CudaProgram &program);
/// The head-major q, k, v an attention keeps for its gradient: stored in BF16.
llvm::Error chooseBf16Heads(const Graph &graph, CudaProgram &program);
/// Every FP8 matmul_bias adds its bias's BF16 copy (cuBLASLt's FP8 epilogues take no other).
llvm::Error chooseFp8Biases(const Graph &graph, CudaProgram &program);
/// CudaProgram::bf16Rounding, by the rules of kRoundingRules (LoweringOptions::bf16Rounding).
void chooseBf16Rounding(const Graph &graph, CudaProgram &program);
/// The operands cuDNN's attentions read where their GEMMs wrote them (qkvRows, doutRows).
llvm::Error chooseCudnnRows(const Graph &graph, const LoweringOptions &options, CudaProgram &program);
/// The values the producers of BF16 GEMM operands write in BF16: bf16Stored where only BF16
/// GEMMs read them, bf16Shadowed where others read the fp32 form too.
void chooseBf16Values(const Graph &graph, CudaProgram &program);

} // namespace tgc
