#include "backends/cuda/runtime/Gemms.h"

#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/runtime/CudaCheck.h"
#include "backends/cuda/runtime/GemmTuning.h"
#include "backends/cuda/libraries/Nvrtc.h"
#include "ir/Attributes.h"

#include <fmt/format.h>

namespace tgc {

namespace {

cudaDataType_t cudaTypeOf(DType dtype) {
  switch (dtype) {
  case DType::F8E4M3:
    return CUDA_R_8F_E4M3;
  case DType::F8E5M2:
    return CUDA_R_8F_E5M2;
  default:
    return CUDA_R_32F;
  }
}

/// An FP8 GEMM's operand scales: each quantize's scale_inv, or under block scaling its block
/// scales (q's, or its transpose's where the operand is q^T), 1 x 128 (VEC128) or 128 x 128
/// (BLK128x128), in the layouts the cast wrote.
llvm::Error setFp8Scales(const CublasLtApi &blas, cublasLtMatmulDesc_t desc, const Op &op,
                         const llvm::DenseMap<const Op *, float *> &scaleInv, const BlockScaleMap &blockScales) {
  const Op *firstQuantize = quantizeOf(op.operand(1)), *secondQuantize = quantizeOf(op.operand(0));
  if (!firstQuantize || !secondQuantize)
    return cudaFailure("planGemm", __FILE__, __LINE__,
                       fmt::format("the FP8 GEMM %{} reads a value no quantize op produced",
                                   op.result()->name()));
  const void *firstScale = scaleInv.lookup(firstQuantize);
  const void *secondScale = scaleInv.lookup(secondQuantize);
  if (!firstScale || !secondScale) // (cuBLASLt would take a null scale as 1)
    return cudaFailure("planGemm", __FILE__, __LINE__,
                       fmt::format("the FP8 GEMM %{} reads bytes whose quantize has no scale_inv yet",
                                   op.result()->name()));
  auto blockScale = [&](const Op *quantize, const Value *operand, const void *&pointer,
                        cublasLtMatmulDescAttributes_t mode) -> llvm::Error {
    if (!blockScales.count(quantize))
      return llvm::Error::success();
    auto [rowwise, transposed] = blockScales.lookup(quantize);
    pointer = isQuantizeTranspose(*quantize, operand) ? transposed : rowwise;
    int32_t value = quantizeOptions(quantize->attrs()).blockRows == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                                       : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    CUBLAS_CHECK(blas.matmulDescSetAttribute(desc, mode, &value, sizeof value));
    return llvm::Error::success();
  };
  if (auto err = blockScale(firstQuantize, op.operand(1), firstScale, CUBLASLT_MATMUL_DESC_A_SCALE_MODE))
    return err;
  if (auto err = blockScale(secondQuantize, op.operand(0), secondScale, CUBLASLT_MATMUL_DESC_B_SCALE_MODE))
    return err;
  CUBLAS_CHECK(blas.matmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &firstScale, sizeof firstScale));
  CUBLAS_CHECK(blas.matmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &secondScale, sizeof secondScale));
  return llvm::Error::success();
}

} // namespace

GemmRunner::~GemmRunner() {
  for (GemmPlan &p : plans_) {
    if (p.desc)
      blas_->matmulDescDestroy(p.desc);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
      if (l)
        blas_->matrixLayoutDestroy(l);
  }
  if (lt_)
    blas_->destroy(lt_);
}

llvm::Error GemmRunner::open(DeviceMemory &memory, size_t ops) {
  auto blas = loadCublasLt();
  if (!blas)
    return blas.takeError();
  blas_ = *blas;
  if (blas_->create(&lt_) != CUBLAS_STATUS_SUCCESS)
    return cudaFailure("cublasLtCreate", __FILE__, __LINE__, "no cuBLASLt handle");
  auto workspace = memory.allocate(kWorkspaceBytes, false, "cuBLASLt workspace");
  if (!workspace)
    return workspace.takeError();
  workspace_ = *workspace;
  plans_.resize(ops);
  return llvm::Error::success();
}

