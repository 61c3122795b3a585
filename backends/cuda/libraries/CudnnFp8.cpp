// cuDNN's FP8 fused attention (CudnnFp8), forward and gradient, built through the backend API as
// cudnn_frontend's SDPA FP8 nodes give it to cuDNN (scaled_dot_product_flash_attention.h with
// FP8 operands, sdpa_fp8_bwd.h): cuDNN's runtime fusion engine recognises these patterns only,
// so the order of the scales and the amaxes below is theirs. BF16 out and dq, dk, dv with FP8
// q, k, v and dout are what Transformer Engine's current-scaling FP8 attention asks cuDNN for on
// Hopper (its fused_attn_fp8.cu: O and dQKV "in F16", their scales 1).
#include "backends/cuda/libraries/CudnnGraph.h"

namespace tgc {

int cudnnDataType(CudnnType t) {
  switch (t) {
  case CudnnType::Bf16:
    return cudnn::Bf16;
  case CudnnType::E4M3:
    return cudnn::Fp8E4M3;
  case CudnnType::E5M2:
    return cudnn::Fp8E5M2;
  }
  return cudnn::Bf16;
}

namespace {

/// c = (a b) descaleA descaleB scaleC in c's type, and amax = max |(a b) descaleA descaleB|:
/// cudnn_frontend's matmul_fp8 node.
void matmulFp8(GraphBuilder &g, void *a, void *b, const Dims &cDims, const Dims &cStrides, void *descaleA,
               void *descaleB, void *scaleC, void *c, void *amax) {
  void *product = g.intermediate(cDims, cStrides, cudnn::Float);
  g.matmul(a, b, product);
  void *once = g.intermediate(cDims, cStrides, cudnn::Float), *twice = g.intermediate(cDims, cStrides, cudnn::Float);
  g.pointwise(cudnn::Mul, product, descaleA, once);
  g.pointwise(cudnn::Mul, once, descaleB, twice);
  g.pointwise(cudnn::Mul, twice, scaleC, c);
  g.reduction(cudnn::ReduceAmax, twice, amax);
}

/// The scores dequantized (scaled, then times q's and k's descales) and causally masked.
void *maskedScores(GraphBuilder &g, const AttentionLayout &l, void *descaleQ, void *descaleK) {
  void *once = g.intermediate(l.scoreDims), *twice = g.intermediate(l.scoreDims);
  g.pointwise(cudnn::Mul, l.scaled, descaleQ, once);
  g.pointwise(cudnn::Mul, once, descaleK, twice);
  return causalMask(g, twice, l.scoreDims, l.negativeInfinity);
}

} // namespace

std::vector<int64_t> fp8ForwardUids() {
  return {UidQ,        UidK,        UidV,        UidO,      UidStats,  UidDescaleQ, UidDescaleK,
          UidDescaleV, UidDescaleS, UidScaleS,   UidScaleO, UidAmaxS,  UidAmaxO};
}

std::vector<int64_t> fp8BackwardUids() {
  return {UidQ,        UidK,         UidV,        UidO,        UidDO,      UidStats,   UidDQ,
          UidDK,       UidDV,        UidDescaleQ, UidDescaleK, UidDescaleV, UidDescaleO, UidDescaleDO,
          UidDescaleS, UidDescaleDP, UidScaleS,   UidScaleDP,  UidScaleDQ, UidScaleDK, UidScaleDV,
          UidAmaxDP,   UidAmaxDQ,    UidAmaxDK,   UidAmaxDV};
}

void fp8ForwardGraph(GraphBuilder &g, const AttentionLayout &l, const CudnnAttentionShape &) {
  const Dims &statDims = l.statDims, &scoreDims = l.scoreDims;
  void *descaleQ = g.deviceScalar(UidDescaleQ), *descaleK = g.deviceScalar(UidDescaleK);
  void *descaleV = g.deviceScalar(UidDescaleV), *descaleS = g.deviceScalar(UidDescaleS);
  void *scaleS = g.deviceScalar(UidScaleS), *scaleO = g.deviceScalar(UidScaleO);
  void *amaxS = g.deviceScalar(UidAmaxS), *amaxO = g.deviceScalar(UidAmaxO);
  void *v = g.tensor(UidV, cudnn::Fp8E4M3, l.kvDims, l.kvStrides, false);
  // The softmax as the BF16 graph's (statistics max + log(sum)), then the probabilities' amax
  // and their quantization at S's scale: E4M3, the operand of the product with v.
  void *masked = maskedScores(g, l, descaleQ, descaleK);
  void *probabilities = softmaxWithStats(g, masked, statDims, scoreDims, l.stats, cudnn::Float);
  g.reduction(cudnn::ReduceAmax, probabilities, amaxS);
  void *quantized = g.intermediate(scoreDims, packed(scoreDims), cudnn::Fp8E4M3);
  g.pointwise(cudnn::Mul, probabilities, scaleS, quantized);
  matmulFp8(g, quantized, v, l.rowDims, l.rowStrides, descaleS, descaleV, scaleO, l.out, amaxO);
}

void fp8BackwardGraph(GraphBuilder &g, const AttentionLayout &l, const CudnnAttentionShape &s) {
  const Dims &headDims = l.headDims, &scoreDims = l.scoreDims, &statDims = l.statDims;
  const int64_t H = l.H, T = l.T, DH = l.DH;
  const int gradType = cudnnDataType(s.fp8.grad), dqkvType = cudnnDataType(s.fp8.dqkv);
  void *vT = g.tensor(UidV, cudnn::Fp8E4M3, l.transposedDims, l.transposedStrides, false);
  void *dout = g.tensor(UidDO, gradType, headDims, s.doutRows ? l.rowStrides : l.headStrides, false);
  void *dq = g.tensor(UidDQ, dqkvType, l.rowDims, l.packedStrides, false);
  void *dk = g.tensor(UidDK, dqkvType, l.kvDims, l.packedStrides, false);
  void *dv = g.tensor(UidDV, dqkvType, l.kvDims, l.packedStrides, false);
  void *descaleQ = g.deviceScalar(UidDescaleQ), *descaleK = g.deviceScalar(UidDescaleK);
  void *descaleV = g.deviceScalar(UidDescaleV), *descaleO = g.deviceScalar(UidDescaleO);
  void *descaleDO = g.deviceScalar(UidDescaleDO), *descaleS = g.deviceScalar(UidDescaleS);
  void *descaleDP = g.deviceScalar(UidDescaleDP), *scaleS = g.deviceScalar(UidScaleS);
  void *scaleDP = g.deviceScalar(UidScaleDP), *scaleDQ = g.deviceScalar(UidScaleDQ);
  void *scaleDK = g.deviceScalar(UidScaleDK), *scaleDV = g.deviceScalar(UidScaleDV);
  void *amaxDP = g.deviceScalar(UidAmaxDP), *amaxDQ = g.deviceScalar(UidAmaxDQ);
  void *amaxDK = g.deviceScalar(UidAmaxDK), *amaxDV = g.deviceScalar(UidAmaxDV);
  // sum(dout * out) per query, dequantized.
  void *products = g.intermediate(l.rowDims, {H * T * DH, T * DH, H * DH, 1}, cudnn::Float);
  void *rowSums = g.intermediate(statDims), *rowSumsOnce = g.intermediate(statDims);
  void *softmaxSum = g.intermediate(statDims);
  g.pointwise(cudnn::Mul, dout, l.out, products);
  g.reduction(cudnn::ReduceAdd, products, rowSums);
  g.pointwise(cudnn::Mul, rowSums, descaleDO, rowSumsOnce);
  g.pointwise(cudnn::Mul, rowSumsOnce, descaleO, softmaxSum);
  // The probabilities again from the statistics; quantized at S's scale and transposed, times
  // dout: dv.
  void *masked = maskedScores(g, l, descaleQ, descaleK);
  void *centered = g.intermediate(scoreDims), *probabilities = g.intermediate(scoreDims);
  g.pointwise(cudnn::Sub, masked, l.stats, centered);
  g.pointwise(cudnn::Exp, centered, nullptr, probabilities);
  void *quantized = g.intermediate(scoreDims, packed(scoreDims), cudnn::Fp8E4M3);
  g.pointwise(cudnn::Mul, probabilities, scaleS, quantized);
  Dims transposedScores = {H * T * T, T * T, 1, T};
  void *quantizedT = g.intermediate(scoreDims, transposedScores, cudnn::Fp8E4M3);
  g.reshape(quantized, quantizedT);
  matmulFp8(g, quantizedT, dout, l.kvDims, l.packedStrides, descaleS, descaleDO, scaleDV, dv, amaxDV);
  // dS = P (dout v^T - sum) scale, its amax, quantized at dP's scale to the gradient's type.
  void *dP = g.intermediate(scoreDims), *dPOnce = g.intermediate(scoreDims), *dPTwice = g.intermediate(scoreDims);
  g.matmul(dout, vT, dP);
  g.pointwise(cudnn::Mul, dP, descaleDO, dPOnce);
  g.pointwise(cudnn::Mul, dPOnce, descaleV, dPTwice);
  void *centeredDP = g.intermediate(scoreDims), *dScores = g.intermediate(scoreDims);
  void *dScaled = g.intermediate(scoreDims);
  g.pointwise(cudnn::Sub, dPTwice, softmaxSum, centeredDP);
  g.pointwise(cudnn::Mul, centeredDP, probabilities, dScores);
  g.pointwise(cudnn::Mul, dScores, l.scale, dScaled);
  g.reduction(cudnn::ReduceAmax, dScaled, amaxDP);
  void *dS = g.intermediate(scoreDims, packed(scoreDims), gradType);
  g.pointwise(cudnn::Mul, dScaled, scaleDP, dS);
  // dq = dS k, dk = dS^T q.
  void *k = g.intermediate(l.kvDims, l.kvStrides, cudnn::Fp8E4M3);
  g.reshape(l.kT, k);
  matmulFp8(g, dS, k, l.rowDims, l.packedStrides, descaleDP, descaleK, scaleDQ, dq, amaxDQ);
  void *dST = g.intermediate(scoreDims, transposedScores, gradType);
  g.reshape(dS, dST);
  matmulFp8(g, dST, l.q, l.kvDims, l.packedStrides, descaleDP, descaleQ, scaleDK, dk, amaxDK);
}

} // namespace tgc
