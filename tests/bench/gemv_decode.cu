// What the batch-1 decode step's products reach of the memory's rate (#41): gemv.cuh's GEMV
// (gemvBf16Rows) in each tile (C columns a warp, K split over KS warps; C 1 KS 1 is the
// one-warp-a-column kernel before session 41) at gpt-1.3b's and gpt2-124m's shapes, alone (a
// CUDA graph of 240 launches under programmatic dependent launch, cycling over weight copies that
// together exceed the L2) and as gpt-1.3b's 24 layers of four products (their tiles over one
// wave too, gemvBf16RowsStrided). Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o gemv_decode \
//     tests/bench/gemv_decode.cu && ./gemv_decode
#include "bench_util.cuh"
#include "gemv.cuh"

#include <algorithm>
#include <cstdio>
#include <vector>

// Wave: the tiles over a grid of 4 blocks an SM (gemvBf16RowsStrided), as Gemv.cpp gives
// gpt-1.3b's qkv, fc1 and fc2.
template <int64 N, int64 K, int C, int KS, bool Gelu, bool Wave>
__global__ void __launch_bounds__(256, Wave ? 4 : 1)
    plainProduct(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
  if constexpr (Wave)
    gemvBf16Strided<1, N, K, C, KS, true, Gelu>(x, w, bias, out, nullptr);
  else
    gemvBf16<1, N, K, C, KS, true, Gelu>(x, w, bias, out, nullptr);
}

template <int64 N, int64 K, int C, int KS, bool Gelu, bool Wave>
__global__ void __launch_bounds__(256, Wave ? 4 : 1)
    normedProduct(const float *a, const float *b, const float *gamma, const float *beta, const unsigned short *w,
                  const float *bias, float *sum, float *out) {
  residualNormGemvBf16<true, 1, N, K, C, KS, true, Gelu, false, 0, Wave>(a, b, gamma, beta, w, bias, sum, out, 1e-5);
}

struct Buffers { // activations shared by every launch; x in BF16, as the decode step stores it
  float *x, *bias, *a, *b, *gamma, *beta, *sum, *out;
};

int sms = 0; // the GPU's multiprocessors

template <int C, int KS, bool Wave = false>
long blocksFor(long N) {
  long columns = 8 / KS * C, tiles = (N + columns - 1) / columns;
  return Wave ? std::min(tiles, 4L * sms) : tiles;
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, long blocks, cudaStream_t stream, Args... args) {
  CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, kernel, blocks, 256, stream, args...));
}

// One product's launch on weight w.
template <int64 N, int64 K, int C, int KS, bool Norm, bool Gelu, bool Wave = false>
void launchProduct(const Buffers &buf, const unsigned short *w, cudaStream_t stream) {
  if constexpr (Norm)
    launch(normedProduct<N, K, C, KS, Gelu, Wave>, blocksFor<C, KS, Wave>(N), stream, (const float *)buf.a,
           (const float *)buf.b, (const float *)buf.gamma, (const float *)buf.beta, w, (const float *)buf.bias, buf.sum,
           buf.out);
  else
    launch(plainProduct<N, K, C, KS, Gelu, Wave>, blocksFor<C, KS, Wave>(N), stream, (const unsigned short *)buf.x, w,
           (const float *)buf.bias, buf.out);
}

double bandwidth = 0; // bytes/us of the device's memory (from its clock and bus width)

template <int64 N, int64 K, bool Norm, bool Gelu, int C, int KS>
void shape(const char *name, const Buffers &buf) {
  const long bytes = N * K * 2;
  const int copies = (int)std::max(2L, (400L << 20) / bytes);
  std::vector<unsigned short *> w;
  for (int i = 0; i < copies; ++i)
    w.push_back(bf16Weights(N * K, (unsigned)(N * K)));
  float us = timeGraph(240, [&](int i, cudaStream_t s) { launchProduct<N, K, C, KS, Norm, Gelu>(buf, w[i % copies], s); });
  printf("%-10s N %6lld K %5lld  C %d KS %d: %8.2f us  %7.1f GB/s  %5.1f%% of the memory's rate\n", name, N, K, C, KS,
         us, bytes / us / 1e3, 100 * bytes / us / bandwidth);
  for (auto p : w) cudaFree(p);
}

// Each (C, KS) pair of the list in turn.
template <int64 N, int64 K, bool Norm, bool Gelu>
void shapes(const char *, const Buffers &) {}
template <int64 N, int64 K, bool Norm, bool Gelu, int C, int KS, int... More>
void shapes(const char *name, const Buffers &buf) {
  shape<N, K, Norm, Gelu, C, KS>(name, buf);
  shapes<N, K, Norm, Gelu, More...>(name, buf);
}

