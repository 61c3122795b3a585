// A candidate for the sample op's draw (#41: sampled decode within 5% of greedy): the radix
// rounds of sample.cuh's sampleRows spread over all of a row's blocks instead of one block a row.
// One cooperative launch of Rows x Chunks blocks: each block holds its chunk of the row's logits
// and their weights in registers, adds its counts to the row's 256 bins in global memory, and
// after a grid-wide barrier every block takes the same decision from the same integer sums, so
// the token is sampleRows's (the CPU's) by construction; this program checks it on random rows
// (spread, peaked, with ties, NaN and -inf) for greedy, top-k, top-p and both, and times both
// paths (argmaxParts, then sampleWeights and sampleRows, or the grid kernel) in CUDA graphs.
// Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o sample_grid \
//     tests/bench/sample_grid.cu && ./sample_grid
#include "sample.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#define CK(x)                                                                                                          \
  do {                                                                                                                 \
    auto s_ = (x);                                                                                                     \
    if ((int)s_) {                                                                                                     \
      printf("error %d (%s) at %s:%d\n", (int)s_, cudaGetErrorString((cudaError_t)s_), __FILE__, __LINE__);           \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

constexpr int64 kVocab = 50257, kArgChunk = 2048; // GPT-2's vocabulary; Decode.cpp's parts
constexpr int kGridThreads = 256;
constexpr int kSlots = 9; // bins of 4 top-k rounds, the total, 4 top-p rounds

// Each of a row's `blocks` blocks waits here for the others (a cooperative launch keeps them
// all resident; rows wait apart, as each row's sums may end the draw early). `barrier`: the
// row's count (zero between barriers) and generation.
__device__ void gridBarrier(unsigned *barrier, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned *generation = barrier + 1;
    unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(barrier, 1u) == blocks - 1) {
      barrier[0] = 0;
      __threadfence();
      atomicAdd(barrier + 1, 1u);
    } else {
      while (*generation == seen) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

template <int64 N, int64 Chunk>
struct GridRow {
  static constexpr int64 Chunks = (N + Chunk - 1) / Chunk;
  static constexpr int Per = (int)(Chunk / kGridThreads); // a thread's contiguous run
  static constexpr int64 Scratch = kSlots * 256 + Chunks; // 64-bit words a row
};

// The largest key t >= lowest whose keys (>= t) weigh at least target over the row (4 rounds,
// bins of slots first..first+3), and in kept what they weigh.
template <int Per>
__device__ unsigned gridThreshold(const unsigned (&key)[Per], const unsigned long long (&weight)[Per], bool weighted,
                                  unsigned lowest, unsigned long long target, unsigned long long *rowBins, int slot,
                                  unsigned *barrier, unsigned blocks, unsigned long long &kept) {
  __shared__ unsigned long long local[256];
  unsigned prefix = 0;
  unsigned long long above = 0;
  for (int shift = 24; shift >= 0; shift -= 8, ++slot) {
    local[threadIdx.x] = 0;
    __syncthreads();
    unsigned decided = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
#pragma unroll
    for (int k = 0; k < Per; ++k) {
      bool counted = key[k] >= lowest && (key[k] & decided) == prefix && weight[k] != ~0ull;
      sampleAddToBin(local, counted ? (int)((key[k] >> shift) & 255u) : -1, weighted ? weight[k] : 1ull);
    }
    __syncthreads();
    if (local[threadIdx.x])
      atomicAdd(rowBins + slot * 256 + threadIdx.x, local[threadIdx.x]);
    gridBarrier(barrier, blocks);
    local[threadIdx.x] = __ldcg(rowBins + slot * 256 + threadIdx.x); // the row's bins, past the L1
    __syncthreads();
    sampleNextByte(local, shift, target, prefix, above, kept);
  }
  return prefix;
}

// The sample op's token for each row, as sampleRows gives it. Launched cooperatively with
// Rows x Chunks blocks of kGridThreads; scratch holds GridRow::Scratch zeroed words a row,
// barriers two zeroed words a row (the counts left zeroed, the scratch too, for the next launch).
template <int64 N, int64 Chunk, int64 Stride>
__global__ void __launch_bounds__(kGridThreads, 4) // 4 blocks an SM: 32 rows' 416 blocks fit 132 SMs at once
    sampleGrid(const float *logits, const float *parts, const int *counters, const float *sampling, const int *seed,
               unsigned long long *scratch, unsigned *barriers, int *out) {
  using G = GridRow<N, Chunk>;
  constexpr int Per = G::Per;
  constexpr unsigned blocks = (unsigned)G::Chunks;
  const int64 row = blockIdx.x / G::Chunks, chunk = blockIdx.x % G::Chunks;
  unsigned *barrier = barriers + 2 * row;
  float best;
  int index;
  sampleRowBest<N, kArgChunk>(parts, row, best, index);
  const float temperature = sampling[0], topP = sampling[1];
  const int64 topK = (int64)sampling[2];
  if (!(temperature > 0.0f)) { // every block returns here alike: no barrier waits
    if (chunk == 0 && threadIdx.x == 0)
      out[row] = index;
    return;
  }
  unsigned long long *rowBins = scratch + row * G::Scratch, *chunkSums = rowBins + kSlots * 256;
  const int64 first = chunk * Chunk + (int64)threadIdx.x * Per; // this thread's run
  unsigned key[Per];
  unsigned long long weight[Per]; // ~0: past the row's end
#pragma unroll
  for (int k = 0; k < Per; ++k) {
    float logit = first + k < N ? logits[row * N + first + k] : 0.0f;
    key[k] = samplingKey(logit);
    weight[k] = first + k < N ? samplingWeight(logit, best, temperature) : ~0ull;
  }
  unsigned long long kept = 0;
  unsigned lowest = 0;
  if (topK > 0 && topK < N)
    lowest = gridThreshold<Per>(key, weight, false, 0u, (unsigned long long)topK, rowBins, 0, barrier, blocks, kept);
  unsigned long long own = 0;
#pragma unroll
  for (int k = 0; k < Per; ++k)
    if (weight[k] != ~0ull && key[k] >= lowest)
      own += weight[k];
  unsigned long long blockTotal = sampleBlockSum(own);
  if (threadIdx.x == 0 && blockTotal)
    atomicAdd(rowBins + 4 * 256, blockTotal);
  gridBarrier(barrier, blocks);
  unsigned long long total = __ldcg(rowBins + 4 * 256);
  if (total == 0) { // no finite logit
    if (chunk == 0 && threadIdx.x == 0)
      out[row] = index;
  } else {
    if (topP < 1.0f) {
      lowest = gridThreshold<Per>(key, weight, true, lowest, samplingMassTarget(total, topP), rowBins, 5, barrier, blocks,
                                  total);
      own = 0;
#pragma unroll
      for (int k = 0; k < Per; ++k)
        if (weight[k] != ~0ull && key[k] >= lowest)
          own += weight[k];
    }
    unsigned long long seedWord = (unsigned long long)(unsigned)seed[0] | (unsigned long long)(unsigned)seed[1] << 32;
    unsigned long long draw = samplingDraw(seedWord, row, (long long)counters[row] - row * Stride, total);
    unsigned long long running = sampleExclusiveScan(own), mine = sampleBlockSum(own);
    if (threadIdx.x == 0)
      chunkSums[chunk] = mine;
    gridBarrier(barrier, blocks);
    unsigned long long before = 0;
    for (int64 c = 0; c < chunk; ++c)
      before += __ldcg(chunkSums + c);
    running += before;
    if (running <= draw && draw < running + own) {
#pragma unroll
      for (int k = 0; k < Per; ++k)
        if (weight[k] != ~0ull && key[k] >= lowest && (running += weight[k]) > draw) {
          out[row] = (int)(first + k);
          break;
        }
    }
  }
  // Every block has read the row's sums: zero them for the next launch.
  gridBarrier(barrier, blocks);
  for (int64 i = chunk * kGridThreads + threadIdx.x; i < G::Scratch; i += G::Chunks * kGridThreads)
    rowBins[i] = 0;
}

template <int64 N, int64 Chunk>
__global__ void argmaxPartsKernel(const float *x, float *parts) {
  argmaxParts<N, Chunk>(x, parts);
}
template <int64 N, int64 Chunk>
__global__ void sampleWeightsKernel(const float *x, const float *parts, const float *sampling,
                                    unsigned long long *weights) {
  sampleWeights<N, Chunk>(x, parts, sampling, weights);
}
template <int64 N, int64 Chunk, int64 Stride>
__global__ void __launch_bounds__(kSampleThreads)
    sampleRowsKernel(const float *x, const float *parts, const int *counters, const float *sampling, const int *seed,
                     const unsigned long long *weights, int *out) {
  sampleRows<N, Chunk, Stride>(x, parts, counters, sampling, seed, weights, out);
}

struct Buffers {
  float *logits, *parts, *sampling;
  int *counters, *seed, *outRows, *outGrid;
  unsigned long long *weights, *scratch;
  unsigned *barrier;
};

// The sampleRows path: argmax's parts, the weights, a block a row.
void launchRows(const Buffers &b, int rows, cudaStream_t s) {
  constexpr int64 chunks = (kVocab + kArgChunk - 1) / kArgChunk;
  argmaxPartsKernel<kVocab, kArgChunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts);
  sampleWeightsKernel<kVocab, kArgChunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts, b.sampling, b.weights);
  sampleRowsKernel<kVocab, kArgChunk, 0>
      <<<rows, kSampleThreads, 0, s>>>(b.logits, b.parts, b.counters, b.sampling, b.seed, b.weights, b.outRows);
}

// The grid path: argmax's parts, then one cooperative launch. Chunk: 2048 up to 8 rows, else
// 4096 (the grid must fit the GPU at once).
template <int64 Chunk>
cudaError_t launchGridOf(const Buffers &b, int rows, cudaStream_t s) {
  constexpr int64 chunks = (kVocab + kArgChunk - 1) / kArgChunk;
  argmaxPartsKernel<kVocab, kArgChunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((unsigned)(rows * GridRow<kVocab, Chunk>::Chunks));
  config.blockDim = dim3(kGridThreads);
  config.stream = s;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeCooperative;
  attribute.val.cooperative = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, sampleGrid<kVocab, Chunk, 0>, (const float *)b.logits, (const float *)b.parts,
                            (const int *)b.counters, (const float *)b.sampling, (const int *)b.seed, b.scratch,
                            b.barrier, b.outGrid);
}
cudaError_t launchGrid(const Buffers &b, int rows, cudaStream_t s) {
  return rows <= 8 ? launchGridOf<2048>(b, rows, s) : launchGridOf<4096>(b, rows, s);
}

