// Hopper's warpgroup products (wgmma, sm_90a) as inline PTX: a warpgroup of four warps (128
// threads) multiplies 64 rows of A, from shared memory or from registers, by N columns of B in
// shared memory, asynchronously. Operands in shared memory are described by a 64-bit descriptor
// of their layout; tgc uses one layout, 128-byte swizzled (swizzledChunk), for both the
// K-major operands (q and k in q k^T: each row's elements along the sum) and the MN-major ones
// (v in p v, read transposed).
// Fragments, per lane of warp w of the warpgroup (g = lane / 4, c = 2 * (lane % 4)), as
// mma.sync m16n8k16's (tensorcore.cuh) for rows 16 w ..:
//   A (64 x 16 from registers): {(g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9)}
//   D (64 x N fp32): d[j] = {(g, 8j+c), (g, 8j+c+1), (g+8, 8j+c), (g+8, 8j+c+1)}, j < N / 8
// Compiled for another architecture than sm_90a, each instruction traps.
#pragma once

#include "tensorcore.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TGC_WGMMA 1
#else
#define TGC_WGMMA 0
#endif

// The byte offset of 16-byte chunk `chunk` (< 8) of row `row` in a 128-byte swizzled block
// whose rows are 128 bytes (64 BF16 values) apart: the chunk moves to chunk ^ (row % 8), so
// that eight rows' same chunk fall in eight different bank groups. The block starts at a
// multiple of 1024 bytes (eight rows).
__host__ __device__ constexpr int swizzledChunk(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }

// The descriptor of an operand at shared address `address` in the swizzled layout:
// `leading` the bytes between blocks of 64 values along the operand's contiguous dimension
// (MN-major operands; ignored for K-major ones, whose 16 values a product takes lie in one
// row), `stride` the bytes between groups of eight rows (1024 here).
__device__ __forceinline__ unsigned long long wgmmaDescriptor(unsigned address, unsigned leading, unsigned stride) {
  return (unsigned long long)((address & 0x3ffff) >> 4) | (unsigned long long)((leading >> 4) & 0x3fff) << 16 |
         (unsigned long long)((stride >> 4) & 0x3fff) << 32 | 1ull << 62; // 62: 128-byte swizzle
}

