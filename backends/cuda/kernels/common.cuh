// What every generated program's kernels share: the index type, the fixed-order block
// reductions (the same bits on every run: no atomics), BF16 rounding as the BF16 GEMMs read
// their operands, the output wrappers of values stored in BF16, and the elementwise loop.
// Kernels are launched with 256 threads a block unless their wrapper says otherwise.
#pragma once

#include "BoxMuller.h"

typedef long long int64;

// A value from the lane `offset` away (xor) in the warp; types with several members add
// their own overload next to them.
__device__ __forceinline__ float shuffleXor(float value, int offset) {
  return __shfl_xor_sync(0xffffffffu, value, offset);
}
__device__ __forceinline__ double shuffleXor(double value, int offset) {
  return __shfl_xor_sync(0xffffffffu, value, offset);
}
__device__ __forceinline__ unsigned long long shuffleXor(unsigned long long value, int offset) {
  return __shfl_xor_sync(0xffffffffu, value, offset);
}

// One value per thread of the block combined in a fixed tree (the same bits on every run), the
// result given to every thread: a butterfly over each warp's lanes (combine is commutative, so
// every lane ends with the same bits), then the warps' totals in warp order. `shared` holds a
// value per warp; blockDim.x is a multiple of 32.
template <typename T, typename Combine>
__device__ T blockReduce(T value, T *shared, Combine combine) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value = combine(value, shuffleXor(value, offset));
  if (threadIdx.x % 32 == 0)
    shared[threadIdx.x / 32] = value;
  __syncthreads();
  T result = shared[0];
  for (int w = 1; w < (int)blockDim.x / 32; ++w)
    result = combine(result, shared[w]);
  __syncthreads(); // every thread has read shared before it is written again
  return result;
}

__device__ double blockSum(double value, double *shared) {
  return blockReduce(value, shared, [](double a, double b) { return a + b; });
}

__device__ float blockMax(float value, float *shared) {
  return blockReduce(value, shared, [](float a, float b) { return fmaxf(a, b); });
}

// The sum of one value per lane over a warp; every lane gets it.
__device__ float warpSum(float value) {
  for (int offset = 16; offset > 0; offset >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// x rounded to the nearest BF16 (ties to even, NaN to 0x7FFF0000), as the GEMMs of
// gemm_dtype="bf16" read it and as the CPU interpreter's roundToBf16 rounds.
__device__ float roundBf16(float x) {
  unsigned int bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return __uint_as_float(0x7fff0000u);
  unsigned int upper = bits >> 16, remainder = bits << 16;
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (upper & 1u)))
    ++upper;
  return __uint_as_float(upper << 16);
}

// The bits of roundBf16(x) as a BF16 value (two bytes).
__device__ __forceinline__ unsigned short bf16Bits(float x) {
  return (unsigned short)(__float_as_uint(roundBf16(x)) >> 16);
}

// x as a GEMM of the given operand precision reads it: rounded to BF16, or as it is.
template <bool Bf16>
__device__ __forceinline__ float gemmOperand(float x) {
  return Bf16 ? roundBf16(x) : x;
}

// The output of a kernel whose result is stored in BF16 (CudaProgram::bf16Stored):
// `out[i] = value` stores value rounded to the nearest BF16, as a BF16 GEMM would round it
// when reading. Kernels are templates over their output type, so one body serves both.
struct Bf16Out {
  unsigned short *p;
  struct Element {
    unsigned short *q;
    __device__ void operator=(float value) const { *q = bf16Bits(value); }
  };
  __device__ Element operator[](int64 i) const { return Element{p + i}; }
  __device__ Bf16Out operator+(int64 i) const { return Bf16Out{p + i}; }
};

// An element read as fp32: a float, or the bits of a value stored in BF16.
__device__ __forceinline__ float elementValue(float x) { return x; }
__device__ __forceinline__ float elementValue(unsigned short bits) { return __uint_as_float((unsigned)bits << 16); }

// The output of a kernel whose result also has a BF16 copy (CudaProgram::bf16Shadowed):
// `out[i] = value` stores value, and value rounded to BF16 into the copy.
struct F32Bf16Out {
  float *f;
  unsigned short *h;
  struct Element {
    float *f;
    unsigned short *h;
    __device__ void operator=(float value) const {
      *f = value;
      *h = bf16Bits(value);
    }
  };
  __device__ Element operator[](int64 i) const { return Element{f + i, h + i}; }
  __device__ F32Bf16Out operator+(int64 i) const { return F32Bf16Out{f + i, h + i}; }
};

// Four consecutive values at out + i (i a multiple of 4: 16-byte aligned) in one store each:
// float4, four BF16 values, or both.
__device__ __forceinline__ unsigned bf16Pair(float lo, float hi) {
  return bf16Bits(lo) | (__float_as_uint(roundBf16(hi)) & 0xffff0000u);
}
__device__ __forceinline__ void store4(float *out, int64 i, float4 v) { *(float4 *)(out + i) = v; }
__device__ __forceinline__ void store4(Bf16Out out, int64 i, float4 v) {
  *(uint2 *)(out.p + i) = make_uint2(bf16Pair(v.x, v.y), bf16Pair(v.z, v.w));
}
__device__ __forceinline__ void store4(F32Bf16Out out, int64 i, float4 v) {
  *(float4 *)(out.f + i) = v;
  *(uint2 *)(out.h + i) = make_uint2(bf16Pair(v.x, v.y), bf16Pair(v.z, v.w));
}
__device__ __forceinline__ float4 load4(const float *x, int64 i) { return *(const float4 *)(x + i); }
// Four BF16 values in 8 bytes (the first lowest) as floats.
__device__ __forceinline__ float4 bf16Four(uint2 q) {
  return make_float4(__uint_as_float(q.x << 16), __uint_as_float(q.x & 0xffff0000u), __uint_as_float(q.y << 16),
                     __uint_as_float(q.y & 0xffff0000u));
}
// Eight BF16 values in 16 bytes (the first lowest) as floats.
__device__ __forceinline__ void unpack8(uint4 q, float (&out)[8]) {
  unsigned words[4] = {q.x, q.y, q.z, q.w};
  for (int e = 0; e < 4; ++e) {
    out[2 * e] = __uint_as_float(words[e] << 16);
    out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
  }
}
// Four BF16 values (8-byte aligned) as floats.
__device__ __forceinline__ float4 load4(const unsigned short *x, int64 i) { return bf16Four(*(const uint2 *)(x + i)); }

