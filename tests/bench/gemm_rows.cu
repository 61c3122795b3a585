// What the decode step's products of 9 to 64 rows (a batch of sequences) reach of the memory's
// rate (#41: gpt2-124m at batch 32, >= 100k tokens/s): gemv.cuh's gemmRowsBf16 in each tile
// (KS slices of K a block, CG column tiles of 8 a warp; KS 8 CG 1 is the tile before session 45)
// at gpt2-124m's and gpt-1.3b's shapes, x in BF16 as the step stores it. Each case: a CUDA graph
// of 240 launches under programmatic dependent launch, cycling over weight copies that together
// exceed the L2; the bytes counted are the weight's. Every tile's output is compared bit for bit
// with the first tile's of its shape (the same products in the same order for one KS). Not part
// of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o gemm_rows \
//     tests/bench/gemm_rows.cu && ./gemm_rows
#include "bench_util.cuh"
#include "gemv.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

template <int64 M, int64 N, int64 K, int KS, int CG, bool Gelu>
__global__ void __launch_bounds__(256) product(const unsigned short *x, const unsigned short *w, const float *bias,
                                               float *out) {
  gemmRowsBf16<M, N, K, KS, true, Gelu, CG>(x, w, bias, out, nullptr, [] {}); // (the default prologue, a host
  // lambda under nvcc, would make the kernel empty)
}

template <int64 M, int64 N, int64 K, int KS, int CG, int Parts, bool Gelu>
__global__ void __launch_bounds__(256) partsProduct(const unsigned short *x, const unsigned short *w, const float *bias,
                                                    float *out, float *partial, unsigned *done) {
  gemmRowsPartsBf16<M, N, K, KS, CG, Parts, true, Gelu>(x, w, bias, out, nullptr, partial, done);
}

double bandwidth = 0; // bytes/us of the device's memory (from its clock and bus width)
unsigned short *x = nullptr;
float *bias = nullptr, *out = nullptr, *partial = nullptr;
unsigned *done = nullptr;

template <int64 M, int64 N, int64 K, int KS, int CG, bool Gelu>
float time(std::vector<float> &result) {
  const long bytes = N * K * 2;
  const int copies = (int)std::max(2L, (400L << 20) / bytes);
  std::vector<unsigned short *> w;
  for (int i = 0; i < copies; ++i)
    w.push_back(bf16Weights(N * K, 7)); // the same values: one output
  constexpr long columns = 64 / KS * CG, blocks = (N + columns - 1) / columns;
  float us = timeGraph(240, [&](int i, cudaStream_t s) {
    CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, product<M, N, K, KS, CG, Gelu>, blocks, 256, s,
                  (const unsigned short *)x, (const unsigned short *)w[i % copies], (const float *)bias, out));
  });
  result.resize(M * N);
  CK(cudaMemcpy(result.data(), out, M * N * 4, cudaMemcpyDeviceToHost));
  for (auto p : w) cudaFree(p);
  return us;
}

std::vector<float> lastFirst; // the output of the last shape's first tile (KS 8 CG 1)

// Each (KS, CG) pair of the list in turn, against the first.
template <int64 M, int64 N, int64 K, bool Gelu>
int tiles(const char *, const std::vector<float> *, float) { return 0; }
template <int64 M, int64 N, int64 K, bool Gelu, int KS, int CG, int... More>
int tiles(const char *name, const std::vector<float> *first, float best) {
  std::vector<float> got;
  float us = time<M, N, K, KS, CG, Gelu>(got);
  const double bytes = N * K * 2.0;
  int differs = 0;
  static std::vector<float> reference[2]; // the first tile's output at KS 8 (lastFirst: the shape's)
  if (!first) {
    reference[0] = got;
    first = &reference[0];
    lastFirst = got;
  }
  constexpr long columns = 64 / KS * CG, blocks = (N + columns - 1) / columns;
  printf("%-10s M %2lld N %5lld K %5lld  KS %d CG %d (%4ld blocks): %7.2f us  %6.1f GB/s  %5.1f%%%s\n", name, M, N, K,
         KS, CG, blocks, us, bytes / us / 1e3, 100 * bytes / us / bandwidth,
         first->size() == got.size() && KS == 8 && std::memcmp(first->data(), got.data(), got.size() * 4) != 0
             ? "  DIFFERS from KS 8 CG 1"
             : "");
  if (KS == 8 && std::memcmp(first->data(), got.data(), got.size() * 4) != 0)
    differs = 1;
  return differs + tiles<M, N, K, Gelu, More...>(name, first, std::min(best, us));
}

