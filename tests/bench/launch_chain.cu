// What a dependence between two steps of a decode step costs when the work is nothing (#41):
// a chain of kernels, each of whose blocks awaits the one before (common.cuh's
// awaitPreviousKernel under programmatic launch, as the step's kernels do, or launched plainly),
// and reads what block 0 of it wrote; against the same chain inside one persistent kernel, its
// blocks meeting at a barrier of an atomic count a round (what one kernel a step would pay
// instead), and against a kernel whose blocks hand their sums to the last of them (the split
// parts' combine: a fence, an atomic and a read from L2), and against cooperative launches (the
// sample op's). Microseconds a link, from CUDA graphs of 200 links. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o launch_chain \
//     tests/bench/launch_chain.cu && ./launch_chain
#include "bench_util.cuh"
#include "common.cuh"

#include <cstdio>

// Block 0 writes in + 1 (every block reads in after the await: the dependence on the kernel
// before); the others only await.
template <bool Await>
__global__ void link(const float *in, float *out) {
  if (Await)
    awaitPreviousKernel();
  float x = *(volatile const float *)in;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *out = x + 1.0f;
}

// Rounds links in one kernel: each round every block adds to the round's count and spins until
// all have (a barrier of the grid, all of whose blocks are resident), then reads what block 0
// wrote in the round before.
__global__ void persistent(float *value, unsigned *counts, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    float x = *(volatile float *)value;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(counts + r, 1u);
      while (*(volatile unsigned *)(counts + r) < gridDim.x) {
      }
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0)
      *(volatile float *)value = x + 1.0f;
  }
}

// Each block writes a partial, counts itself, and the last to finish reads every partial from L2
// and writes their sum (decode.cuh's combineDecodeParts, without the arithmetic).
__global__ void lastBlock(float *partial, unsigned *done, float *out) {
  awaitPreviousKernel();
  __shared__ bool last;
  if (threadIdx.x == 0)
    partial[blockIdx.x] = (float)blockIdx.x;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(done, 1u) == gridDim.x - 1;
    if (last)
      *done = 0;
  }
  __syncthreads();
  if (!last)
    return;
  float sum = 0;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) sum += __ldcg(partial + b);
  if (threadIdx.x == 0)
    *out = sum;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("%s: %d SMs\n", prop.name, prop.multiProcessorCount);
  float *buf;
  unsigned *counts;
  const int links = 200;
  CK(cudaMalloc(&buf, 1 << 20));
  CK(cudaMemset(buf, 0, 1 << 20));
  CK(cudaMalloc(&counts, links * 4));
  const int sms = prop.multiProcessorCount;
  for (long blocks : {1L, 16L, (long)sms, 4L * sms, 8L * sms}) {
    float pdl = timeGraph(links, [&](int i, cudaStream_t s) {
      CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, link<true>, blocks, 256, s,
                    (const float *)buf + i % 2, buf + (i + 1) % 2));
    });
    float plain = timeGraph(links, [&](int i, cudaStream_t s) {
      link<false><<<(unsigned)blocks, 256, 0, s>>>(buf + i % 2, buf + (i + 1) % 2);
      CK(cudaGetLastError());
    });
    float combine = timeGraph(links, [&](int i, cudaStream_t s) {
      CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, lastBlock, blocks, 256, s, buf + 1024,
                    counts, buf + 4));
    });
    // Cooperative (all blocks resident, as sample.cuh's sampleGrid is launched): at most what the
    // GPU holds at once.
    float cooperative = blocks > 8L * sms ? 0.0f : timeGraph(links, [&](int i, cudaStream_t s) {
      CK(launchWith(cudaLaunchAttributeCooperative, link<false>, blocks, 256, s, (const float *)buf + i % 2,
                    buf + (i + 1) % 2));
    });
    printf("%5ld blocks of 256: a kernel boundary %6.2f us under programmatic launch, %6.2f us plainly, %6.2f us "
           "cooperatively; a kernel whose last block combines %6.2f us\n",
           blocks, pdl, plain, cooperative, combine);
  }
  // One kernel of an SM's worth of blocks per SM (all resident), `links` barriers.
  for (long blocks : {16L, (long)sms, 4L * sms}) {
    CK(cudaMemset(counts, 0, links * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    persistent<<<(unsigned)blocks, 256>>>(buf, counts, links); // warm-up
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(counts, 0, links * 4));
    CK(cudaEventRecord(e0));
    persistent<<<(unsigned)blocks, 256>>>(buf, counts, links);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("%5ld blocks of 256: a barrier of one persistent kernel %6.2f us\n", blocks, 1000 * ms / links);
  }
  return 0;
}
