// A measurement behind [train-speed] (BENCHMARKS.md, session 16): which of cuBLASLt's GELU
// epilogues run with BF16 outputs on this GPU, and how fast, at the MLP's shapes of gpt2-124m,
// gpt2-350m and gpt-1.3b (16384 rows): fc1 with BIAS or GELU_AUX_BIAS, fc2's dgrad with DGELU or
// DGELU_BGRAD, each output, bias and aux type tgc could pick. Constant operands; the best of the
// heuristic's algorithms, 20 runs each. Not part of the build. Built here and run on the GPU
// machine:
//   nvcc -O2 -arch=sm_90 -o gelu-epilogues bench/gelu-epilogues.cu -lcublasLt && ./gelu-epilogues
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#define CK(x) do { auto s = (x); if (s) { printf("  %s -> %d\n", #x, int(s)); return -1.0f; } } while (0)
cublasLtHandle_t lt; void *ws; size_t wsBytes = 32 << 20;
struct Cfg { const char *name; cublasLtEpilogue_t epi; cudaDataType_t d, bias, aux; bool setBias, setAux; bool fwd; };
float run(const Cfg &c, int M, int N, int K, void *A, void *B, void *D, void *bias, void *aux) {
  cublasLtMatmulDesc_t desc; CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = c.fwd ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi, sizeof c.epi));
  if (bias) CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (c.setBias) { int32_t t = c.bias; CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t)); }
  if (aux) { int64_t ld = N; CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld)); }
  if (c.setAux) { int32_t t = c.aux; CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &t, sizeof t)); }
  // D^T [N, M] col-major. fwd: A = W [N,K] row-major -> op T of col-major KxN; bwd: A = W2 [K,N] row-major -> col-major N x K op N.
  cublasLtMatrixLayout_t la, lb, ld;
  if (c.fwd) CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K)); else CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, K, N));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&ld, c.d, N, M, N));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t res[8]; int found = 0;
  auto st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, res, &found);
  if (st || !found) { printf("%-44s heuristic status %d found %d\n", c.name, int(st), found); return -1; }
  float alpha = 1, beta = 0, best = 1e9; int bestI = -1;
  for (int i = 0; i < found; ++i) {
    auto once = [&] { return cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res[i].algo, ws, wsBytes, 0); };
    if (once()) continue;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0); for (int r = 0; r < 20; ++r) once(); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); ms /= 20; if (ms < best) { best = ms; bestI = i; }
  }
  auto err = cudaDeviceSynchronize();
  printf("%-44s M%d N%d K%d: %d algos, best %.4f ms (#%d) %s\n", c.name, M, N, K, found, best, bestI, cudaGetErrorString(err));
  return best;
}
int main() {
  cublasLtCreate(&lt); cudaMalloc(&ws, wsBytes);
  for (int C : {768, 1024, 2048}) {
    int M = 16384, N = 4 * C, K = C; size_t big = size_t(M) * N;
    void *A, *B, *D, *bias, *aux;
    cudaMalloc(&A, size_t(N) * K * 2); cudaMalloc(&B, size_t(M) * N * 2); cudaMalloc(&D, big * 4); cudaMalloc(&bias, N * 4); cudaMalloc(&aux, big * 4);
    cudaMemset(A, 0x3c, size_t(N) * K * 2); cudaMemset(B, 0x3c, size_t(M) * N * 2); cudaMemset(bias, 0, N * 4); cudaMemset(aux, 0, big * 4);
    std::vector<Cfg> fwd = {
      {"fwd BIAS d=f32 (today)", CUBLASLT_EPILOGUE_BIAS, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false, false, true},
      {"fwd BIAS d=bf16 bias=bf16", CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false, false, true},
      {"fwd BIAS d=bf16 bias=f32", CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF, CUDA_R_32F, CUDA_R_16BF, true, false, true},
      {"fwd GELU_AUX_BIAS d=f32 aux=f32", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false, false, true},
      {"fwd GELU_AUX_BIAS d=bf16 aux=bf16 bias=bf16", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false, false, true},
      {"fwd GELU_AUX_BIAS d=bf16 aux=bf16 bias=f32", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF, CUDA_R_32F, CUDA_R_16BF, true, false, true},
      {"fwd GELU_AUX_BIAS d=bf16 aux=f32 bias=f32", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, true, true, true},
      {"fwd GELU_AUX_BIAS d=f32 aux=bf16", CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, false, true, true},
    };
    for (auto &c : fwd) run(c, M, N, K, A, B, D, bias, c.epi == CUBLASLT_EPILOGUE_BIAS ? nullptr : aux);
    // Backward: dgrad of fc2 -> [M, 4C], K = C.
    std::vector<Cfg> bwd = {
      {"bwd DEFAULT d=f32 (today)", CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false, false, false},
      {"bwd DEFAULT d=bf16", CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, false, false, false},
      {"bwd DGELU d=bf16 aux=bf16", CUBLASLT_EPILOGUE_DGELU, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false, false, false},
      {"bwd DGELU_BGRAD d=bf16 aux=bf16 bgrad=bf16", CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, false, false, false},
      {"bwd DGELU_BGRAD d=bf16 aux=bf16 bgrad=f32", CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_16BF, CUDA_R_32F, CUDA_R_16BF, true, false, false},
      {"bwd DGELU d=f32 aux=bf16", CUBLASLT_EPILOGUE_DGELU, CUDA_R_32F, CUDA_R_32F, CUDA_R_16BF, false, true, false},
      {"bwd DGELU_BGRAD d=f32 aux=f32", CUBLASLT_EPILOGUE_DGELU_BGRAD, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, false, false, false},
    };
    for (auto &c : bwd) run(c, M, N, K, A, B, D, c.epi == CUBLASLT_EPILOGUE_DGELU_BGRAD ? bias : nullptr, c.epi == CUBLASLT_EPILOGUE_DEFAULT ? nullptr : aux);
    cudaFree(A); cudaFree(B); cudaFree(D); cudaFree(bias); cudaFree(aux);
  }
}
