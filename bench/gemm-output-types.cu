// A measurement behind [train-speed] (BENCHMARKS.md, session 8): gpt2-124m's GEMM shapes on
// cuBLASLt as tgc plans them (BF16 operands, fp32 sums), with an fp32 output (tgc today) and
// a BF16 output, the heuristic's first algorithm against the fastest of its first eight. Not
// part of the build. Built here and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o gemm-types bench/gemm-output-types.cu -lcublasLt && ./gemm-types
#include "bench.cuh"

struct Case { const char *name; long m, n, k; bool ta, tb; };

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t wsBytes = 32 << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsBytes));
  const long M = 16384;
  Case cases[] = {
      {"qkv fwd", M, 2304, 768, false, true},   {"proj fwd", M, 768, 768, false, true},
      {"fc1 fwd", M, 3072, 768, false, true},   {"fc2 fwd", M, 768, 3072, false, true},
      {"head fwd", M, 50304, 768, false, true}, {"qkv dgrad", M, 768, 2304, false, false},
      {"fc2 dgrad", M, 3072, 768, false, false}, {"head dgrad", M, 768, 50304, false, false},
      {"qkv wgrad", 2304, 768, M, true, false}, {"fc1 wgrad", 3072, 768, M, true, false},
      {"head wgrad", 50304, 768, M, true, false},
  };
  __nv_bfloat16 *a, *b;
  void *c;
  CK(cudaMalloc(&a, (size_t)M * 50304 * 2));
  CK(cudaMalloc(&b, (size_t)M * 50304 * 2));
  CK(cudaMalloc(&c, (size_t)M * 50304 * 4));
  fill<<<4096, 256>>>(a, (long)M * 50304, 1);
  fill<<<4096, 256>>>(b, (long)M * 50304, 2);
  printf("%-11s %6s %6s %6s | %-27s | %-27s\n", "gemm", "m", "n", "k", "fp32 out: first / best ms", "bf16 out: first / best ms");
  double totals[4] = {0, 0, 0, 0};
  for (const Case &g : cases) {
    printf("%-11s %6ld %6ld %6ld", g.name, g.m, g.n, g.k);
    for (int out = 0; out < 2; ++out) {
      cudaDataType_t ct = out ? CUDA_R_16BF : CUDA_R_32F;
      cublasLtMatmulDesc_t desc;
      CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t opFirst = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opSecond = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof opFirst));
      CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof opSecond));
      uint64_t fr = g.tb ? g.k : g.n, fc = g.tb ? g.n : g.k, sr = g.ta ? g.m : g.k, sc = g.ta ? g.k : g.m;
      cublasLtMatrixLayout_t la, lb, lc;
      CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, fr, fc, fr));
      CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sr, sc, sr));
      CK(cublasLtMatrixLayoutCreate(&lc, ct, g.n, g.m, g.n));
      cublasLtMatmulPreference_t pref;
      CK(cublasLtMatmulPreferenceCreate(&pref));
      CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
      cublasLtMatmulHeuristicResult_t results[8];
      int found = 0;
      CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, results, &found));
      float first = 0, best = 1e30f;
      for (int r = 0; r < found; ++r) {
        float ms;
        if (timeMatmul(lt, desc, b, la, a, lb, c, lc, &results[r].algo, ws, wsBytes, &ms)) return 1;
        if (r == 0) first = ms;
        if (ms < best) best = ms;
      }
      double tflops = 2.0 * g.m * g.n * g.k / (first * 1e-3) / 1e12;
      printf(" | %7.3f / %7.3f (%4.0f TF/s)", first, best, tflops);
      totals[2 * out] += first;
      totals[2 * out + 1] += best;
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(desc);
    }
    printf("\n");
  }
  printf("total (one of each): fp32 out %.3f / %.3f ms, bf16 out %.3f / %.3f ms\n", totals[0], totals[1], totals[2], totals[3]);
  return 0;
}
