// The tensor-core and asynchronous-copy instructions of compute capability 8.0 on, as inline
// PTX, shared by the kernels that use them (the attention, the products of a few rows). The
// device policy never asks for BF16 GEMMs below 8.0; elsewhere these trap.
// mma.sync m16n8k16 fragments, per lane (g = lane / 4, c = 2 * (lane % 4)):
//   A (16 x 16, row-major): {(g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9)}
//   B (16 x 8, k x n):      {(k = c..c+1, n = g), (k = c+8..c+9, n = g)}
//   C (16 x 8 fp32):        (g, c), (g, c+1), (g+8, c), (g+8, c+1)
#pragma once

#include "common.cuh"

// (cvt.rn rounds to nearest even as roundBf16 does, NaN to 0x7FFF too, in one instruction.)
__device__ __forceinline__ unsigned packBf16(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return bf16Pair(lo, hi);
#endif
}

__device__ __forceinline__ unsigned sharedAddress(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// d += a * b: a the A fragment, (b0, b1) the B fragment.
__device__ __forceinline__ void mmaBf16(float *d, const unsigned *a, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// Four 8 x 8 BF16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 and gets (row l / 4, columns 2 (l % 4) and + 1) of each; TRANSPOSED, (rows 2 (l % 4) and
// + 1, column l / 4).
template <bool TRANSPOSED>
__device__ __forceinline__ void loadMatrices(unsigned *r, const unsigned short *p) {
#if __CUDA_ARCH__ >= 800
  if (TRANSPOSED)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sharedAddress(p)));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(sharedAddress(p)));
#else
  __trap();
#endif
}

// 16 bytes (or 4) from global to shared memory without passing through registers; zeros
// where !valid.
__device__ __forceinline__ void copyAsync16(unsigned short *dst, const unsigned short *src, bool valid) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sharedAddress(dst)), "l"(src),
               "r"(valid ? 16 : 0));
#else
  __trap();
#endif
}
__device__ __forceinline__ void copyAsync4(float *dst, const float *src, bool valid) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(sharedAddress(dst)), "l"(src),
               "r"(valid ? 4 : 0));
#else
  __trap();
#endif
}
__device__ __forceinline__ void commitCopies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Waits until every committed group but the latest one has landed.
__device__ __forceinline__ void waitForAllButLatestCopies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}
// Waits until every committed group has landed.
__device__ __forceinline__ void waitForAllCopies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}
