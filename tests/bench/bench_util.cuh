// What the standalone GPU measurements (tests/bench/*.cu) share: stopping at the first CUDA
// error with its place, the memory's rate, a launch with one attribute, random BF16 operands and
// weights, the time of a launch replayed from a CUDA graph, and tensor maps of attention heads.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    auto s_ = (x);                                                                                                     \
    if ((int)s_) {                                                                                                     \
      printf("error %d (%s) at %s:%d\n", (int)s_, cudaGetErrorString((cudaError_t)s_), __FILE__, __LINE__);           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

// Device 0's memory rate in bytes a microsecond, by its clock (double data rate) and bus width,
// printed with its name and SMs.
inline double memoryBandwidth() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int clockKHz = 0, busBits = 0;
  CK(cudaDeviceGetAttribute(&clockKHz, cudaDevAttrMemoryClockRate, 0));
  CK(cudaDeviceGetAttribute(&busBits, cudaDevAttrGlobalMemoryBusWidth, 0));
  double bytesPerUs = 2.0 * clockKHz * 1e3 * busBits / 8 / 1e6;
  printf("%s: %d SMs, memory %.0f GB/s by its clock and bus\n", prop.name, prop.multiProcessorCount, bytesPerUs / 1e3);
  return bytesPerUs;
}

// The mean microseconds of each launch `record(i, stream)` makes, i < count, captured into a
// graph and replayed five times after a warm-up replay.
template <typename Record>
float timeGraph(int count, Record record) {
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < count; ++i) record(i, stream);
  CK(cudaStreamEndCapture(stream, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, stream));
  CK(cudaEventRecord(e0, stream));
  for (int r = 0; r < 5; ++r) CK(cudaGraphLaunch(exec, stream));
  CK(cudaEventRecord(e1, stream));
  CK(cudaEventSynchronize(e1));
  float ms;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return 1000 * ms / (5 * count);
}

// `kernel` over `blocks` blocks of `threads` on `stream` with one launch attribute: programmatic
// stream serialization (the decode step's launches) or cooperative (all blocks resident).
template <typename Kernel, typename... Args>
cudaError_t launchWith(cudaLaunchAttributeID id, Kernel kernel, long blocks, int threads, cudaStream_t stream,
                       Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((unsigned)blocks);
  config.blockDim = dim3((unsigned)threads);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = id;
  if (id == cudaLaunchAttributeCooperative)
    attribute.val.cooperative = 1;
  else
    attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

// n BF16 values of hashed signs and mantissas whose magnitudes lie in [2^e, 2^(e+1)) for
// `exponentBits` (the BF16 bits of 2^e, e.g. 0x3c00 for 2^-7), from `seed`.
__global__ void fillBits(unsigned short *x, long n, unsigned seed, unsigned exponentBits) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    x[i] = (unsigned short)(exponentBits + (h & 0x7f) + 0x8000 * (h >> 31)); // mantissa, sign
  }
}

// A weight of `elements` BF16 values about +-[2^-7, 2^-6] (fillBits from `seed`), on the device.
inline unsigned short *bf16Weights(long elements, unsigned seed) {
  unsigned short *w;
  CK(cudaMalloc(&w, elements * 2));
  fillBits<<<1024, 256>>>(w, elements, seed, 0x3c00);
  return w;
}

// Into `map` (128 bytes, 128-byte aligned: wgmma.cuh's TensorMap), a 3-dimensional tensor map of
// BF16 values [outer][rows][dh] at `at`: boxes of 64 rows x 64 values, swizzled by 128 bytes
// (attention_wgmma.cuh's AttentionMaps). The driver's encoder is found through the runtime, so
// that the benches need no -lcuda.
inline void encodeHeads(void *map, const unsigned short *at, long outer, long rows, int dh) {
  static_assert(sizeof(CUtensorMap) == 128 && alignof(CUtensorMap) <= 128, "wgmma.cuh's TensorMap");
  using Encode = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static Encode encode = nullptr;
  if (!encode) {
    cudaDriverEntryPointQueryResult found;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&encode, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || !encode) {
      fprintf(stderr, "the driver has no cuTensorMapEncodeTiled\n");
      exit(1);
    }
  }
  const cuuint64_t dims[3] = {(cuuint64_t)dh, (cuuint64_t)rows, (cuuint64_t)outer};
  const cuuint64_t strides[2] = {(cuuint64_t)dh * 2, (cuuint64_t)rows * dh * 2}; // bytes, past the innermost
  const cuuint32_t box[3] = {64, 64, 1}, step[3] = {1, 1, 1};
  const CUresult r = encode((CUtensorMap *)map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)at, dims, strides, box,
                            step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", (int)r);
    exit(1);
  }
}
