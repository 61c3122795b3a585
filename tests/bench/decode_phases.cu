// Where a batch-1 decode layer spends its time between the products (#41: the attention costs
// 7.35 us a layer in gpt-1.3b's chain and 5.29 in gpt2-124m's, TGC_GPU_PROFILE=marginal, while
// the bytes it reads take well under a microsecond): one layer's five kernels as the decode step
// launches them, at gpt-1.3b's and gpt2-124m's shapes and the lowering's choices: fc2 of the
// layer before (launched plainly, after the stamps' reset), then under programmatic launch, each
// awaiting the one before, norm + qkv, the attention writing its cache row (gpt-1.3b's streamed,
// 32 parts a head; gpt2-124m's through shared tiles, 32 keys a part), proj, norm + fc1. With
// TGC_PHASE_STAMPS each kernel's blocks stamp the global timer as they start, once they have
// awaited the kernel before, and as they end, and the attention at its phases (common.cuh's
// TgcPhase); the first and last stamp of each phase over the blocks, as microseconds from fc2's
// first block, medians of 200 runs of the chain (a CUDA graph replayed, the stamps reset first).
// At positions 16, 128 and 1000 of the cache.
// Not part of the build:
//   nvcc -O3 -std=c++17 -arch=sm_90 -Ibackends/cuda/kernels -Isupport -o decode_phases \
//     tests/bench/decode_phases.cu && ./decode_phases
#define TGC_PHASE_STAMPS
#include "bench_util.cuh"
#include "decode_stream.cuh"
#include "gemv.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

constexpr int64 T = 1024; // the caches' positions

// The bench's own phases (below kPhaseKernels): a kernel's start, its wait over, its end.
enum : int { kFc2 = 0, kQkv = 3, kAttention = 6, kProj = 9, kFc1 = 12 };

// A model's layer as its batch-1 decode step runs it (the generated kernels' calls, Gemv.cpp's
// and Decode.cpp's choices). The products await the kernel before them themselves, after their
// first weights' loads: the plain ones stamp in their (empty) prologue, right after the wait; the
// normalising ones have no such stamp (their prologue is the norm), nor has gpt2-124m's
// attention, which loads its tiles before it awaits (Early).
struct Gpt13b {
  static constexpr const char *name = "gpt-1.3b";
  static constexpr int64 D = 2048, H = 16, Dh = 128, F = 4 * D, Splits = 32;
  static constexpr int ProductsPerSm = 4, AttentionPerSm = 8;
  static constexpr long fc2Blocks = 4 * 132, qkvBlocks = 4 * 132, attentionBlocks = H * Splits, projBlocks = D / 8,
                        fc1Blocks = 4 * 132;
  static __device__ void fc2(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
    gemvBf16RowsStrided<1, D, F, 1, 4, true, false, false>(
        w, bias, out, [] { tgcStamp(kFc2 + 1); }, x);
  }
  static __device__ void qkv(const float *a, const float *b, const float *gamma, const float *beta,
                             const unsigned short *w, const float *bias, float *sum, float *out) {
    residualNormGemvBf16<true, 1, 3 * D, D, 1, 2, true, false, false, 0, true>(a, b, gamma, beta, w, bias, sum, out,
                                                                               1e-5);
  }
  static __device__ void attention(const float *qkv, unsigned short *k, unsigned short *v, const int *positions,
                                   unsigned short *out, float *partial, unsigned *done, float scale) {
    tgcStamp(kAttention);
    awaitPreviousKernel();
    tgcStamp(kAttention + 1);
    decodeAttentionStream<true, 1, H, Dh, T, Splits, true, H, false, 1>(
        qkv, (const unsigned short *)k, (const unsigned short *)v, positions, Bf16Out{out}, partial, done, scale,
        Bf16Out{k}, Bf16Out{v});
  }
  static __device__ void proj(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
    gemvBf16Rows<1, D, D, 2, 8, true, false, false>(
        w, bias, out, [] { tgcStamp(kProj + 1); }, x);
  }
  static __device__ void fc1(const float *a, const float *b, const float *gamma, const float *beta,
                             const unsigned short *w, const float *bias, float *sum, unsigned short *out) {
    residualNormGemvBf16<true, 1, F, D, 1, 2, true, true, false, 0, true>(a, b, gamma, beta, w, bias, sum, Bf16Out{out},
                                                                          1e-5);
  }
};