// Orders the warpgroup's register writes before the products that read them (wgmma.fence),
// closes a group of products (commit), and waits until at most PENDING groups are in flight.
__device__ __forceinline__ void wgmmaFence() {
#if TGC_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmmaCommit() {
#if TGC_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int PENDING> __device__ __forceinline__ void wgmmaWait() {
#if TGC_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// After wgmmaWait: the compiler sees the accumulators written here, so no read of them moves
// above the wait (the products write them asynchronously, behind its back).
template <int J> __device__ __forceinline__ void fenceAccumulators(float (*d)[4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("" : "+f"(d[j][e])::"memory");
}

// After the last wait on products that read A fragments from registers: the fragments stay
// live (and unchanged) until here, so the compiler gives their registers to nothing else while
// the products may still read them.
template <int J> __device__ __forceinline__ void fenceFragments(unsigned (*a)[4]) {
#pragma unroll
  for (int j = 0; j < J; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      asm volatile("" : "+r"(a[j][e])::"memory");
}

// Shared memory written by ordinary stores or cp.async, made visible to the products' reads
// (the asynchronous proxy); a barrier follows.
__device__ __forceinline__ void fenceProxyAsync() {
#if TGC_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d (+)= A B over K = 16: 64 x N products, N 64 or 128; accumulate = 0 overwrites d. A is a
// K-major descriptor (wgmmaShared) or this lane's four registers of BF16 pairs (wgmmaRegisters);
// B a descriptor, K-major in wgmmaShared (k^T: rows of k along the sum), MN-major in
// wgmmaRegisters (v: its rows along the sum, read transposed).
template <int N>
__device__ __forceinline__ void wgmmaShared(float (*d)[4], unsigned long long a, unsigned long long b, int accumulate);
template <int N>
__device__ __forceinline__ void wgmmaRegisters(float (*d)[4], const unsigned *a, unsigned long long b, int accumulate);

#if TGC_WGMMA
// The m64n64k16 product from shared memory, both operands K-major (TRANSPOSED 0) or both MN-major
// (1): the layouts are the instruction's immediates.
template <int TRANSPOSED>
__device__ __forceinline__ void wgmmaShared64(float (*d)[4], unsigned long long a, unsigned long long b,
                                              int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
               "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
               "%31}, %32, %33, p, 1, 1, %35, %35;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                 "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                 "+f"(d[7][2]), "+f"(d[7][3])
               : "l"(a), "l"(b), "r"(accumulate), "n"(TRANSPOSED));
}
template <>
__device__ __forceinline__ void wgmmaShared<64>(float (*d)[4], unsigned long long a, unsigned long long b,
                                                int accumulate) {
  wgmmaShared64<0>(d, a, b, accumulate);
}
template <>
__device__ __forceinline__ void wgmmaRegisters<64>(float (*d)[4], const unsigned *a, unsigned long long b,
                                                   int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
               "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
               "%31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                 "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                 "+f"(d[7][2]), "+f"(d[7][3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmmaShared<128>(float (*d)[4], unsigned long long a, unsigned long long b,
                                                 int accumulate) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
               "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
               "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
               "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
                 "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
                 "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
                 "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                 "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
                 "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
                 "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                 "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
               : "l"(a), "l"(b), "r"(accumulate));
}
template <>
__device__ __forceinline__ void wgmmaRegisters<128>(float (*d)[4], const unsigned *a, unsigned long long b,
                                                    int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
        "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]),
        "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),
        "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));
}

// d (+)= A B, 64 x 64, with both operands MN-major in shared memory: A read transposed (stored
// with its K dimension as rows, as ds^T with the keys as rows for dq = ds k) and B as
// wgmmaRegisters' (k with the keys as rows).
__device__ __forceinline__ void wgmmaSharedTransposed64(float (*d)[4], unsigned long long a, unsigned long long b,
                                                        int accumulate) {
  wgmmaShared64<1>(d, a, b, accumulate);
}

#else
__device__ __forceinline__ void wgmmaSharedTransposed64(float (*)[4], unsigned long long, unsigned long long, int) {
  __trap();
}
template <int N>
__device__ __forceinline__ void wgmmaShared(float (*)[4], unsigned long long, unsigned long long, int) {
  __trap();
}
template <int N>
__device__ __forceinline__ void wgmmaRegisters(float (*)[4], const unsigned *, unsigned long long, int) {
  __trap();
}
#endif

// ---- Hopper's transaction barriers, bulk copies and register reallocation (sm_90) ----
// A shared-memory barrier (mbarrier) of `count` arrivals a phase; bulk copies add the bytes they
// carry to the phase's count and complete it as they land (complete_tx), so a waiter on the
// phase sees the data. Waits name the phase by parity: the n-th phase (from 0) completes with
// parity n % 2.
__device__ __forceinline__ void barrierInit(unsigned bar, unsigned count) {
#if TGC_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void fenceBarrierInit() {
#if TGC_WGMMA
  asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void barrierExpectBytes(unsigned bar, unsigned bytes) {
#if TGC_WGMMA
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void barrierArrive(unsigned bar) {
#if TGC_WGMMA
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void barrierWait(unsigned bar, unsigned parity) {
#if TGC_WGMMA
  asm volatile("{\n.reg .pred done;\nwaiting:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra waiting;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
#endif
}
// `bytes` (a multiple of 16) from global `src` to shared address `dst`, counted on `bar`.
__device__ __forceinline__ void bulkCopy(unsigned dst, const void *src, unsigned bytes, unsigned bar) {
#if TGC_WGMMA
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// A tensor map as the driver encodes it (CUtensorMap: 128 opaque bytes, 64-byte aligned; 128 in
// CUDA 13's header), declared here so that the kernels need no driver header (NVRTC has none).
struct alignas(128) TensorMap {
  unsigned long long opaque[16];
};

// The box at coordinates (c0 innermost, c1, c2) of the tensor map at generic address `map` (a
// __grid_constant__ parameter's) into shared memory at `dst`, counted on barrier `bar` as a bulk
// copy is; the box's elements past the tensor's ends are zeros.
__device__ __forceinline__ void tensorCopy3d(unsigned dst, const void *map, int c0, int c1, int c2, unsigned bar) {
#if TGC_WGMMA
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, "
               "%4}], [%5];\n" ::"r"(dst),
               "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
               : "memory");
#endif
}
// Named barriers of `threads` threads (id 0 is __syncthreads'): arrive does not wait.
__device__ __forceinline__ void namedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void namedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The calling warpgroup's registers a thread, down to or up to REGISTERS (a multiple of 8).
template <int REGISTERS> __device__ __forceinline__ void releaseRegisters() {
#if TGC_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}
template <int REGISTERS> __device__ __forceinline__ void claimRegisters() {
#if TGC_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}

// ---- Bulk reductions into global memory and semaphores between blocks (sm_90) ----
// dst[i] += src[i] over `bytes` (a multiple of 16) of fp32 from shared address `src`, in L2;
// commit closes the thread's group of them, waitAll waits until its groups' writes are done.
__device__ __forceinline__ void bulkReduceAdd(float *dst, unsigned src, unsigned bytes) {
#if TGC_WGMMA
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
#endif
}
// dst[i] = src[i] over `bytes` (a multiple of 16) from shared address `src`: a bulk store, in
// the same groups as the reductions.
__device__ __forceinline__ void bulkStore(float *dst, unsigned src, unsigned bytes) {
#if TGC_WGMMA
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void bulkCommit() {
#if TGC_WGMMA
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulkWaitAll() {
#if TGC_WGMMA
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// The asynchronous proxy's global writes (bulk reductions) ordered before what follows.
__device__ __forceinline__ void fenceProxyAsyncGlobal() {
#if TGC_WGMMA
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// A counter in global memory that orders blocks: wait until it reads `value` (acquire: what
// the blocks before wrote is seen), then release (add 1) after this block's writes.
__device__ __forceinline__ void semaphoreWait(const unsigned *counter, unsigned value) {
  unsigned now;
  do
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(now) : "l"(counter) : "memory");
  while (now != value);
}
__device__ __forceinline__ void semaphoreRelease(unsigned *counter) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
}
