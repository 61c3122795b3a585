// Whether the batch-1 decode products gain from a grid of one wave (#41): gemv.cuh's GEMV gives a
// block each tile of columns (768 to 2,048 blocks at gpt-1.3b's shapes, more than the GPU holds
// at once), and an empty grid of 1,056 blocks already costs 3.2 us a launch on an H100
// (launch_chain.cu). Here the same tiles taken by a grid of a few blocks an SM, each block
// striding over tiles with the next tile's weights loaded while this one multiplies
// (gemvBf16RowsStrided; residualNormGemvBf16's prologue once a block).
// Each shape against gemvBf16 / residualNormGemvBf16 at the same tile: the outputs compared bit
// for bit (the same sums in the same order), the times of 240 launches under programmatic launch,
// cycling over weight copies that exceed the L2. Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o gemv_waves \
//     tests/bench/gemv_waves.cu && ./gemv_waves
#include "bench_util.cuh"
#include "gemv.cuh"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

// gemv.cuh's kernels, one block a tile (the reference and the time to beat).
template <int64 N, int64 K, int C, int KS, bool Norm, bool Gelu>
__global__ void tiled(const float *a, const float *b, const float *gamma, const float *beta, const unsigned short *x,
                      const unsigned short *w, const float *bias, float *sum, float *out) {
  if constexpr (Norm)
    residualNormGemvBf16<true, 1, N, K, C, KS, true, Gelu, false>(a, b, gamma, beta, w, bias, sum, out, 1e-5);
  else
    gemvBf16<1, N, K, C, KS, true, Gelu>(x, w, bias, out, nullptr);
}

// The same tiles over a grid of any size (gemv.cuh's gemvBf16RowsStrided): block b takes tiles b,
// b + gridDim.x, ...; the first tile's weights load before the kernel awaits the one before it,
// each next tile's before this one multiplies. The norm's rows in shared memory, x read as
// gemvBf16 reads it.
template <int64 N, int64 K, int C, int KS, bool Norm, bool Gelu>
__global__ void __launch_bounds__(256) strided(const float *a, const float *b, const float *gamma, const float *beta,
                                               const unsigned short *x, const unsigned short *w, const float *bias,
                                               float *sum, float *out) {
  if constexpr (Norm)
    residualNormGemvBf16<true, 1, N, K, C, KS, true, Gelu, false, 0, true>(a, b, gamma, beta, w, bias, sum, out, 1e-5);
  else
    gemvBf16RowsStrided<1, N, K, C, KS, true, Gelu, false>(w, bias, out, [] {}, x);
}

struct Buffers { // activations shared by every launch
  float *a, *b, *gamma, *beta, *bias, *sum, *out;
  unsigned short *x;
};

double bandwidth = 0; // bytes/us of the device's memory (from its clock and bus width)
int sms = 0;

template <typename Kernel>
float timeKernel(Kernel kernel, long blocks, const Buffers &buf, const std::vector<unsigned short *> &w) {
  return timeGraph(240, [&](int i, cudaStream_t s) {
    CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, kernel, blocks, 256, s, (const float *)buf.a,
                  (const float *)buf.b, (const float *)buf.gamma, (const float *)buf.beta,
                  (const unsigned short *)buf.x, (const unsigned short *)w[i % w.size()], (const float *)buf.bias,
                  buf.sum, buf.out));
  });
}

