// A measurement behind [train-speed] (BENCHMARKS.md, session 17): (1) the bias gradient as the
// wgrad product's BGRADB epilogue (BF16 operands, fp32 dW and db) against the product alone, at
// the qkv and fc1 weight gradients of gpt2-124m, gpt2-350m and gpt-1.3b (16384 rows summed);
// (2) FP8 products (E4M3 x E4M3 forward, E5M2 x E4M3 dgrad, cuBLASLt's TN layout) writing BF16
// through the BIAS, GELU_AUX_BIAS and DGELU epilogues against fp32 outputs. Constant operands;
// the best of the heuristic's algorithms, 20 runs each. Not part of the build. Built here and run
// on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o gemm-epilogues-2 bench/gemm-epilogues-2.cu -lcublasLt && ./gemm-epilogues-2
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#define CK(x) do { auto s = (x); if (s) { printf("  %s -> %d\n", #x, int(s)); return -1.0f; } } while (0)
cublasLtHandle_t lt; void *ws; size_t wsBytes = 32 << 20;
struct Operand { cudaDataType_t type; cublasOperation_t op; uint64_t rows, cols; void *p; };
// D (n x m, column-major) = op(A) op(B), k the shared dimension; epilogue pointers where given.
float run(const char *name, cublasLtEpilogue_t epi, Operand A, Operand B, cudaDataType_t dType, int n, int m, int k,
          void *D, void *bias, cudaDataType_t biasType, void *aux, cudaDataType_t auxType) {
  cublasLtMatmulDesc_t desc; CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &A.op, sizeof A.op));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &B.op, sizeof B.op));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  if (bias) {
    int32_t t = biasType;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
  }
  if (aux) {
    int64_t ld = n; int32_t t = auxType;
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof t));
  }
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, A.type, A.rows, A.cols, A.rows));
  CK(cublasLtMatrixLayoutCreate(&lb, B.type, B.rows, B.cols, B.rows));
  CK(cublasLtMatrixLayoutCreate(&ld, dType, n, m, n));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t res[8]; int found = 0;
  auto st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &found);
  if (st || !found) { printf("%-52s n%d m%d k%d: heuristic status %d, found %d\n", name, n, m, k, int(st), found); return -1; }
  float alpha = 1, beta = 0, best = 1e9; int bestI = -1;
  for (int i = 0; i < found; ++i) {
    auto once = [&] { return cublasLtMatmul(lt, desc, &alpha, A.p, la, B.p, lb, &beta, D, ld, D, ld, &res[i].algo, ws, wsBytes, 0); };
    if (once()) continue;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0); for (int r = 0; r < 20; ++r) once(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 20; if (ms < best) { best = ms; bestI = i; }
  }
  auto err = cudaDeviceSynchronize();
  printf("%-52s n%d m%d k%d: %d algos, best %.4f ms (#%d) %s\n", name, n, m, k, found, best, bestI, cudaGetErrorString(err));
  return best;
}
int main() {
  cublasLtCreate(&lt); cudaMalloc(&ws, wsBytes);
  const int M = 16384;
  for (int C : {768, 1024, 2048}) {
    size_t big = size_t(M) * 4 * C;
    void *X, *Y, *W, *D, *bias, *aux;
    cudaMalloc(&X, big * 2); cudaMalloc(&Y, big * 2); cudaMalloc(&W, size_t(16) * C * C); cudaMalloc(&D, big * 4);
    cudaMalloc(&bias, 4 * C * 4); cudaMalloc(&aux, big * 2);
    cudaMemset(X, 0x3c, big * 2); cudaMemset(Y, 0x3c, big * 2); cudaMemset(W, 0x30, size_t(16) * C * C);
    cudaMemset(bias, 0, 4 * C * 4); cudaMemset(aux, 0, big * 2);
    // (1) wgrad dW[Nout, C] = dy[M, Nout]^T x[M, C]: D = C x Nout, A = x (C x M, N), B = dy (Nout x M, T).
    for (int Nout : {3 * C, 4 * C}) {
      Operand x{CUDA_R_16BF, CUBLAS_OP_N, uint64_t(C), uint64_t(M), X}, dy{CUDA_R_16BF, CUBLAS_OP_T, uint64_t(Nout), uint64_t(M), Y};
      run("wgrad bf16 d=f32 (today, then a column sum)", CUBLASLT_EPILOGUE_DEFAULT, x, dy, CUDA_R_32F, C, Nout, M, D, nullptr, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("wgrad bf16 BGRADB d=f32 db=f32", CUBLASLT_EPILOGUE_BGRADB, x, dy, CUDA_R_32F, C, Nout, M, D, bias, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("wgrad bf16 BGRADB d=f32 db=bf16", CUBLASLT_EPILOGUE_BGRADB, x, dy, CUDA_R_32F, C, Nout, M, D, bias, CUDA_R_16BF, nullptr, CUDA_R_32F);
    }
    // (2) FP8 forward D[Nout, M] = W[Nout, C] (T) x[M, C]: A = W (C x Nout, T), B = x (C x M, N).
    for (int Nout : {3 * C, 4 * C}) {
      Operand w{CUDA_R_8F_E4M3, CUBLAS_OP_T, uint64_t(C), uint64_t(Nout), W}, x{CUDA_R_8F_E4M3, CUBLAS_OP_N, uint64_t(C), uint64_t(M), X};
      run("fwd fp8 d=f32 (today, then a bias add)", CUBLASLT_EPILOGUE_DEFAULT, w, x, CUDA_R_32F, Nout, M, C, D, nullptr, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("fwd fp8 d=bf16", CUBLASLT_EPILOGUE_DEFAULT, w, x, CUDA_R_16BF, Nout, M, C, D, nullptr, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("fwd fp8 BIAS d=bf16 bias=bf16", CUBLASLT_EPILOGUE_BIAS, w, x, CUDA_R_16BF, Nout, M, C, D, bias, CUDA_R_16BF, nullptr, CUDA_R_32F);
      run("fwd fp8 GELU_AUX_BIAS d=bf16 aux=bf16 bias=bf16", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, w, x, CUDA_R_16BF, Nout, M, C, D, bias, CUDA_R_16BF, aux, CUDA_R_16BF);
    }
    // FP8 dgrad of fc2 dh[M, 4C] = dy[M, C] W2t[4C, C]^T: A = W2t (C x 4C, T) E4M3, B = dy (C x M, N) E5M2.
    {
      Operand w{CUDA_R_8F_E4M3, CUBLAS_OP_T, uint64_t(C), uint64_t(4 * C), W}, dy{CUDA_R_8F_E5M2, CUBLAS_OP_N, uint64_t(C), uint64_t(M), Y};
      run("dgrad fp8 d=f32 (today, then the GELU's gradient)", CUBLASLT_EPILOGUE_DEFAULT, w, dy, CUDA_R_32F, 4 * C, M, C, D, nullptr, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("dgrad fp8 d=bf16", CUBLASLT_EPILOGUE_DEFAULT, w, dy, CUDA_R_16BF, 4 * C, M, C, D, nullptr, CUDA_R_32F, nullptr, CUDA_R_32F);
      run("dgrad fp8 DGELU d=bf16 aux=bf16", CUBLASLT_EPILOGUE_DGELU, w, dy, CUDA_R_16BF, 4 * C, M, C, D, nullptr, CUDA_R_32F, aux, CUDA_R_16BF);
    }
    cudaFree(X); cudaFree(Y); cudaFree(W); cudaFree(D); cudaFree(bias); cudaFree(aux);
  }
}
