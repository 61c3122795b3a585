// What the sampled decode step's sample op spends its time on (#41: sampled decode within 5% of
// greedy; tests/bench/sample_grid.cu times the whole op at ~50 us for one GPT-2 row against ~6
// greedy). One row of 50,257 logits over sampleGrid's layout (blocks of 256 threads, 8 tokens a
// thread), each part alone in a CUDA graph: the loads and keys; the tokens' weights
// (Sampling.h's samplingWeight, double precision); four radix rounds of 256 bins, the lanes of a
// bin summed first (__match_any_sync) and then one 64-bit shared atomic (sample.cuh's
// sampleAddToBin), three 32-bit atomics of 16-bit pieces, or a plain add to bins of the warp's
// own (sampleAddToWarpBin); or no lanes summed, each lane's atomic into the warp's bins or the
// block's. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o sample_parts \
//     tests/bench/sample_parts.cu && ./sample_parts
#include "bench_util.cuh"
#include "sample.cuh"

#include <cstdio>
#include <random>
#include <vector>

constexpr int64 kVocab = 50257, kChunk = 2048, kPer = kChunk / kSampleGridThreads;
constexpr int kBlocksARow = (int)((kVocab + kChunk - 1) / kChunk);

// The lanes of a bin add their sum in three 32-bit atomics of the weight's 16-bit pieces (a
// weight is at most 2^40: each piece's sum over a block of 2048 tokens fits 32 bits).
__device__ __forceinline__ void addSplit(unsigned *bins, int bin, unsigned long long weight) {
  unsigned peers = __match_any_sync(0xffffffffu, bin);
  unsigned a = __reduce_add_sync(peers, (unsigned)(weight & 0xffffu));
  unsigned b = __reduce_add_sync(peers, (unsigned)((weight >> 16) & 0xffffu));
  unsigned c = __reduce_add_sync(peers, (unsigned)(weight >> 32));
  if (bin >= 0 && (int)(threadIdx.x % 32) == __ffs(peers) - 1) {
    atomicAdd(&bins[bin], a);
    atomicAdd(&bins[256 + bin], b);
    atomicAdd(&bins[512 + bin], c);
  }
}

// The lanes of a bin add their sum to the warp's own bins, a plain read and write by the first.
__device__ __forceinline__ void addWarp(unsigned long long *warpBins, int bin, unsigned long long weight) {
  unsigned peers = __match_any_sync(0xffffffffu, bin);
  unsigned low = __reduce_add_sync(peers, (unsigned)(weight & 0x1fffffull));
  unsigned high = __reduce_add_sync(peers, (unsigned)(weight >> 21));
  if (bin >= 0 && (int)(threadIdx.x % 32) == __ffs(peers) - 1)
    warpBins[bin] += ((unsigned long long)high << 21) + low;
  __syncwarp();
}

// No lanes summed first (no __match_any_sync): each lane's own atomic into the warp's own bins,
// one 64-bit add (Pieces false) or two 32-bit adds of the weight's low 23 bits and the rest (a
// warp's 256 tokens: each piece's sum fits 32 bits).
template <bool Pieces>
__device__ __forceinline__ void addLane(unsigned long long *warpBins, int bin, unsigned long long weight) {
  if (bin < 0)
    return;
  if (Pieces) {
    unsigned *pieces = (unsigned *)warpBins; // [2][256]
    atomicAdd(&pieces[bin], (unsigned)(weight & 0x7fffffu));
    atomicAdd(&pieces[256 + bin], (unsigned)(weight >> 23));
  } else {
    atomicAdd(&warpBins[bin], weight);
  }
}

