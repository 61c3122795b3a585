// What every generated program's kernels share: the index type, the fixed-order block
// reductions (the same bits on every run: no atomics), BF16 rounding as the BF16 GEMMs read
// their operands, the output wrappers of values stored in BF16, and the elementwise loop.
// Kernels are launched with 256 threads a block unless their wrapper says otherwise.
#pragma once

typedef long long int64;

// One value per thread of the block combined in a fixed tree (the same bits on every run), the
// result given to every thread. `shared` holds a value per thread.
template <typename T, typename Combine>
__device__ T blockReduce(T value, T *shared, Combine combine) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride)
      shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + stride]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads();
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
    __device__ void operator=(float value) const { *q = (unsigned short)(__float_as_uint(roundBf16(value)) >> 16); }
  };
  __device__ Element operator[](int64 i) const { return Element{p + i}; }
  __device__ Bf16Out operator+(int64 i) const { return Bf16Out{p + i}; }
};

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
      *h = (unsigned short)(__float_as_uint(roundBf16(value)) >> 16);
    }
  };
  __device__ Element operator[](int64 i) const { return Element{f + i, h + i}; }
  __device__ F32Bf16Out operator+(int64 i) const { return F32Bf16Out{f + i, h + i}; }
};

// A grid-stride loop over `count` elements (launches cap their grid at 8192 blocks).
#define FOR_EACH_ELEMENT(i, count) \
  for (int64 i = blockIdx.x * (int64)blockDim.x + threadIdx.x; i < (count); i += (int64)gridDim.x * blockDim.x)

// BF16 copies of the operands of gemm_dtype="bf16" GEMMs (the executor launches it by name):
// round to nearest even, NaN to 0x7FFF, as __float2bfloat16 does.
extern "C" __global__ void tgc_float_to_bf16(const float *x, unsigned short *out, int64 count) {
  FOR_EACH_ELEMENT(i, count) out[i] = (unsigned short)(__float_as_uint(roundBf16(x[i])) >> 16);
}