// K split over Parts blocks as well (gemmRowsPartsBf16), against the first tile of tiles<>'s
// list (KS 8 CG 1, one part): the parts sum in another order, so within 1e-5 of the largest.
template <int64 M, int64 N, int64 K, bool Gelu>
int parts(const char *, const std::vector<float> &) { return 0; }
template <int64 M, int64 N, int64 K, bool Gelu, int KS, int CG, int Parts, int... More>
int parts(const char *name, const std::vector<float> &first) {
  const long bytes = N * K * 2;
  const int copies = (int)std::max(2L, (400L << 20) / bytes);
  std::vector<unsigned short *> w;
  for (int i = 0; i < copies; ++i)
    w.push_back(bf16Weights(N * K, 7));
  constexpr long columns = 64 / KS * CG, blocks = (N + columns - 1) / columns * Parts;
  float us = timeGraph(240, [&](int i, cudaStream_t s) {
    CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, partsProduct<M, N, K, KS, CG, Parts, Gelu>, blocks,
                  256, s, (const unsigned short *)x, (const unsigned short *)w[i % copies], (const float *)bias, out,
                  partial, done));
  });
  std::vector<float> got(M * N);
  CK(cudaMemcpy(got.data(), out, M * N * 4, cudaMemcpyDeviceToHost));
  for (auto p : w) cudaFree(p);
  float largest = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    largest = std::max(largest, std::fabs(first[i]));
    worst = std::max(worst, std::fabs(first[i] - got[i]));
  }
  const bool differs = worst > 1e-5f * largest;
  printf("%-10s M %2lld N %5lld K %5lld  KS %d CG %d parts %d (%4ld blocks): %7.2f us  %6.1f GB/s  %5.1f%%%s\n", name,
         M, N, K, KS, CG, Parts, blocks, us, bytes / us / 1e3, 100 * bytes / us / bandwidth,
         differs ? "  DIFFERS from KS 8 CG 1" : "");
  return differs + parts<M, N, K, Gelu, More...>(name, first);
}

#define TILES 8, 1, 8, 2, 8, 4, 4, 1, 4, 2, 4, 4, 2, 2, 2, 4, 1, 4, 1, 8
#define TILES64 8, 1, 8, 2, 4, 1, 4, 2, 2, 2, 1, 2

int main() {
  bandwidth = memoryBandwidth();
  CK(cudaMalloc(&x, 64 * 8192 * 2));
  CK(cudaMalloc(&bias, 8192 * 4));
  CK(cudaMalloc(&out, 64 * 8192 * 4));
  fillBits<<<256, 256>>>(x, 64 * 8192, 3, 0x3f80); // about +-[1, 2]
  CK(cudaMemset(bias, 0, 8192 * 4));
  CK(cudaMalloc(&partial, 8 * 64 * 8192 * 4));
  CK(cudaMalloc(&done, 8192 * 4));
  CK(cudaMemset(done, 0, 8192 * 4));
  int differs = 0;
  differs += tiles<32, 2304, 768, false, TILES>("124m qkv", nullptr, 1e9f);
  differs += tiles<32, 768, 768, false, TILES>("124m proj", nullptr, 1e9f);
  differs += tiles<32, 3072, 768, true, TILES>("124m fc1", nullptr, 1e9f);
  differs += tiles<32, 768, 3072, false, TILES>("124m fc2", nullptr, 1e9f);
  differs += parts<32, 768, 3072, false, 8, 1, 4, 8, 2, 4, 8, 4, 4, 4, 2, 8, 4, 4, 8, 8, 2, 2>("124m fc2", lastFirst);
  differs += tiles<16, 2304, 768, false, TILES>("124m qkv", nullptr, 1e9f);
  differs += tiles<64, 2304, 768, false, TILES64>("124m qkv", nullptr, 1e9f);
  differs += tiles<64, 768, 3072, false, TILES64>("124m fc2", nullptr, 1e9f);
  differs += tiles<32, 6144, 2048, false, TILES>("1.3b qkv", nullptr, 1e9f);
  differs += tiles<32, 2048, 2048, false, TILES>("1.3b proj", nullptr, 1e9f);
  differs += tiles<32, 8192, 2048, true, TILES>("1.3b fc1", nullptr, 1e9f);
  differs += tiles<32, 2048, 8192, false, TILES>("1.3b fc2", nullptr, 1e9f);
  differs += parts<32, 2048, 8192, false, 8, 1, 4, 8, 2, 4, 8, 4, 4, 4, 4, 8, 4, 2, 8>("1.3b fc2", lastFirst);
  printf("%s\n", differs ? "OUTPUTS DIFFER" : "every KS 8 tile's output equal to CG 1's, bit for bit, and every split's within 1e-5");
  return differs != 0;
}