// gpt-1.3b's 24 layers (norm + qkv, proj, norm + fc1, fc2), each product in its tile (C, KS);
// with Waves, qkv, fc1 and fc2 over one wave (gemvBf16RowsStrided).
template <int Cq, int KSq, int Cp, int KSp, int C1, int KS1, int C2, int KS2, bool Waves = false>
void layers(const Buffers &buf) {
  constexpr int64 D = 2048;
  std::vector<unsigned short *> w;
  for (int l = 0; l < 24; ++l)
    for (long n : {3 * D, D, 4 * D, 4 * D})
      w.push_back(bf16Weights(n * D, (unsigned)(n * D)));
  float us = timeGraph(96, [&](int i, cudaStream_t s) {
    const unsigned short *p = w[i];
    switch (i % 4) {
    case 0: launchProduct<3 * D, D, Cq, KSq, true, false, Waves>(buf, p, s); break;
    case 1: launchProduct<D, D, Cp, KSp, false, false>(buf, p, s); break;
    case 2: launchProduct<4 * D, D, C1, KS1, true, true, Waves>(buf, p, s); break;
    default: launchProduct<D, 4 * D, C2, KS2, false, false, Waves>(buf, p, s);
    }
  });
  const double bytes = 24.0 * 12 * D * D * 2;
  printf("gpt-1.3b's 24 layers, (C, KS) qkv %d %d, proj %d %d, fc1 %d %d, fc2 %d %d%s: %7.1f us a step of "
         "products, %5.1f%% of the memory's rate\n", Cq, KSq, Cp, KSp, C1, KS1, C2, KS2,
         Waves ? " (qkv, fc1, fc2 in one wave)" : "", us * 96, 100 * bytes / (us * 96) / bandwidth);
  for (auto p : w) cudaFree(p);
}

int main() {
  bandwidth = memoryBandwidth();
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Buffers buf;
  float **all[] = {&buf.x, &buf.bias, &buf.a, &buf.b, &buf.gamma, &buf.beta, &buf.sum, &buf.out};
  for (float **p : all) {
    CK(cudaMalloc(p, 65536 * 4));
    CK(cudaMemset(*p, 0, 65536 * 4));
  }
  layers<1, 1, 1, 1, 1, 1, 1, 1>(buf); // before session 41
  layers<2, 1, 4, 8, 2, 1, 2, 8>(buf);
  layers<1, 1, 4, 8, 1, 1, 2, 8>(buf);
  layers<1, 1, 2, 8, 1, 1, 1, 8>(buf); // Gemv.cpp's gemvTile before session 52
  layers<1, 2, 2, 8, 1, 2, 1, 4, true>(buf); // Gemv.cpp's tiles and waves since session 52
  layers<1, 1, 1, 8, 1, 1, 1, 4>(buf);
  layers<1, 1, 2, 2, 1, 1, 1, 2>(buf);
  layers<1, 1, 1, 1, 1, 1, 1, 4>(buf);
  shapes<6144, 2048, true, false, 1, 1, 2, 1, 4, 1>("qkv+norm", buf);
  shapes<2048, 2048, false, false, 1, 1, 2, 1, 1, 2, 2, 2, 2, 4, 4, 4, 1, 8, 2, 8, 4, 8>("proj", buf);
  shapes<8192, 2048, true, true, 1, 1, 2, 1, 4, 1>("fc1+norm", buf);
  shapes<2048, 8192, false, false, 1, 1, 1, 2, 1, 4, 2, 4, 1, 8, 2, 8, 4, 8>("fc2", buf);
  shapes<50304, 2048, false, false, 1, 1, 2, 1, 2, 2, 4, 4, 4, 8>("lm head", buf);
  shapes<2304, 768, true, false, 1, 1, 2, 1, 4, 1>("124m qkv", buf);
  shapes<768, 768, false, false, 1, 1, 2, 1, 1, 2, 2, 2>("124m proj", buf);
  shapes<3072, 768, true, true, 1, 1, 2, 1, 4, 1>("124m fc1", buf);
  shapes<768, 3072, false, false, 1, 1, 1, 2, 1, 4, 2, 4>("124m fc2", buf);
  shapes<50304, 768, false, false, 1, 1, 2, 1, 4, 1, 2, 2>("124m head", buf);
  return 0;
}