// One shape at tile (C, KS): one block a tile, then one wave of 1 to 4 blocks an SM.
template <int64 N, int64 K, int C, int KS, bool Norm, bool Gelu>
void shape(const char *name, const Buffers &buf) {
  const long bytes = N * K * 2, columns = 8 / KS * C, tiles = (N + columns - 1) / columns;
  const int copies = (int)std::max(2L, (400L << 20) / bytes);
  std::vector<unsigned short *> w;
  for (int i = 0; i < copies; ++i)
    w.push_back(bf16Weights(N * K, (unsigned)i * 7919u));
  auto one = tiled<N, K, C, KS, Norm, Gelu>;
  auto wave = strided<N, K, C, KS, Norm, Gelu>;
  // The reference's outputs, then each wave's against them.
  std::vector<float> want(N), got(N);
  one<<<(unsigned)tiles, 256>>>(buf.a, buf.b, buf.gamma, buf.beta, buf.x, w[0], buf.bias, buf.sum, buf.out);
  CK(cudaMemcpy(want.data(), buf.out, N * 4, cudaMemcpyDeviceToHost));
  float us = timeKernel(one, tiles, buf, w);
  printf("%-9s N %6lld K %5lld C %d KS %d: a block a tile (%5ld): %7.2f us %5.1f%%", name, N, K, C, KS, tiles, us,
         100 * bytes / us / bandwidth);
  int resident = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, wave, 256, 0));
  for (int perSm = 1; perSm <= std::min(resident, 4); ++perSm) {
    long blocks = std::min<long>(tiles, (long)perSm * sms);
    CK(cudaMemset(buf.out, 0, N * 4));
    wave<<<(unsigned)blocks, 256>>>(buf.a, buf.b, buf.gamma, buf.beta, buf.x, w[0], buf.bias, buf.sum, buf.out);
    CK(cudaMemcpy(got.data(), buf.out, N * 4, cudaMemcpyDeviceToHost));
    bool same = std::memcmp(want.data(), got.data(), N * 4) == 0;
    float waveUs = timeKernel(wave, blocks, buf, w);
    printf(" | %d an SM: %7.2f us %5.1f%%%s", perSm, waveUs, 100 * bytes / waveUs / bandwidth, same ? "" : " WRONG");
  }
  printf("\n");
  for (auto p : w) cudaFree(p);
}

int main() {
  bandwidth = memoryBandwidth();
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Buffers buf;
  float **all[] = {&buf.a, &buf.b, &buf.gamma, &buf.beta, &buf.bias, &buf.sum, &buf.out};
  for (float **p : all) {
    CK(cudaMalloc(p, 65536 * 4));
    CK(cudaMemset(*p, 0, 65536 * 4));
  }
  CK(cudaMalloc(&buf.x, 65536 * 2));
  fillBits<<<64, 256>>>(buf.x, 65536, 17u, 0x3f80);        // x: about +-[1, 2)
  fillBits<<<64, 256>>>((unsigned short *)buf.a, 131072, 23u, 0x3f80); // a, b: fp32 from BF16 pairs
  fillBits<<<64, 256>>>((unsigned short *)buf.b, 131072, 29u, 0x3f80);
  fillBits<<<64, 256>>>((unsigned short *)buf.gamma, 131072, 31u, 0x3f80);
  CK(cudaDeviceSynchronize());
  // gpt-1.3b's products at the tiles Gemv.cpp took before session 52 (qkv and fc1 1 1, proj 2 8,
  // fc2 1 8) and the best of gemv_decode's; then gpt2-124m's.
  shape<6144, 2048, 1, 1, true, false>("qkv+norm", buf);
  shape<6144, 2048, 1, 2, true, false>("qkv+norm", buf);
  shape<2048, 2048, 2, 8, false, false>("proj", buf);
  shape<2048, 2048, 1, 2, false, false>("proj", buf);
  shape<8192, 2048, 1, 1, true, true>("fc1+norm", buf);
  shape<8192, 2048, 1, 2, true, true>("fc1+norm", buf);
  shape<2048, 8192, 1, 8, false, false>("fc2", buf);
  shape<2048, 8192, 1, 4, false, false>("fc2", buf);
  shape<2304, 768, 2, 1, true, false>("124m qkv", buf);
  shape<768, 768, 1, 1, false, false>("124m proj", buf);
  shape<3072, 768, 2, 1, true, true>("124m fc1", buf);
  shape<768, 3072, 1, 4, false, false>("124m fc2", buf);
  return 0;
}
