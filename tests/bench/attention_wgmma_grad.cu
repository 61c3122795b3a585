// The causal attention's gradient on Hopper's warpgroup products (attention_wgmma_grad.cuh: dk
// and dv by key tiles, dq by query tiles) against the mma.sync kernels they would replace
// (attention.cuh's attentionKeyValueGradBf16 and attentionQueryGradBf16) on the same operands:
// head-major BF16 q, k, v and dout, the forward's lse (attentionForwardBf16's), delta drawn. The
// largest difference of dq, dk and dv (the warp-specialised dk dv kernel: dk and dv, its
// operands in SwizzledTiles' layout), then the time of each kernel (#40: gpt-1.3b's shape at T
// 1024 and 4096, gpt2-124m's). FLOPs: 4 causal products of 2 B H T^2 DH / 2 for dk dv (s^T,
// dp^T, dv, dk), 3 for dq (s, dp, dq); the sum against cuDNN's gradient is counted as 5.
// Not part of the build (the CMake check compiles it for sm_90, where the products trap):
//   nvcc -O3 -std=c++17 -arch=sm_90a -Ibackends/cuda/kernels -Isupport -o attention_wgmma_grad \
//     tests/bench/attention_wgmma_grad.cu && ./attention_wgmma_grad
#include "attention_wgmma_fused_grad.cuh"
#include "bench_util.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    forward(const unsigned short *heads, float *out, float *lse, float scale) {
  attentionForwardBf16<B, T, H, DH>(heads, out, lse, scale);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    referenceGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
                  const float *delta) {
  attentionKeyValueGradBf16<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kAttentionThreads)
    referenceQueryGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale,
                       const float *lse, const float *delta) {
  attentionQueryGradBf16<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    wgmmaQueryGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
                   const float *delta) {
  attentionQueryGradWgmma<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kWgmmaThreads, 1)
    wgmmaGrad(const unsigned short *dout, const unsigned short *heads, float *dqkv, float scale, const float *lse,
              const float *delta) {
  attentionKeyValueGradWgmma<B, T, H, DH>(dout, heads, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    specialisedGrad(const unsigned short *tiles, float *dqkv, float scale, const float *lse, const float *delta) {
  attentionKeyValueGradSpecialised<B, T, H, DH>(tiles, dqkv, scale, lse, delta);
}

template <int B, int T, int H, int DH, bool ORDERED = true, bool REVERSED = false, bool PACKED = true,
          FusedFlavor FLAVOR = kPlain>
__global__ void __launch_bounds__(kSpecialisedThreads, 1)
    fusedGrad(const unsigned short *tiles, float *dqkv, float scale, const float *lse, const float *delta,
              FusedGradBuffers buffers) {
#if TGC_WGMMA
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); // (only finishQueryGrads waits on it)
#endif
  attentionGradFused<B, T, H, DH, ORDERED, REVERSED, PACKED, FLAVOR>(tiles, dqkv, scale, lse, delta, buffers);
}

template <int B, int T, int H, int DH>
__global__ void __launch_bounds__(256) finishQueryGrads(const float *dq, const unsigned *added, float *dqkv) {
  constexpr int QTILES = (T + kGradQueries - 1) / kGradQueries;
  finishQueryGradTile<B, T, H, DH>(dq, added, dqkv, blockIdx.x / QTILES, blockIdx.x % QTILES);
}

template <int B, int T, int H, int DH, bool PACKED = true>
__global__ void fusedQueryGrads(const float *dq, float *dqkv) {
  attentionFusedQueryGrads<B, T, H, DH, PACKED>(dq, dqkv);
}

template <int T, int DH> __global__ void swizzleHeads(const unsigned short *heads, unsigned short *tiles, long count) {
  toSwizzledTiles<T, DH>(heads, tiles, count);
}

// delta: n values of +-[0.5, 1) from the hashed bits.
__global__ void fillDelta(float *x, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u;
    h ^= h >> 13;
    x[i] = ((h & 1) ? -1.0f : 1.0f) * (0.5f + (h >> 9) * 0x1p-24f);
  }
}

// The fused gradient's forms the bench runs, each into its own dqkv: its kernel, shared memory,
// blocks (a block an item, or persistent: one an SM), dq's conversion (packed or not; or
// finished, a tile a block behind the fused kernel: finishQueryGradTile) and whether its dq
// buffer is zeroed first (unless fusedGradStoresFirst). A form without a kernel times the
// counters' zeroing and dq's conversion alone.
using FusedKernel = void (*)(const unsigned short *, float *, float, const float *, const float *, FusedGradBuffers);
using ConvertKernel = void (*)(const float *, float *);
using FinishKernel = void (*)(const float *, const unsigned *, float *);
using MappedKernel = void (*)(AttentionMaps, float *, float, const float *, const float *, FusedGradBuffers);
struct FusedForm {
  const char *name;
  FusedKernel kernel;
  int shared;
  long blocks;
  ConvertKernel convert;
  bool zeroes;
  FinishKernel finish = nullptr;
  MappedKernel mapped = nullptr; // (then `kernel` is null)
};

