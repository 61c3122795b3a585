// Which kernel family lowers each op (Families.h).
#include "backends/cuda/lowering/Families.h"

namespace tgc {

// An op added to ir/Ops.def without a case here fails the build.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
GpuLoweringInfo gpuLoweringOf(OpKind kind) {
  using G = GpuLowering;
  switch (kind) {
  case OpKind::Input:
  case OpKind::Param:
  case OpKind::State:
    return {G::Leaf, "bound by the executor"};
  case OpKind::Assign:
    return {G::Assign, "a copy when the step ends, or written in place"};
  case OpKind::Reshape:
    return {G::Alias, "the operand's memory"};
  case OpKind::AllReduce:
  case OpKind::ReduceScatter:
  case OpKind::AllGather:
    return {G::Collective, "NCCL (runtime/Collectives.cpp)"};
  case OpKind::Shard:
    return {G::Family, "Layout.cpp", emitLayout};
  case OpKind::MatMul:
  case OpKind::MatMulBias:
  case OpKind::MatMulBiasGelu:
    return {G::Gemm, "cuBLASLt (runtime/Gemms.cpp); Gemv.cpp where few rows", emitGemv};
  case OpKind::MatMulDGelu:
    return {G::Gemm, "cuBLASLt's DGELU epilogue (runtime/Gemms.cpp)"};
  case OpKind::LayerNormLinear:
  case OpKind::LayerNormMLP:
  case OpKind::LayerNormLinearBackward:
  case OpKind::LayerNormMLPBackward:
    return {G::Expanded, "expand-layernorm-fused"};
  case OpKind::Constant:
  case OpKind::Embedding:
  case OpKind::Add:
  case OpKind::Mul:
  case OpKind::Scale:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Swiglu:
  case OpKind::GeluBackward:
  case OpKind::SiluBackward:
  case OpKind::SwigluBackward:
  case OpKind::CausalMask:
  case OpKind::Rope:
    return {G::Family, "Elementwise.cpp", emitElementwise};
  case OpKind::Transpose:
  case OpKind::Concat:
  case OpKind::Slice:
  case OpKind::Pad:
    return {G::Family, "Layout.cpp", emitLayout};
  case OpKind::LayerNorm:
  case OpKind::RMSNorm:
  case OpKind::ResidualNorm:
  case OpKind::LayerNormBackward:
  case OpKind::RMSNormBackward:
    return {G::Family, "Norms.cpp", emitNorm};
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::MaskedSoftmax:
  case OpKind::SoftmaxBackward:
  case OpKind::LogSoftmaxBackward:
  case OpKind::MaskedSoftmaxBackward:
    return {G::Family, "Softmax.cpp", emitSoftmax};
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyBackward:
  case OpKind::NLLLoss:
  case OpKind::NLLLossBackward:
    return {G::Family, "Loss.cpp", emitLoss};
  case OpKind::ReduceTo:
  case OpKind::SumSquares:
  case OpKind::EmbeddingBackward:
    return {G::Family, "Reduce.cpp", emitReduction};
  case OpKind::ClipScale:
  case OpKind::LRSchedule:
  case OpKind::AdamW:
    return {G::Family, "Optimizer.cpp", emitOptimizer};
  case OpKind::Quantize:
  case OpKind::Fp8Update:
    return {G::Family, "Fp8.cpp", emitFp8};
  case OpKind::Attention:
  case OpKind::AttentionBackward:
  case OpKind::Fp8Attention:
  case OpKind::Fp8AttentionBackward:
    return {G::Family, "Attention.cpp", emitAttention};
  case OpKind::KvWrite:
  case OpKind::DecodeAttention:
  case OpKind::Argmax:
  case OpKind::Sample:
    return {G::Family, "Decode.cpp", emitDecode};
  case OpKind::ResidualNormLinear:
    return {G::Family, "Gemv.cpp", emitResidualNormGemv};
  }
  return {};
}
#pragma GCC diagnostic pop

llvm::Error emitOp(const Op &op, Emitter &e) {
  GpuLoweringInfo info = gpuLoweringOf(op.kind());
  return info.emit ? info.emit(op, e) : unsupported(op);
}

} // namespace tgc