// Row r's logits: kind 0 spread (normal, sd 2), 1 peaked (a few tokens far ahead), 2 coarse
// (values on a grid of 0.5: many ties), 3 with NaN and -inf among them.
void fillRows(std::vector<float> &host, int rows, int kind, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int r = 0; r < rows; ++r)
    for (int64 i = 0; i < kVocab; ++i) {
      float v = normal(rng);
      if (kind == 1 && rng() % 5000 == 0)
        v += 12.0f;
      if (kind == 2)
        v = std::round(v * 2.0f) / 2.0f;
      if (kind == 3 && rng() % 997 == 0)
        v = rng() % 2 ? NAN : -INFINITY;
      host[r * kVocab + i] = v;
    }
}

// Microseconds a sample takes, from a CUDA graph of 50, or (where the cooperative launch does
// not capture) from 50 launches on a stream, *captured saying which.
float timeGraph(const Buffers &b, int rows, bool grid, bool *captured) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  constexpr int count = 50;
  auto record = [&] {
    cudaError_t error = cudaSuccess;
    for (int i = 0; i < count && error == cudaSuccess; ++i) {
      if (grid)
        error = launchGrid(b, rows, s);
      else
        launchRows(b, rows, s);
    }
    return error;
  };
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaError_t recorded = record();
  cudaError_t ended = cudaStreamEndCapture(s, &graph);
  *captured = recorded == cudaSuccess && ended == cudaSuccess &&
              cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (!*captured) {
    printf("(the grid path does not capture: %s; timed from a stream)\n",
           cudaGetErrorString(recorded != cudaSuccess ? recorded : ended));
    cudaGetLastError();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(record());
    CK(cudaEventRecord(e0, s));
    CK(record());
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    cudaStreamDestroy(s);
    return 1000 * ms / count;
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(e0, s));
  for (int r = 0; r < 5; ++r)
    CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  return 1000 * ms / (5 * count);
}