// Programmatic dependent launch (compute capability 9.0 on): the executor launches each kernel
// so that it may start while the kernel before it in the stream is still running, which hides
// the launch and the ramp of a grid behind the tail of the one before (a decode step is a chain
// of some 60 kernels of a few microseconds each). Every generated kernel calls this first: it
// lets the next kernel launch, then waits until the kernel before it has finished and its writes
// are visible, before it touches memory. Elsewhere it does nothing (launches are serialised).
__device__ __forceinline__ void awaitPreviousKernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Where a chain of kernels spends its time, phase by phase, for a bench that defines
// TGC_PHASE_STAMPS before it includes the kernels (tests/bench/decode_phases.cu): tgcStamp(p)
// keeps the global timer's first and last reading of phase p over the blocks that reach it
// (thread 0 of each). Without TGC_PHASE_STAMPS it is nothing. Phases from kPhaseKernels on are
// the kernels' own; the bench's wrappers take those below.
enum TgcPhase : int {
  kPhaseKernels = 16,
  kPhaseAttentionQuery = kPhaseKernels, // decode.cuh, decode_stream.cuh: the query in shared memory
  kPhaseAttentionKeys,                  // the part's keys and values multiplied
  kPhaseAttentionPart,                  // the part's sums written
  kPhaseAttentionCombined,              // the last part's block has combined them all
  kPhaseCount = 32
};
#ifdef TGC_PHASE_STAMPS
__device__ unsigned long long tgcPhaseFirst[kPhaseCount], tgcPhaseLast[kPhaseCount];
__device__ __forceinline__ void tgcStamp(int phase) {
  if (threadIdx.x == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(now));
    atomicMin(&tgcPhaseFirst[phase], now);
    atomicMax(&tgcPhaseLast[phase], now);
  }
}
#else
__device__ __forceinline__ void tgcStamp(int) {}
#endif

// The RoPE rotation of pair (x, y) at position t, pair index i, by ir/Rope.h's table of LENGTH
// positions (cosines, then sines, as doubles holding floats), each product and sum rounded on
// its own (no FMA): the CPU's bits. INVERSE turns back (rope's gradient) by the same table.
// The rope kernels (elementwise.cuh) and the attention's rotations (attention.cuh) share it.
template <int64 LENGTH, int64 HALF, bool INVERSE>
__device__ __forceinline__ void ropePair(float &x, float &y, const double *table, int64 t, int64 i) {
  float c = (float)table[t * HALF + i], s = (float)table[(LENGTH + t) * HALF + i];
  if (INVERSE)
    s = -s;
  float a = x, b = y;
  x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// A grid-stride loop over `count` elements (launches cap their grid at 8192 blocks).
#define FOR_EACH_ELEMENT(i, count) \
  for (int64 i = blockIdx.x * (int64)blockDim.x + threadIdx.x; i < (count); i += (int64)gridDim.x * blockDim.x)

// Parameter init on the device (Executor::fillNormal): element i of a normal parameter is
// app/Init.cpp's draw i, the Box-Muller normal of SplitMix64 draws stream + 2i and stream + 2i + 1
// (support/BoxMuller.h, which the host's Rng::normal runs too), times std: the host's bits; the
// executor launches it by name.
extern "C" __global__ void tgc_fill_normal(float *out, int64 count, unsigned long long stream, double std) {
  FOR_EACH_ELEMENT(i, count) {
    double normal = boxMullerNormal(mix64(stream + 2ULL * i), mix64(stream + 2ULL * i + 1));
    out[i] = float(__dmul_rn(normal, std));
  }
}

// count elements of x rounded to BF16 into out: round to nearest even, NaN to 0x7FFF, as
// __float2bfloat16 does.
__device__ void roundToBf16(const float *x, unsigned short *out, int64 count) {
  FOR_EACH_ELEMENT(i, count) out[i] = bf16Bits(x[i]);
}

// BF16 copies of the operands of gemm_dtype="bf16" GEMMs (the executor launches it by name).
extern "C" __global__ void tgc_float_to_bf16(const float *x, unsigned short *out, int64 count) {
  roundToBf16(x, out, count);
}

// An all_reduce {dtype = "bf16"}'s values back from the wire (runtime/Collectives.cpp launches
// it by name), and, over one rank, its results: its operands rounded to BF16, widened again.
extern "C" __global__ void tgc_bf16_to_float(const unsigned short *x, float *out, int64 count) {
  FOR_EACH_ELEMENT(i, count) out[i] = __uint_as_float((unsigned)x[i] << 16);
}
extern "C" __global__ void tgc_round_through_bf16(const float *x, float *out, int64 count) {
  FOR_EACH_ELEMENT(i, count) out[i] = __uint_as_float((unsigned)bf16Bits(x[i]) << 16);
}
