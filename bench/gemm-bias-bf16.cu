// A check behind [train-speed] (BENCHMARKS.md, session 10): can cuBLASLt write a BF16 product
// whose BIAS epilogue adds an fp32 bias (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUDA_R_32F), and
// are its values those of the fp32 product with the bias, rounded to BF16 (what tgc's attention
// reads)? gpt2-124m's qkv projection (16384 x 2304 x 768). Not part of the build. Built here, run
// on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o gemm-bias-bf16 bench/gemm-bias-bf16.cu -lcublasLt && ./gemm-bias-bf16
#include "bench.cuh"

#include <cstring>
#include <vector>

__global__ void fillFloat(float *x, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = (float)(h & 0xffffff) / 16777216.0f - 0.5f;
  }
}

static unsigned short roundBf16(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// y = x @ w^T + bias as tgc runs it: column-major D [N, M] = W [K, N]^T x [K, M].
int gemm(cublasLtHandle_t lt, void *ws, size_t wsBytes, const void *x, const void *w, const float *bias, void *d,
         cudaDataType dType, long m, long n, long k, float *ms) {
  cublasLtMatmulDesc_t desc;
  CK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  int32_t biasType = CUDA_R_32F;
  CK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType));
  cublasLtMatrixLayout_t la, lb, ld;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, n, k));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, m, k));
  CK(cublasLtMatrixLayoutCreate(&ld, dType, n, m, n));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 8, results, &found));
  printf("  %s output: %d algorithms\n", dType == CUDA_R_32F ? "fp32" : "bf16", found);
  if (!found) return 2;
  float best = 1e9;
  for (int a = 0; a < found; ++a) {
    float t;
    if (timeMatmul(lt, desc, w, la, x, lb, d, ld, &results[a].algo, ws, wsBytes, &t)) return 1;
    best = t < best ? t : best;
  }
  // The first algorithm's values, as the comparison reads them.
  float alpha = 1, beta = 0;
  CK(cublasLtMatmul(lt, desc, &alpha, w, la, x, lb, &beta, d, ld, d, ld, &results[0].algo, ws, wsBytes, 0));
  CK(cudaDeviceSynchronize());
  *ms = best;
  return 0;
}

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  size_t wsBytes = 32 << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsBytes));
  const long M = 16384, N = 2304, K = 768;
  __nv_bfloat16 *x, *w;
  float *bias, *d32;
  unsigned short *d16;
  CK(cudaMalloc(&x, M * K * 2));
  CK(cudaMalloc(&w, N * K * 2));
  CK(cudaMalloc(&bias, N * 4));
  CK(cudaMalloc(&d32, M * N * 4));
  CK(cudaMalloc(&d16, M * N * 2));
  fill<<<1024, 256>>>(x, M * K, 1);
  fill<<<1024, 256>>>(w, N * K, 2);
  fillFloat<<<16, 256>>>(bias, N, 3);
  float ms32 = 0, ms16 = 0;
  printf("qkv %ld x %ld x %ld, BIAS epilogue, fp32 bias:\n", M, N, K);
  if (gemm(lt, ws, wsBytes, x, w, bias, d32, CUDA_R_32F, M, N, K, &ms32)) return 1;
  int rc = gemm(lt, ws, wsBytes, x, w, bias, d16, CUDA_R_16BF, M, N, K, &ms16);
  if (rc) { printf("BF16 output with an fp32 bias: not supported (%d)\n", rc); return 0; }
  std::vector<float> h32(M * N);
  std::vector<unsigned short> h16(M * N);
  CK(cudaMemcpy(h32.data(), d32, M * N * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(h16.data(), d16, M * N * 2, cudaMemcpyDeviceToHost));
  long same = 0, off1 = 0, more = 0;
  for (long i = 0; i < M * N; ++i) {
    int diff = abs((int)roundBf16(h32[i]) - (int)h16[i]);
    (diff == 0 ? same : diff == 1 ? off1 : more)++;
  }
  printf("fp32 output %.3f ms, bf16 output %.3f ms (fastest of the heuristic's first 8)\n", ms32, ms16);
  printf("bf16 output against the fp32 output rounded: %ld equal, %ld one ulp apart, %ld further, of %ld\n", same,
         off1, more, M * N);
  return 0;
}