int main() {
  constexpr int kMaxRows = 32;
  Buffers b;
  CK(cudaMalloc(&b.logits, kMaxRows * kVocab * 4));
  CK(cudaMalloc(&b.parts, kMaxRows * 2 * 64 * 4));
  CK(cudaMalloc(&b.sampling, 3 * 4));
  CK(cudaMalloc(&b.counters, kMaxRows * 4));
  CK(cudaMalloc(&b.seed, 2 * 4));
  CK(cudaMalloc(&b.outRows, kMaxRows * 4));
  CK(cudaMalloc(&b.outGrid, kMaxRows * 4));
  CK(cudaMalloc(&b.weights, kMaxRows * kVocab * 8));
  size_t scratchWords = kMaxRows * GridRow<kVocab, 2048>::Scratch;
  CK(cudaMalloc(&b.scratch, scratchWords * 8));
  CK(cudaMemset(b.scratch, 0, scratchWords * 8));
  CK(cudaMalloc(&b.barrier, kMaxRows * 2 * 4));
  CK(cudaMemset(b.barrier, 0, kMaxRows * 2 * 4));
  std::mt19937 rng(1);
  const float settings[][3] = {{0.0f, 1.0f, 0}, {0.8f, 0.95f, 0}, {0.8f, 1.0f, 50}, {1.0f, 0.9f, 40}, {1.3f, 0.5f, 0}};
  int checked = 0, differing = 0;
  for (int rows : {1, 8, 32})
    for (int kind = 0; kind < 4; ++kind) {
      std::vector<float> host(rows * kVocab);
      fillRows(host, rows, kind, rng);
      CK(cudaMemcpy(b.logits, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
      for (const auto &setting : settings)
        for (int draw = 0; draw < 20; ++draw) {
          std::vector<int> counters(rows);
          for (int r = 0; r < rows; ++r)
            counters[r] = int(rng() % 100000);
          int seed[2] = {int(rng()), int(rng())};
          CK(cudaMemcpy(b.sampling, setting, 3 * 4, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(b.counters, counters.data(), rows * 4, cudaMemcpyHostToDevice));
          CK(cudaMemcpy(b.seed, seed, 2 * 4, cudaMemcpyHostToDevice));
          CK(cudaMemset(b.outRows, 0xff, rows * 4));
          CK(cudaMemset(b.outGrid, 0xff, rows * 4));
          launchRows(b, rows, 0);
          CK(launchGrid(b, rows, 0));
          CK(cudaDeviceSynchronize());
          std::vector<int> want(rows), got(rows);
          CK(cudaMemcpy(want.data(), b.outRows, rows * 4, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(got.data(), b.outGrid, rows * 4, cudaMemcpyDeviceToHost));
          for (int r = 0; r < rows; ++r) {
            ++checked;
            if (want[r] != got[r] && ++differing <= 10)
              printf("differs: rows %d kind %d T %.1f p %.2f k %.0f row %d: sampleRows %d, grid %d\n", rows, kind,
                     setting[0], setting[1], setting[2], r, want[r], got[r]);
          }
        }
    }
  printf("tokens: %d of %d the same as sampleRows's\n", checked - differing, checked);
  for (int rows : {1, 8, 32})
    for (const auto &setting : settings) {
      CK(cudaMemcpy(b.sampling, setting, 3 * 4, cudaMemcpyHostToDevice));
      bool rowsCaptured = false, gridCaptured = false;
      float rowsUs = timeGraph(b, rows, false, &rowsCaptured), gridUs = timeGraph(b, rows, true, &gridCaptured);
      printf("rows %2d, T %.1f p %.2f k %2.0f: sampleRows path %7.2f us, grid path %7.2f us%s\n", rows, setting[0],
             setting[1], setting[2], rowsUs, gridUs, gridCaptured ? "" : " (stream)");
    }
  return differing != 0;
}
