// What the cuBLASLt measurements in bench/ share (each a program of its own, built with nvcc on
// the development machine and run on the GPU machine; not part of the build).
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cstdio>

// Returns 1 from the enclosing function on a CUDA or cuBLAS error, naming the line.
#define CK(x) do { auto s = (x); if ((int)s) { printf("error %d at %s:%d\n", (int)s, __FILE__, __LINE__); return 1; } } while (0)

// Deterministic BF16 values in [-0.5, 0.5) from a hash of the index.
__global__ void fill(__nv_bfloat16 *x, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = __float2bfloat16((float)(h & 0xffff) / 65536.0f - 0.5f);
  }
}

// The mean time of one cublasLtMatmul (D = C = d) with `algo`: 3 warm-up calls, then 20 timed.
// Returns 0, or 1 on an error (*ms then unset).
inline int timeMatmul(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, const void *a, cublasLtMatrixLayout_t la,
                      const void *b, cublasLtMatrixLayout_t lb, void *d, cublasLtMatrixLayout_t ld,
                      const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsBytes, float *ms) {
  float alpha = 1, beta = 0;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w)
    CK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, algo, ws, wsBytes, 0));
  CK(cudaEventRecord(e0));
  for (int it = 0; it < 20; ++it)
    CK(cublasLtMatmul(lt, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, algo, ws, wsBytes, 0));
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(ms, e0, e1));
  *ms /= 20;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 0;
}