struct Gpt124m {
  static constexpr const char *name = "gpt2-124m";
  static constexpr int64 D = 768, H = 12, Dh = 64, F = 4 * D, Keys = 32, Splits = T / Keys;
  static constexpr int ProductsPerSm = 1, AttentionPerSm = 1;
  static constexpr long fc2Blocks = D / 2, qkvBlocks = 3 * D / 16, attentionBlocks = H * Splits, projBlocks = D / 8,
                        fc1Blocks = F / 16;
  static __device__ void fc2(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
    gemvBf16Rows<1, D, F, 1, 4, true, false, false>(
        w, bias, out, [] { tgcStamp(kFc2 + 1); }, x);
  }
  static __device__ void qkv(const float *a, const float *b, const float *gamma, const float *beta,
                             const unsigned short *w, const float *bias, float *sum, float *out) {
    residualNormGemvBf16<true, 1, 3 * D, D, 2, 1, true, false, false, 0>(a, b, gamma, beta, w, bias, sum, out, 1e-5);
  }
  static __device__ void attention(const float *qkv, unsigned short *k, unsigned short *v, const int *positions,
                                   unsigned short *out, float *partial, unsigned *done, float scale) {
    tgcStamp(kAttention);
    decodeAttention<true, 1, H, Dh, T, Keys, Splits, true, true, true, H, false, 1>(
        qkv, (const unsigned short *)k, (const unsigned short *)v, positions, Bf16Out{out}, partial, done, scale,
        Bf16Out{k}, Bf16Out{v});
  }
  static __device__ void proj(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
    gemvBf16Rows<1, D, D, 1, 1, true, false, false>(
        w, bias, out, [] { tgcStamp(kProj + 1); }, x);
  }
  static __device__ void fc1(const float *a, const float *b, const float *gamma, const float *beta,
                             const unsigned short *w, const float *bias, float *sum, unsigned short *out) {
    residualNormGemvBf16<true, 1, F, D, 2, 1, true, true, false, 0>(a, b, gamma, beta, w, bias, sum, Bf16Out{out},
                                                                    1e-5);
  }
};

template <typename Model>
__global__ void __launch_bounds__(256, Model::ProductsPerSm)
    fc2(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
  tgcStamp(kFc2);
  Model::fc2(x, w, bias, out);
  tgcStamp(kFc2 + 2);
}
template <typename Model>
__global__ void __launch_bounds__(256, Model::ProductsPerSm)
    qkv(const float *a, const float *b, const float *gamma, const float *beta, const unsigned short *w,
        const float *bias, float *sum, float *out) {
  tgcStamp(kQkv);
  Model::qkv(a, b, gamma, beta, w, bias, sum, out);
  tgcStamp(kQkv + 2);
}
template <typename Model>
__global__ void __launch_bounds__(128, Model::AttentionPerSm)
    attention(const float *qkv, unsigned short *k, unsigned short *v, const int *positions, unsigned short *out,
              float *partial, unsigned *done, float scale) {
  Model::attention(qkv, k, v, positions, out, partial, done, scale);
  tgcStamp(kAttention + 2);
}
template <typename Model>
__global__ void proj(const unsigned short *x, const unsigned short *w, const float *bias, float *out) {
  tgcStamp(kProj);
  Model::proj(x, w, bias, out);
  tgcStamp(kProj + 2);
}
template <typename Model>
__global__ void __launch_bounds__(256, Model::ProductsPerSm)
    fc1(const float *a, const float *b, const float *gamma, const float *beta, const unsigned short *w,
        const float *bias, float *sum, unsigned short *out) {
  tgcStamp(kFc1);
  Model::fc1(a, b, gamma, beta, w, bias, sum, out);
  tgcStamp(kFc1 + 2);
}

__global__ void resetStamps() {
  for (int p = threadIdx.x; p < kPhaseCount; p += blockDim.x)
    tgcPhaseFirst[p] = ~0ull, tgcPhaseLast[p] = 0;
}

struct Layer {
  unsigned short *wFc2, *wQkv, *wProj, *wFc1, *k, *v, *context, *hidden;
  float *bias, *gamma, *beta, *a, *b, *sum, *sum2, *qkvOut, *projOut, *partial;
  int *positions;
  unsigned *done;
};

// The chain, each launch under programmatic serialization after fc2.
template <typename Model> void chain(const Layer &l, cudaStream_t s) {
  const float scale = 1.0f / std::sqrt((float)Model::Dh);
  resetStamps<<<1, 32, 0, s>>>();
  auto pdl = cudaLaunchAttributeProgrammaticStreamSerialization;
  fc2<Model><<<Model::fc2Blocks, 256, 0, s>>>(l.hidden, l.wFc2, l.bias, l.b); // after the reset, not beside it
  CK(launchWith(pdl, qkv<Model>, Model::qkvBlocks, 256, s, (const float *)l.a, (const float *)l.b,
                (const float *)l.gamma, (const float *)l.beta, (const unsigned short *)l.wQkv, (const float *)l.bias,
                l.sum, l.qkvOut));
  CK(launchWith(pdl, attention<Model>, Model::attentionBlocks, 128, s, (const float *)l.qkvOut, l.k, l.v,
                (const int *)l.positions, l.context, l.partial, l.done, scale));
  CK(launchWith(pdl, proj<Model>, Model::projBlocks, 256, s, (const unsigned short *)l.context,
                (const unsigned short *)l.wProj, (const float *)l.bias, l.projOut));
  CK(launchWith(pdl, fc1<Model>, Model::fc1Blocks, 256, s, (const float *)l.sum, (const float *)l.projOut,
                (const float *)l.gamma, (const float *)l.beta, (const unsigned short *)l.wFc1, (const float *)l.bias,
                l.sum2, l.hidden));
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x.empty() ? -1.0 : x[x.size() / 2];
}