// Mode 0: keys; 1: keys and weights; four rounds with 2: the lanes of a bin summed, then a 64-bit
// atomic (sampleAddToBin); 3: then 32-bit pieces; 4: then a plain add to the warp's own bins
// (sampleAddToWarpBin); 5: each lane's 64-bit atomic to the warp's own bins; 6: its two 32-bit
// pieces; 7: each lane's 64-bit atomic to the block's bins. Every round counts the tokens whose
// decided bytes match the block's first token's (the realistic narrowing of a radix select);
// weights past mode 1 are a hash of the key.
template <int Mode>
__global__ void __launch_bounds__(kSampleGridThreads) partsKernel(const float *logits, unsigned long long *sink) {
  __shared__ unsigned long long bins64[256];
  __shared__ unsigned bins32[3 * 256];
  __shared__ unsigned long long warpBins[kSampleGridThreads / 32][256];
  __shared__ unsigned firstKey;
  const int64 row = blockIdx.x / kBlocksARow, first = (blockIdx.x % kBlocksARow) * kChunk + threadIdx.x * kPer;
  unsigned key[kPer];
  unsigned long long weight[kPer], total = 0;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    float logit = first + k < kVocab ? logits[row * kVocab + first + k] : 0.0f;
    key[k] = samplingKey(logit);
    weight[k] = Mode == 1 ? samplingWeight(logit, 8.0f, 0.8f) : (key[k] * 2654435761ull) & 0xffffffffffull;
    total += Mode <= 1 ? weight[k] + key[k] : 0;
  }
  if (threadIdx.x == 0)
    firstKey = key[0];
  __syncthreads();
  unsigned prefix = 0;
  for (int shift = 24; Mode >= 2 && shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
      bins64[i] = 0;
      bins32[i] = bins32[256 + i] = bins32[512 + i] = 0;
      for (int w = 0; w < kSampleGridThreads / 32; ++w)
        warpBins[w][i] = 0;
    }
    __syncthreads();
    unsigned decided = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int bin = (key[k] & decided) == prefix ? (int)((key[k] >> shift) & 255u) : -1;
      if (Mode == 2)
        sampleAddToBin(bins64, bin, weight[k]);
      else if (Mode == 3)
        addSplit(bins32, bin, weight[k]);
      else if (Mode == 4)
        addWarp(warpBins[threadIdx.x / 32], bin, weight[k]);
      else if (Mode == 7)
        addLane<false>(bins64, bin, weight[k]);
      else
        addLane<Mode == 6>(warpBins[threadIdx.x / 32], bin, weight[k]);
    }
    __syncthreads();
    unsigned long long sum = 0;
    if (Mode == 2 || Mode == 7)
      sum = bins64[threadIdx.x];
    else if (Mode == 3)
      sum = bins32[threadIdx.x] + ((unsigned long long)bins32[256 + threadIdx.x] << 16) +
            ((unsigned long long)bins32[512 + threadIdx.x] << 32);
    else if (Mode == 6)
      for (int w = 0; w < kSampleGridThreads / 32; ++w) {
        const unsigned *pieces = (const unsigned *)warpBins[w];
        sum += pieces[threadIdx.x] + ((unsigned long long)pieces[256 + threadIdx.x] << 23);
      }
    else
      for (int w = 0; w < kSampleGridThreads / 32; ++w)
        sum += warpBins[w][threadIdx.x];
    total += sum;
    prefix = firstKey & (0xffffffffu << shift);
    __syncthreads();
  }
  total = sampleBlockSum(total);
  if (threadIdx.x == 0)
    atomicAdd(sink + Mode, total);
}

int main() {
  constexpr int kMaxRows = 8;
  float *logits;
  unsigned long long *sink;
  CK(cudaMalloc(&logits, kMaxRows * kVocab * 4));
  CK(cudaMalloc(&sink, 8 * 8));
  std::mt19937 rng(1);
  const char *names[] = {"keys",
                         "keys + weights",
                         "4 rounds, lanes summed, 64-bit atomics",
                         "4 rounds, lanes summed, 32-bit pieces",
                         "4 rounds, lanes summed, the warps' own bins",
                         "4 rounds, each lane's 64-bit atomic, warps' bins",
                         "4 rounds, each lane's 32-bit pieces, warps' bins",
                         "4 rounds, each lane's 64-bit atomic, block's bins"};
  constexpr int kModes = 8;
  for (float sd : {0.05f, 2.0f}) { // a random model's logits; sample_grid's
    std::normal_distribution<float> normal(0.0f, sd);
    std::vector<float> host(kMaxRows * kVocab);
    for (float &v : host)
      v = normal(rng);
    CK(cudaMemcpy(logits, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    for (int rows : {1, 8}) {
      auto time = [&](auto kernel) {
        return timeGraph(
            50, [&](int, cudaStream_t s) { kernel<<<rows * kBlocksARow, kSampleGridThreads, 0, s>>>(logits, sink); });
      };
      float us[] = {time(partsKernel<0>), time(partsKernel<1>), time(partsKernel<2>), time(partsKernel<3>),
                    time(partsKernel<4>), time(partsKernel<5>), time(partsKernel<6>), time(partsKernel<7>)};
      CK(cudaMemset(sink, 0, 8 * 8)); // each way of counting once: the same sums
      partsKernel<2><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      partsKernel<3><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      partsKernel<4><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      partsKernel<5><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      partsKernel<6><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      partsKernel<7><<<rows * kBlocksARow, kSampleGridThreads>>>(logits, sink);
      unsigned long long sums[8];
      CK(cudaMemcpy(sums, sink, sizeof sums, cudaMemcpyDeviceToHost));
      bool agree = true;
      for (int m = 3; m < kModes; ++m)
        agree = agree && sums[m] == sums[2];
      printf("logits sd %.2f, rows %d: the bins' sums %s\n", sd, rows, agree ? "agree" : "DIFFER");
      for (int m = 0; m < kModes; ++m)
        printf("logits sd %.2f, rows %d: %-50s %7.2f us\n", sd, rows, names[m], us[m]);
    }
  }
  CK(cudaDeviceSynchronize());
  return 0;
}
