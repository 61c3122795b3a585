// A measurement behind the BF16 operand work (BENCHMARKS.md, session 4): a BF16 GEMM with its
// two f32 -> BF16 operand conversions as separate kernels, against cuBLASLt on fp32 operands
// with CUBLAS_COMPUTE_32F_FAST_16BF; times, and how many outputs agree bit for bit. Not part
// of the build. Built here and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o fast16bf bench/bf16-operand-conversions.cu -lcublasLt && ./fast16bf
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <vector>
#include <random>
#include <cstring>
#define CK(x) do { auto s = (x); if ((int)s) { printf("error %d at %s:%d\n", (int)s, __FILE__, __LINE__); return 1; } } while (0)
__global__ void toBf16(const float *x, __nv_bfloat16 *y, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) y[i] = __float2bfloat16_rn(x[i]);
}
int run(cublasLtHandle_t lt, int m, int k, int n, void *ws, size_t wsBytes) {
  std::vector<float> ha((size_t)m * k), hb((size_t)k * n);
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  for (auto &v : ha) v = nd(rng); for (auto &v : hb) v = nd(rng);
  float *a, *b, *c1, *c2; __nv_bfloat16 *a16, *b16;
  CK(cudaMalloc(&a, ha.size() * 4)); CK(cudaMalloc(&b, hb.size() * 4));
  CK(cudaMalloc(&c1, (size_t)m * n * 4)); CK(cudaMalloc(&c2, (size_t)m * n * 4));
  CK(cudaMalloc(&a16, ha.size() * 2)); CK(cudaMalloc(&b16, hb.size() * 2));
  CK(cudaMemcpy(a, ha.data(), ha.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(b, hb.data(), hb.size() * 4, cudaMemcpyHostToDevice));
  // Row-major C[m,n] = A[m,k] B[k,n]  ==  col-major C^T[n,m] = B^T[n,k] A^T[k,m]: first operand b (n x k, ld n), second a (k x m, ld k).
  float times[3] = {0, 0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    cudaDataType_t t = mode == 0 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = mode == 0 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_16BF;
    cublasLtMatmulDesc_t desc; cublasLtMatrixLayout_t la, lb, lc;
    CK(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    CK(cublasLtMatrixLayoutCreate(&la, t, n, k, n));
    CK(cublasLtMatrixLayoutCreate(&lb, t, k, m, k));
    CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
    cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
    cublasLtMatmulHeuristicResult_t res{}; int found = 0;
    auto st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &res, &found);
    if (st || !found) { printf("  mode %d: no algorithm (status %d)\n", mode, (int)st); continue; }
    float alpha = 1, beta = 0; float *c = mode == 0 ? c1 : c2;
    const void *first = mode == 0 ? (void *)b16 : (void *)b, *second = mode == 0 ? (void *)a16 : (void *)a;
    cudaEvent_t e0, e1, e2; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventCreate(&e2);
    for (int rep = 0; rep < 25; ++rep) {
      if (rep == 5) cudaEventRecord(e0);
      if (mode == 0) { toBf16<<<2048, 256>>>(a, a16, ha.size()); toBf16<<<2048, 256>>>(b, b16, hb.size()); }
      CK(cublasLtMatmul(lt, desc, &alpha, first, la, second, lb, &beta, c, lc, c, lc, &res.algo, ws, wsBytes, 0));
    }
    cudaEventRecord(e1);
    for (int rep = 0; rep < 20; ++rep)
      CK(cublasLtMatmul(lt, desc, &alpha, first, la, second, lb, &beta, c, lc, c, lc, &res.algo, ws, wsBytes, 0));
    cudaEventRecord(e2); cudaEventSynchronize(e2);
    float withConv, gemmOnly; cudaEventElapsedTime(&withConv, e0, e1); cudaEventElapsedTime(&gemmOnly, e1, e2);
    printf("  %-26s step %.4f ms (GEMM alone %.4f ms)\n", mode == 0 ? "bf16 + conversions" : "fp32 FAST_16BF", withConv / 20, gemmOnly / 20);
  }
  std::vector<float> h1((size_t)m * n), h2((size_t)m * n);
  cudaMemcpy(h1.data(), c1, h1.size() * 4, cudaMemcpyDeviceToHost); cudaMemcpy(h2.data(), c2, h2.size() * 4, cudaMemcpyDeviceToHost);
  long same = 0; double worst = 0, scale = 0;
  for (size_t i = 0; i < h1.size(); ++i) { same += !memcmp(&h1[i], &h2[i], 4); worst = fmax(worst, fabs(h1[i] - h2[i])); scale = fmax(scale, fabs(h1[i])); }
  printf("  bitwise equal %.4f%%, max |diff| %.3g at scale %.3g\n", 100.0 * same / h1.size(), worst, scale);
  cudaFree(a); cudaFree(b); cudaFree(c1); cudaFree(c2); cudaFree(a16); cudaFree(b16);
  return 0;
}
int main() {
  cublasLtHandle_t lt; CK(cublasLtCreate(&lt)); void *ws; size_t wsBytes = 32 << 20; CK(cudaMalloc(&ws, wsBytes));
  int shapes[][3] = {{4096, 512, 1536}, {4096, 512, 2048}, {4096, 2048, 512}, {4096, 2048, 8192}, {4096, 8192, 2048}};
  for (auto &s : shapes) { printf("M=%d K=%d N=%d\n", s[0], s[1], s[2]); if (run(lt, s[0], s[1], s[2], ws, wsBytes)) return 1; }
  return 0;
}