// Model's chain at each position: the table of phases.
template <typename Model> void run(cudaStream_t stream) {
  constexpr int64 D = Model::D, F = Model::F, H = Model::H, Dh = Model::Dh;
  Layer l;
  l.wFc2 = bf16Weights(D * F, 1), l.wQkv = bf16Weights(3 * D * D, 2), l.wProj = bf16Weights(D * D, 3);
  l.wFc1 = bf16Weights(F * D, 4), l.k = bf16Weights(T * D, 5), l.v = bf16Weights(T * D, 6);
  l.context = bf16Weights(D, 7), l.hidden = bf16Weights(F, 8);
  float **floats[] = {&l.bias, &l.gamma, &l.beta, &l.a, &l.b, &l.sum, &l.sum2, &l.qkvOut, &l.projOut};
  for (float **p : floats) {
    CK(cudaMalloc(p, 3 * D * 4));
    CK(cudaMemset(*p, 0, 3 * D * 4));
  }
  fillBits<<<64, 256>>>((unsigned short *)l.gamma, 2 * D, 9, 0x3f80); // fp32 from BF16 pairs: about +-[1, 2)
  fillBits<<<64, 256>>>((unsigned short *)l.a, 2 * D, 10, 0x3f80);
  CK(cudaMalloc(&l.partial, H * Model::Splits * (Dh + 2) * 4));
  CK(cudaMalloc(&l.positions, 4));
  CK(cudaMalloc(&l.done, H * 4));
  CK(cudaMemset(l.done, 0, H * 4));
  const char *names[] = {"fc2", "norm + qkv", "attention", "proj", "norm + fc1"};
  const char *what[] = {"start", "awaited", "end"};
  const char *inner[] = {"query loaded", "keys multiplied", "part written", "parts combined"};
  for (int position : {16, 128, 1000}) {
    CK(cudaMemcpy(l.positions, &position, 4, cudaMemcpyHostToDevice));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    chain<Model>(l, stream);
    CK(cudaStreamEndCapture(stream, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    constexpr int Runs = 200;
    std::vector<std::vector<double>> first(kPhaseCount), last(kPhaseCount);
    for (int run = 0; run < Runs + 10; ++run) {
      CK(cudaGraphLaunch(exec, stream));
      CK(cudaStreamSynchronize(stream));
      unsigned long long f[kPhaseCount], t[kPhaseCount];
      CK(cudaMemcpyFromSymbol(f, tgcPhaseFirst, sizeof f));
      CK(cudaMemcpyFromSymbol(t, tgcPhaseLast, sizeof t));
      if (run < 10)
        continue; // warm-up
      for (int p = 0; p < kPhaseCount; ++p)
        if (t[p]) {
          first[p].push_back((f[p] - f[kFc2]) / 1e3);
          last[p].push_back((t[p] - f[kFc2]) / 1e3);
        }
    }
    printf("%s, position %d: us from fc2's first block (first block - last block to reach it, medians of %d)\n",
           Model::name, position, Runs);
    for (int kernel = 0; kernel < 5; ++kernel)
      for (int phase = 0; phase < 3; ++phase) {
        int p = kernel * 3 + phase;
        printf("  %-11s %-16s %7.2f - %7.2f\n", phase ? "" : names[kernel], what[phase], median(first[p]),
               median(last[p]));
        if (kernel == 2 && phase == 1)
          for (int i = 0; i < 4; ++i)
            printf("  %-11s %-16s %7.2f - %7.2f\n", "", inner[i], median(first[kPhaseKernels + i]),
                   median(last[kPhaseKernels + i]));
      }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
  }
  for (void *p : {(void *)l.wFc2, (void *)l.wQkv, (void *)l.wProj, (void *)l.wFc1, (void *)l.k, (void *)l.v,
                  (void *)l.context, (void *)l.hidden, (void *)l.partial, (void *)l.positions, (void *)l.done})
    cudaFree(p);
  for (float **p : floats)
    cudaFree(*p);
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms != 132)
    printf("(the grids are sized for 132 SMs; this GPU has %d)\n", sms);
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run<Gpt13b>(stream);
  run<Gpt124m>(stream);
  return 0;
}
