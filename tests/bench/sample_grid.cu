// The sample op's two paths side by side (#41: sampled decode within 5% of greedy): sample.cuh's
// sampleGrid, the radix rounds over all of a row's blocks in one cooperative launch (after
// argmaxParts, which zeroes the rows' sums), against sampleWeights and sampleRows, a block a row,
// and sample.cuh's sampleCluster, one launch of a cluster a row (8 or 16 blocks).
// Checks that both give the same tokens on random rows (spread, peaked, with ties, NaN and -inf)
// for greedy, top-k, top-p and both, and times both paths in CUDA graphs. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o sample_grid \
//     tests/bench/sample_grid.cu && ./sample_grid
#include "bench_util.cuh"
#include "sample.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

constexpr int64 kVocab = 50257, kArgChunk = 2048; // GPT-2's vocabulary; Decode.cpp's parts

template <int64 N, int64 Chunk, int64 Stride>
__global__ void __launch_bounds__(kSampleGridThreads, kSampleGridBlocksPerSM)
    sampleGridKernel(const float *logits, const float *parts, const int *counters, const float *sampling,
                     const int *seed, unsigned long long *scratch, int *out) {
  sampleGrid<N, kArgChunk, Chunk, Stride>(logits, parts, counters, sampling, seed, scratch, out);
}
template <int64 N, int64 Chunk>
__global__ void argmaxPartsClearKernel(const float *x, float *parts, unsigned long long *scratch, int64 rows) {
  argmaxParts<N, kArgChunk>(x, parts);
  sampleGridClear<N, Chunk>(scratch, rows);
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

// sample.cuh's sampleCluster, one launch: a cluster of Blocks blocks of Threads threads a row.
template <int64 N, int Blocks, int Threads, int64 Stride>
__global__ void __cluster_dims__(Blocks, 1, 1) __launch_bounds__(Threads, 1)
    sampleClusterKernel(const float *logits, const int *counters, const float *sampling, const int *seed, int *out) {
  sampleCluster<N, Blocks, Threads, Stride>(logits, counters, sampling, seed, out);
}

struct Buffers {
  float *logits, *parts, *sampling;
  int *counters, *seed, *outRows, *outGrid, *outCluster;
  unsigned long long *weights, *scratch;
};

// The cluster path, one launch (clusters of 16 are past the portable 8: allowed first).
template <int Blocks, int Threads> void launchCluster(const Buffers &b, int rows, cudaStream_t s) {
  auto kernel = sampleClusterKernel<kVocab, Blocks, Threads, 0>;
  static bool allowed = false; // (once, before any graph captures the launch)
  if (Blocks > 8 && !allowed) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    allowed = true;
  }
  kernel<<<rows * Blocks, Threads, 0, s>>>(b.logits, b.counters, b.sampling, b.seed, b.outCluster);
}
struct ClusterPath {
  const char *name;
  void (*launch)(const Buffers &, int, cudaStream_t);
};
const ClusterPath kClusterPaths[] = {
    {"8 x 1024", launchCluster<8, 1024>}, {"16 x 1024", launchCluster<16, 1024>}, {"16 x 512", launchCluster<16, 512>}};

// The sampleRows path: argmax's parts, the weights, a block a row.
void launchRows(const Buffers &b, int rows, cudaStream_t s) {
  constexpr int64 chunks = (kVocab + kArgChunk - 1) / kArgChunk;
  argmaxPartsKernel<kVocab, kArgChunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts);
  sampleWeightsKernel<kVocab, kArgChunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts, b.sampling, b.weights);
  sampleRowsKernel<kVocab, kArgChunk, 0>
      <<<rows, kSampleThreads, 0, s>>>(b.logits, b.parts, b.counters, b.sampling, b.seed, b.weights, b.outRows);
}

// The grid path: argmax's parts (zeroing the rows' sums), then one cooperative launch. Chunk:
// 2048 up to 8 rows, else 4096 (the grid must fit the GPU at once), as Decode.cpp chooses.
template <int64 Chunk>
cudaError_t launchGridOf(const Buffers &b, int rows, cudaStream_t s) {
  constexpr int64 chunks = (kVocab + kArgChunk - 1) / kArgChunk;
  argmaxPartsClearKernel<kVocab, Chunk><<<rows * chunks, 256, 0, s>>>(b.logits, b.parts, b.scratch, rows);
  return launchWith(cudaLaunchAttributeCooperative, sampleGridKernel<kVocab, Chunk, 0>,
                    rows * SampleGrid<kVocab, Chunk>::Chunks, kSampleGridThreads, s, (const float *)b.logits,
                    (const float *)b.parts, (const int *)b.counters, (const float *)b.sampling, (const int *)b.seed,
                    b.scratch, b.outGrid);
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
  CK(cudaMalloc(&b.outCluster, kMaxRows * 4));
  CK(cudaMalloc(&b.weights, kMaxRows * kVocab * 8));
  // Garbage at first, as the arena leaves it: launch 0 zeroes the sums.
  CK(cudaMalloc(&b.scratch, kMaxRows * SampleGrid<kVocab, 2048>::Words * 8));
  CK(cudaMemset(b.scratch, 0xab, kMaxRows * SampleGrid<kVocab, 2048>::Words * 8));
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
          for (const ClusterPath &path : kClusterPaths) {
            CK(cudaMemset(b.outCluster, 0xff, rows * 4));
            path.launch(b, rows, 0);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(got.data(), b.outCluster, rows * 4, cudaMemcpyDeviceToHost));
            for (int r = 0; r < rows; ++r) {
              ++checked;
              if (want[r] != got[r] && ++differing <= 10)
                printf("differs: rows %d kind %d T %.1f p %.2f k %.0f row %d: sampleRows %d, cluster %s %d\n", rows,
                       kind, setting[0], setting[1], setting[2], r, want[r], path.name, got[r]);
            }
          }
        }
    }
  printf("tokens: %d of %d the same as sampleRows's (the grid's and each cluster path's)\n", checked - differing,
         checked);
  for (int rows : {1, 8, 32})
    for (const auto &setting : settings) {
      CK(cudaMemcpy(b.sampling, setting, 3 * 4, cudaMemcpyHostToDevice));
      // 50 samples a graph (the cooperative launch captures, as the decode step's does).
      float rowsUs = timeGraph(50, [&](int, cudaStream_t s) { launchRows(b, rows, s); });
      float gridUs = timeGraph(50, [&](int, cudaStream_t s) { CK(launchGrid(b, rows, s)); });
      printf("rows %2d, T %.1f p %.2f k %2.0f: sampleRows path %7.2f us, grid path %7.2f us", rows, setting[0],
             setting[1], setting[2], rowsUs, gridUs);
      for (const ClusterPath &path : kClusterPaths)
        printf(", cluster %s %7.2f us", path.name,
               timeGraph(50, [&](int, cudaStream_t s) { path.launch(b, rows, s); }));
      printf("\n");
    }
  return differing != 0;
}