llvm::Error GemmRunner::setBias(size_t i, const void *bias) {
  CUBLAS_CHECK(blas_->matmulDescSetAttribute(plans_[i].desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  return llvm::Error::success();
}

void GemmRunner::pointers(const Op &op, const GemmPlan &plan, const BufferMap &buffers, void *&first, void *&second,
                          void *&c) const {
  c = buffers.lookup(op.result());
  first = plan.bf16 ? plan.bf16Operands[1] : buffers.lookup(op.operand(1));
  second = plan.bf16 ? plan.bf16Operands[0] : buffers.lookup(op.operand(0));
}

llvm::Error GemmRunner::plan(size_t i, const Op &op, const CudaProgram &program, const BufferMap &buffers,
                             const llvm::DenseMap<const Op *, float *> &scaleInv, const BlockScaleMap &blockScales,
                             const std::string &device) {
  GemmPlan &plan = plans_[i];
  // Row-major C[M,N] = opA(A) opB(B) is column-major C^T = opB(B)^T opA(A)^T: cuBLASLt's first
  // operand is B, its second A (see the README's note on layouts).
  const TensorType &a = op.operand(0)->type(), &b = op.operand(1)->type(), &c = op.result()->type();
  bool biasGelu = op.kind() == OpKind::MatMulBiasGelu; // x @ w^T + bias, then GELU
  bool bias = biasGelu || op.kind() == OpKind::MatMulBias;  // x @ w^T + bias
  bool dgelu = op.kind() == OpKind::MatMulDGelu;           // gelu_backward(a b, h)
  // CudaProgram::bf16Rounding: the bias is the parameter's BF16 copy (set once the executor's
  // copy exists); the output (and h) in BF16 where the program stores it so, otherwise fp32.
  bool bf16Bias = addsBf16Bias(program, op);
  bool bf16Out = program.bf16Stored.count(op.result(0));
  cudaDataType_t outType = bf16Out ? CUDA_R_16BF : CUDA_R_32F;
  MatMulLayout layout = matmulLayout(op.attrs());
  bool ta = layout.transposeA, tb = bias || layout.transposeB;
  int64_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  int64_t batches = c.numElements() / (m * n);
  bool sharedB = b.rank() == 2 && batches > 1;
  if (sharedB && !ta) { // [..., M, K] rows against one [K, N] (or [N, K]): one GEMM of all rows
    m *= batches;
    batches = 1;
    sharedB = false;
  }
  if ((biasGelu || dgelu) && batches > 1)
    return cudaFailure("planGemm", __FILE__, __LINE__,
                       fmt::format("%{}: a GELU epilogue over {} batches of products", op.result()->name(), batches));
  // BF16: BF16 operands, fp32 accumulation and output (gemm_dtype). FP8: the operands' own
  // types, fp32 accumulation and output, each operand scaled by its quantize's scale_inv.
  plan.bf16 = hasBf16Gemms(op.attrs());
  bool fp8 = isFp8(a.dtype);
  cudaDataType_t firstType = plan.bf16 ? CUDA_R_16BF : cudaTypeOf(b.dtype);
  cudaDataType_t secondType = plan.bf16 ? CUDA_R_16BF : cudaTypeOf(a.dtype);
  CUBLAS_CHECK(blas_->matmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (fp8)
    if (auto err = setFp8Scales(*blas_, plan.desc, op, scaleInv, blockScales))
      return err;
  // A matmul_bias_gelu whose pre-activation nothing reads: GELU_BIAS, no aux.
  const bool aux = biasGelu && !program.geluWithoutAux.count(&op);
  if (bias) {
    // D = x w^T + bias, or GELU of it (the tanh form) with the pre-activation into the second
    // result (the backward reads it): no separate bias-add and GELU kernels.
    cublasLtEpilogue_t epilogue = aux        ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : biasGelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                             : CUBLASLT_EPILOGUE_BIAS;
    const void *biasPointer = buffers.lookup(op.operand(2));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasPointer, sizeof biasPointer));
    if (bf16Bias) { // an fp32 D takes an fp32 bias unless told
      int32_t biasType = CUDA_R_16BF;
      CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType));
    }
  }
  if (dgelu) {
    // D = (a b) * gelu'(h), h the pre-activation the forward's epilogue kept (D's layout).
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DGELU;
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  }
  if (aux || dgelu) {
    void *auxPointer = buffers.lookup(biasGelu ? op.result(1) : op.operand(2));
    int64_t auxLd = n;
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &auxPointer,
                                               sizeof auxPointer));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof auxLd));
  }
  cublasOperation_t opFirst = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opSecond = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof opFirst));
  CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof opSecond));
  // The first operand (B) as stored: [K,N] row-major is N x K column-major, [N,K] is K x N.
  uint64_t firstRows = tb ? k : n, firstCols = tb ? n : k;
  uint64_t secondRows = ta ? m : k, secondCols = ta ? k : m;
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.a, firstType, firstRows, firstCols, firstRows));
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.b, secondType, secondRows, secondCols, secondRows));
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.c, outType, n, m, n));
  if (batches > 1) {
    int32_t count = int32_t(batches);
    int64_t strideFirst = sharedB ? 0 : k * n, strideSecond = m * k, strideC = m * n;
    for (auto [layout, stride] : {std::pair{plan.a, strideFirst}, std::pair{plan.b, strideSecond},
                                  std::pair{plan.c, strideC}}) {
      CUBLAS_CHECK(blas_->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      CUBLAS_CHECK(blas_->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  // The algorithm is chosen once here and reused every step.
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(blas_->matmulPreferenceCreate(&preference));
  size_t workspace = kWorkspaceBytes;
  CUBLAS_CHECK(blas_->matmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
  cublasStatus_t status = blas_->matmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                                         preference, 8, results, &found);
  blas_->matmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0)
    return cudaFailure("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
                       fmt::format("no algorithm for %{} ({}x{}x{}, batch {})", op.result()->name(), m, k, n, batches));
  for (int r = 0; r < found; ++r)
    plan.candidates.push_back(results[r].algo);
  plan.algo = plan.candidates[0];
  // The device's name and architecture (not its index) and the library's version.
  plan.key = fmt::format("{} cublasLt {}: {}x{}x{} batch {}{}, {} {}, {}{}{}{}{}", device, blas_->getVersion(),
                         m, k, n, batches, sharedB ? " (shared B)" : "", ta ? "T" : "N", tb ? "T" : "N",
                         plan.bf16 ? "bf16" : fp8 ? "fp8" : "f32", bias ? " bias" : "",
                         aux ? " gelu" : biasGelu ? " gelu (no aux)" : "",
                         dgelu ? " dgelu" : "", bf16Out ? " bf16 out" : "");
  return llvm::Error::success();
}

llvm::Error GemmRunner::tune(const std::vector<Op *> &ops, const BufferMap &buffers,
                             const llvm::DenseSet<const Value *> &inPlace, cudaStream_t stream) {
  GemmTuner tuner(kernelCacheDir() + "/gemm-algorithms.txt");
  if (!tuner.enabled())
    return llvm::Error::success();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < ops.size(); ++i) {
    GemmPlan &plan = plans_[i];
    // A result written into the state it updates is never written by a trial.
    if (plan.candidates.size() < 2 || inPlace.count(ops[i]->result()))
      continue;
    void *first, *second, *c;
    pointers(*ops[i], plan, buffers, first, second, c);
    auto time = [&](int candidate) -> llvm::Expected<float> {
      const cublasLtMatmulAlgo_t *algo = &plan.candidates[size_t(candidate)];
      auto once = [&] {
        return blas_->matmul(lt_, plan.desc, &alpha, first, plan.a, second, plan.b, &beta, c, plan.c, c, plan.c,
                              algo, workspace_, kWorkspaceBytes, stream);
      };
      for (int warm = 0; warm < 2; ++warm)
        if (once() != CUBLAS_STATUS_SUCCESS)
          return 1e30f; // a candidate that does not run is never chosen
      CUDA_CHECK(cudaEventRecord(start, stream));
      for (int run = 0; run < 5; ++run)
        once();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return ms;
    };
    auto choice = tuner.choose(plan.key, int(plan.candidates.size()), time);
    if (!choice)
      return choice.takeError();
    plan.algo = plan.candidates[size_t(*choice)];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  tuner.save();
  return llvm::Error::success();
}

llvm::Error GemmRunner::run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream,
                            llvm::function_ref<llvm::Error(const void *, void *, int64_t)> convert) {
  const GemmPlan &plan = plans_[i];
  float alpha = 1.0f, beta = 0.0f;
  if (plan.bf16)
    for (int k = 0; k < 2; ++k)
      if (!plan.fromWeightCopy[k] && !plan.written[k])
        if (auto err = convert(buffers.lookup(op.operand(k)), plan.bf16Operands[k], op.operand(k)->type().numElements()))
          return err;
  void *first, *second, *c;
  pointers(op, plan, buffers, first, second, c);
  CUBLAS_CHECK(blas_->matmul(lt_, plan.desc, &alpha, first, plan.a, second, plan.b, &beta, c, plan.c, c, plan.c,
                             &plan.algo, workspace_, kWorkspaceBytes, stream));
  return llvm::Error::success();
}

} // namespace tgc