template <int B, int T, int H, int DH, bool ORDERED, bool REVERSED, bool PACKED, FusedFlavor FLAVOR = kPlain>
FusedForm fusedForm(const char *name, long blocks) {
  FusedKernel kernel = fusedGrad<B, T, H, DH, ORDERED, REVERSED, PACKED, FLAVOR>;
  const int shared = attentionFusedGradShared<DH, PACKED, fusedGradLagged<FLAVOR, DH>()>();
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
  return {name, kernel, shared, blocks, fusedQueryGrads<B, T, H, DH, PACKED>, !fusedGradStoresFirst<ORDERED, PACKED>()};
}

// A packed, in-order form whose dq is finished behind it (finishQueryGrads) rather than converted.
template <int B, int T, int H, int DH, FusedFlavor FLAVOR> FusedForm finishedForm(const char *name, long blocks) {
  FusedForm form = fusedForm<B, T, H, DH, true, false, true, FLAVOR>(name, blocks);
  form.finish = finishQueryGrads<B, T, H, DH>;
  return form;
}

// A packed, in-order form whose operands come by tensor maps (fusedGradMapped).
template <int B, int T, int H, int DH, FusedFlavor FLAVOR> FusedForm mappedForm(const char *name, long blocks) {
  FusedForm form = fusedForm<B, T, H, DH, true, false, true, FLAVOR>(name, blocks);
  form.kernel = nullptr;
  form.mapped = fusedGradMapped<B, T, H, DH, FLAVOR, float *>;
  CK(cudaFuncSetAttribute(form.mapped, cudaFuncAttributeMaxDynamicSharedMemorySize, form.shared));
  return form;
}

template <int B, int T, int H, int DH> std::vector<FusedForm> fusedForms() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long items = (long)B * H * SwizzledTiles<T, DH>::TILES, persistent = std::min<long>(items, sms);
  return {
      fusedForm<B, T, H, DH, true, false, true>("fused (dq added in order)", items),
      fusedForm<B, T, H, DH, true, false, true, kOverlapped>("fused overlapped (FlashAttention-3's order; in order)",
                                                             items),
      fusedForm<B, T, H, DH, true, false, true, kLagged>("fused lagged (dq a step late; in order)", items),
      fusedForm<B, T, H, DH, true, false, true, kLagged>("fused lagged persistent (in order)", persistent),
      finishedForm<B, T, H, DH, kPlain>("fused, dq finished under its tail (in order)", items),
      finishedForm<B, T, H, DH, kOverlapped>("fused overlapped, dq finished under its tail (in order)", items),
      mappedForm<B, T, H, DH, kPlain>("fused, operands by tensor maps (in order)", items),
      mappedForm<B, T, H, DH, kOverlapped>("fused overlapped, operands by tensor maps (in order)", items),
      fusedForm<B, T, H, DH, false, false, true>("fused unordered (not deterministic)", items),
      fusedForm<B, T, H, DH, true, true, true>("fused reversed (the longest items first; in order)", items),
      fusedForm<B, T, H, DH, true, false, false>("fused padded (a bulk reduction a row; in order)", items),
      fusedForm<B, T, H, DH, true, false, true>("fused persistent (in order)", persistent),
      fusedForm<B, T, H, DH, true, true, true>("fused persistent reversed (in order)", persistent),
      {"the counters' zeroing and dq's conversion alone", nullptr, 0, 0, fusedQueryGrads<B, T, H, DH, true>, false},
  };
}

// The largest differences of `variant`'s dq, dk and dv (dk and dv alone: the warp-specialised
// kernel's) from dqkv[0]'s, against their largest sizes.
void printDifferences(const char *name, const std::vector<float> &x, const float *variant, long count, int width,
                      bool keysAlone) {
  std::vector<float> y(count);
  CK(cudaMemcpy(y.data(), variant, count * 4, cudaMemcpyDeviceToHost));
  double largest[3] = {}, size[3] = {};
  for (long i = 0; i < count; ++i) {
    int part = (int)(i % (3L * width) / width); // q, k, v
    if (keysAlone && part == 0)
      continue;
    largest[part] = std::max(largest[part], std::isfinite(y[i]) ? (double)std::fabs(x[i] - y[i]) : INFINITY);
    size[part] = std::max(size[part], (double)std::fabs(x[i]));
  }
  printf("  %s:", name);
  const char *parts[3] = {"dq", "dk", "dv"};
  for (int part = keysAlone ? 1 : 0; part < 3; ++part)
    printf(" %s differs by %.3g (of %.3g)%s", parts[part], largest[part], size[part],
           largest[part] < 2e-2 * size[part] ? "" : " ** MISMATCH **");
  printf("\n");
}

