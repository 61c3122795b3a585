// The few-row product family (gemv.cuh): GEMVs on the CUDA cores or tensor cores, and the
// residual norm fused into the GEMV that reads it.
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

namespace {

/// gemmRowsBf16's slices of K (gemv.cuh): 8 (a block of 8 columns), fewer where K has no 8
/// whole steps of 32. (Blocks of 16 columns, which read the rows of x half as often, ran slower:
/// fewer blocks stream the weight. BENCHMARKS.md, session 13.)
int rowsKSplit(int64_t K) {
  int kSplit = 8;
  while (K % (32 * kSplit))
    kSplit /= 2;
  return kSplit;
}

} // namespace

/// A product of few rows against a weight (gemv.cuh): 1 to 8 rows on the CUDA cores, 9 to 64 on
/// tensor cores; matmul_bias_gelu (fuse-gemv-gelu) applies the GELU as it writes.
llvm::Error emitGemv(const Op &op, Emitter &e) {
  const TensorType &w = operandType(op, 1);
  int64_t N = w.dim(0), K = w.dim(1), M = operandType(op, 0).numElements() / K;
  bool bias = op.kind() != OpKind::MatMul, gelu = op.kind() == OpKind::MatMulBiasGelu;
  bool xBf16 = e.program_.bf16Stored.count(op.operand(0));
  e.uses("gemv.cuh");
  e.lowering.bf16Weights = {1};
  std::string params = fmt::format("const {} *x, const unsigned short *w, {}float *out{}", xBf16 ? "unsigned short" : "float",
                                   bias ? "const float *bias, " : "", gelu ? ", float *pre" : "");
  std::string args = fmt::format("x, w, {}, out, {}", bias ? "bias" : "nullptr", gelu ? "pre" : "nullptr");
  if (fewRows(op) == FewRows::Gemv) {
    e.launch(0, params, (N + 7) / 8,
             fmt::format("gemvBf16<{}, {}, {}, {}, {}>({})", M, N, K, boolText(bias), boolText(gelu), args));
  } else {
    int kSplit = rowsKSplit(K), columns = 64 / kSplit;
    e.launch(0, params, (N + columns - 1) / columns,
             fmt::format("gemmRowsBf16<{}, {}, {}, {}, {}, {}>({})", M, N, K, kSplit, boolText(bias), boolText(gelu),
                         args));
  }
  e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

/// residual_norm_linear (fuse-residual-norm-gemv): a GEMV whose blocks normalise the rows they
/// read (gemv.cuh), with the GELU after the product where there is one.
llvm::Error emitResidualNormGemv(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  bool layer = isLayerNorm(a), bias = a.getBool("bias").value_or(false), gelu = a.getString(kActivation) == "gelu";
  bool swiglu = a.getString(kActivation) == "swiglu";
  unsigned weight = layer ? 4 : 3;
  const TensorType &w = operandType(op, weight);
  // (Under SwiGLU the outputs are half the weight's rows: gate and up, a warp each pair.)
  int64_t N = swiglu ? w.dim(0) / 2 : w.dim(0), K = w.dim(1), M = operandType(op, 0).numElements() / K;
  e.uses("gemv.cuh");
  // A parameter's weight is read from its BF16 copy. Another weight (a test's input) is first
  // rounded into BF16 scratch by launch 0.
  const Value *wv = op.operand(weight);
  bool param = wv->def() && wv->def()->kind() == OpKind::Param;
  if (param)
    e.lowering.bf16Weights = {weight};
  else
    e.lowering.scratchFloats = {(w.numElements() + 1) / 2};
  std::string params = fmt::format("const float *a, const float *b, const float *gamma, {}const {} *w, "
                                   "{}float *sum, float *out{}",
                                   layer ? "const float *beta, " : "", param ? "unsigned short" : "float",
                                   bias ? "const float *bias, " : "", param ? "" : ", float *scratch");
  unsigned launch = 0;
  if (!param)
    e.launch(launch++, params, elementwiseBlocks(w.numElements()),
             fmt::format("roundToBf16(w, (unsigned short *)scratch, {})", w.numElements()));
  e.launch(launch, params, (N + 7) / 8,
           fmt::format("residualNormGemvBf16<{}, {}, {}, {}, {}, {}{}>(a, b, gamma, {}, {}, {}, sum, out, {})",
                       boolText(layer), M, N, K, boolText(bias), boolText(gelu), swiglu ? ", true" : "",
                       layer ? "beta" : "nullptr",
                       param ? "w" : "(const unsigned short *)scratch", bias ? "bias" : "nullptr",
                       formatDouble(*a.getFloat("eps"))));
  if (param)
    e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

} // namespace tgc