template <int B, int T, int H, int DH> void compare(bool timed) {
  constexpr long PART = (long)B * H * T * DH, ROWS = (long)B * H * T;
  unsigned short *heads, *dout;
  CK(cudaMalloc(&heads, 3 * PART * 2));
  CK(cudaMalloc(&dout, PART * 2));
  fillBits<<<1024, 256>>>(heads, 3 * PART, 1234u + T + DH, 0x3f00); // +-[0.5, 1)
  fillBits<<<1024, 256>>>(dout, PART, 99u + T, 0x3f00);
  const std::vector<FusedForm> forms = fusedForms<B, T, H, DH>();
  const int SPLIT = 3, VARIANTS = SPLIT + (int)forms.size() - 1; // the last form writes no gradient
  float *out, *lse, *delta;
  std::vector<float *> dqkv(VARIANTS);
  CK(cudaMalloc(&out, PART * 4));
  CK(cudaMalloc(&lse, ROWS * 4));
  CK(cudaMalloc(&delta, ROWS * 4));
  fillDelta<<<256, 256>>>(delta, ROWS);
  const float scale = 1.0f / std::sqrt((float)DH);
  forward<B, T, H, DH><<<B * H *((T + 63) / 64), kAttentionThreads>>>(heads, out, lse, scale);
  unsigned short *tiles; // q, k, v, dout in the products' layout, for the warp-specialised kernel
  const long TILED = (long)B * H * SwizzledTiles<T, DH>::HEAD;
  CK(cudaMalloc(&tiles, 4 * TILED * 2));
  swizzleHeads<T, DH><<<1024, 256>>>(heads, tiles, 3L * B * H);
  swizzleHeads<T, DH><<<1024, 256>>>(dout, tiles + 3 * TILED, (long)B * H);
  AttentionMaps maps;
  encodeHeads(&maps.heads, heads, 3L * B * H, T, DH);
  encodeHeads(&maps.dout, dout, (long)B * H, T, DH);
  FusedGradBuffers buffers{};
  constexpr long QTILES = (T + kGradQueries - 1) / kGradQueries;
  CK(cudaMalloc(&buffers.dq, PART * 4));
  CK(cudaMalloc(&buffers.added, B * H * QTILES * 4));
  for (float *&p : dqkv) {
    CK(cudaMalloc(&p, 3 * PART * 4));
    CK(cudaMemset(p, 0, 3 * PART * 4));
  }
  const int shared = attentionGradWgmmaShared<DH>(), queryShared = attentionQueryGradWgmmaShared<DH>();
  CK(cudaFuncSetAttribute(wgmmaGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
  CK(cudaFuncSetAttribute(wgmmaQueryGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize, queryShared));
  const int specialisedShared = attentionGradSpecialisedShared<DH>();
  CK(cudaFuncSetAttribute(specialisedGrad<B, T, H, DH>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          specialisedShared));
  const long tiles64 = B * H * ((T + 63) / 64), tiles128 = B * H * ((T + kWgmmaRows - 1) / kWgmmaRows);
  // 0, 1: mma.sync's dk dv and dq (into dqkv[0]); 2, 3: wgmma's (into dqkv[1]); 4: the
  // warp-specialised dk dv (into dqkv[2]: dk and dv alone); 5 + f: fused form f (into dqkv[3 +
  // f], its buffers zeroed first and dq converted after)
  bool checking = true;
  auto run = [&](int i, cudaStream_t st) {
    if (i == 0)
      referenceGrad<B, T, H, DH><<<tiles64, kAttentionThreads, 0, st>>>(dout, heads, dqkv[0], scale, lse, delta);
    else if (i == 1)
      referenceQueryGrad<B, T, H, DH><<<tiles64, kAttentionThreads, 0, st>>>(dout, heads, dqkv[0], scale, lse, delta);
    else if (i == 2)
      wgmmaGrad<B, T, H, DH><<<tiles128, kWgmmaThreads, shared, st>>>(dout, heads, dqkv[1], scale, lse, delta);
    else if (i == 3)
      wgmmaQueryGrad<B, T, H, DH>
          <<<tiles128, kWgmmaThreads, queryShared, st>>>(dout, heads, dqkv[1], scale, lse, delta);
    else if (i == 4)
      specialisedGrad<B, T, H, DH>
          <<<tiles128, kSpecialisedThreads, specialisedShared, st>>>(tiles, dqkv[2], scale, lse, delta);
    else {
      const FusedForm &form = forms[i - 5];
      float *into = dqkv[std::min(SPLIT + i - 5, VARIANTS - 1)];
      if (form.zeroes)
        CK(cudaMemsetAsync(buffers.dq, 0, PART * 4, st));
      else if (checking) // NaN wherever a form that stores its first tiles leaves one unwritten
        CK(cudaMemsetAsync(buffers.dq, 0xff, PART * 4, st));
      CK(cudaMemsetAsync(buffers.added, 0, B * H * QTILES * 4, st));
      if (form.kernel)
        form.kernel<<<form.blocks, kSpecialisedThreads, form.shared, st>>>(tiles, into, scale, lse, delta, buffers);
      else if (form.mapped)
        form.mapped<<<form.blocks, kSpecialisedThreads, form.shared, st>>>(maps, into, scale, lse, delta, buffers);
      if (form.finish)
        CK(launchWith(cudaLaunchAttributeProgrammaticStreamSerialization, form.finish, B * H * QTILES, 256, st,
                      (const float *)buffers.dq, (const unsigned *)buffers.added, into));
      else
        form.convert<<<1024, 256, 0, st>>>(buffers.dq, into);
    }
  };
  cudaStream_t once; // (a stream of its own: the finished forms' launches are programmatic)
  CK(cudaStreamCreateWithFlags(&once, cudaStreamNonBlocking));
  CK(cudaDeviceSynchronize()); // the operands, made on the default stream, which `once` does not wait for
  for (int i = 0; i < 5 + VARIANTS - SPLIT; ++i) { // each once, checked, before any is timed
    run(i, once);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(once));
  }
  CK(cudaStreamDestroy(once));
  checking = false;
  std::vector<float> x(3 * PART);
  CK(cudaMemcpy(x.data(), dqkv[0], 3 * PART * 4, cudaMemcpyDeviceToHost));
  printf("B %d T %d H %d DH %d:\n", B, T, H, DH);
  printDifferences("wgmma", x, dqkv[1], 3 * PART, H * DH, false);
  printDifferences("wgmma warp-specialised", x, dqkv[2], 3 * PART, H * DH, true);
  for (int f = 0; f + SPLIT < VARIANTS; ++f)
    printDifferences(forms[f].name, x, dqkv[SPLIT + f], 3 * PART, H * DH, false);
  if (timed) {
    const double product = 2.0 * B * H * (double)T * T * DH / 2; // FLOPs of one causal product
    float us[5];
    const char *names[5] = {"mma.sync dk dv", "mma.sync dq", "wgmma dk dv", "wgmma dq", "wgmma dk dv warp-specialised"};
    for (int i = 0; i < 5; ++i) {
      us[i] = timeGraph(10, [&](int, cudaStream_t st) { run(i, st); });
      printf("  %s %.1f us (%.0f TFLOP/s)\n", names[i], us[i], (i % 2 ? 3 : 4) * product / us[i] / 1e6);
    }
    printf("  the gradient (5 products' FLOPs, as cuDNN's is counted): mma.sync %.1f us (%.0f TFLOP/s), wgmma %.1f us "
           "(%.0f TFLOP/s)\n",
           us[0] + us[1], 5 * product / (us[0] + us[1]) / 1e6, us[2] + us[3], 5 * product / (us[2] + us[3]) / 1e6);
    printf("  with the warp-specialised dk dv: %.1f us (%.0f TFLOP/s)\n", us[4] + us[3],
           5 * product / (us[4] + us[3]) / 1e6);
    for (size_t f = 0; f < forms.size(); ++f) { // the zeroing and dq's conversion included
      float fused = timeGraph(10, [&](int, cudaStream_t st) { run(5 + (int)f, st); });
      printf("  %s: %.1f us (%.0f TFLOP/s)\n", forms[f].name, fused, 5 * product / fused / 1e6);
    }
  }
  for (float *p : dqkv)
    CK(cudaFree(p));
  for (float *p : {out, lse, delta, buffers.dq})
    CK(cudaFree(p));
  CK(cudaFree(buffers.added));
  CK(cudaFree(tiles));
  CK(cudaFree(heads));
  CK(cudaFree(dout));
}

// With an argument ("profile"): the T 4096 shape alone, untimed, each kernel launched once (for
// ncu: `ncu -k regex:fusedGrad ./attention_wgmma_grad profile`).
int main(int argc, char **argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0); // each line to the log as it comes: a kernel that hangs loses none
  if (argc > 1) {
    compare<4, 4096, 16, 128>(false);
    return 0;
  }
  memoryBandwidth();
  compare<1, 200, 2, 64>(false); // T past a tile, not a multiple of one
  compare<1, 200, 2, 128>(false);
  compare<2, 1024, 4, 128>(false);
  compare<16, 1024, 12, 64>(true);  // gpt2-124m
  compare<16, 1024, 16, 128>(true); // gpt-1.3b
  compare<4, 4096, 16, 128>(true);  // gpt-1.3b at T 4096
  return 0;
}
