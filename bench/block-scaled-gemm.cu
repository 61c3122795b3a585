// A measurement behind [fp8-te]'s block scaling (Transformer Engine's Float8BlockScaling,
// DeepSeek-V3's recipe): whether this cuBLASLt runs FP8 GEMMs with 1x128 and 128x128 block
// scales on this GPU, which layout of the scales it reads, and what they cost against one scale
// a tensor at gpt-1.3b's shapes. Not part of the build. Built here, run on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o block-gemm bench/block-scaled-gemm.cu -lcublasLt && ./block-gemm
//
// In row-major terms every product is D[m][n] = sum_k X[m][k] W[n][k] (both operands
// K-contiguous: Hopper's FP8 GEMMs are TN only); cuBLASLt sees it column-major as
// D^T = op_T(W) X with m = N, n = M. A (= W) takes 128x128 blocks (a weight) or 1x128 blocks
// (the wgrad's second operand), B (= X) 1x128 blocks along K.
#include "bench.cuh"

#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace {

// The scale layouts tried: for 1x128 blocks of a rows x K operand, kb-major [K/128][rows] (rows
// contiguous) or row-major [rows][K/128]; for 128x128 blocks, [rows/128][ceil4(K/128)] or
// [K/128][rows/128].
enum Layout { VecKbMajor, VecRowMajor, BlkRowMajorPad4, BlkKbMajor };
const char *kLayoutNames[] = {"1x128 [K/128][rows]", "1x128 [rows][K/128]", "128x128 [rows/128][ceil4(K/128)]",
                              "128x128 [K/128][rows/128]"};

long ceil4(long x) { return (x + 3) / 4 * 4; }

// The index of block (row r, column k) of a rows x K operand's scales under `layout`.
long scaleIndex(Layout layout, long r, long k, long rows, long K) {
  long kb = k / 128, kBlocks = K / 128;
  switch (layout) {
  case VecKbMajor: return kb * rows + r;
  case VecRowMajor: return r * kBlocks + kb;
  case BlkRowMajorPad4: return (r / 128) * ceil4(kBlocks) + kb;
  case BlkKbMajor: return kb * (rows / 128) + r / 128;
  }
  return 0;
}

long scaleCount(Layout layout, long rows, long K) {
  return layout == BlkRowMajorPad4 ? rows / 128 * ceil4(K / 128) : (layout <= VecRowMajor ? rows * (K / 128) : rows / 128 * (K / 128));
}

bool isBlock(Layout layout) { return layout >= BlkRowMajorPad4; }

unsigned hashOf(unsigned x) {
  x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
  return x;
}

// One operand: FP8 values in [-1, 1], and a scale (what cuBLASLt multiplies by) a block, a power
// of two between 2^-6 and 2^5 from a hash of the block, so that a misread layout is far off.
struct Operand {
  std::vector<__nv_fp8_e4m3> q;
  std::vector<float> scales;
  long rows, K;
  Layout layout;
  Operand(long rows_, long K_, Layout layout_, unsigned seed) : rows(rows_), K(K_), layout(layout_) {
    q.resize(rows * K);
    for (long i = 0; i < rows * K; ++i)
      q[i] = __nv_fp8_e4m3(float(hashOf(unsigned(i) * 3u + seed) % 2001) / 1000.0f - 1.0f);
    scales.assign(scaleCount(layout, rows, K), 0.0f);
    for (long r = 0; r < rows; ++r)
      for (long k = 0; k < K; k += 128) {
        long b = isBlock(layout) ? (r / 128) * 1000 + k / 128 : r * 1000 + k / 128;
        scales[scaleIndex(layout, r, k, rows, K)] = std::ldexp(1.0f, int(hashOf(unsigned(b) + seed) % 12) - 6);
      }
  }
  float value(long r, long k) const { return float(q[r * K + k]) * scales[scaleIndex(layout, r, k, rows, K)]; }
};

struct Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
};

// The descriptor of D[M][N] (fp32 or bf16) = X[M][K] W[N][K]^T with the scale modes given (-1:
// one scalar a tensor) and the scale pointers; found 0 when the heuristic offers nothing.
int makeGemm(cublasLtHandle_t lt, long M, long N, long K, int modeW, int modeX, const float *scaleW,
             const float *scaleX, cudaDataType_t dType, size_t wsBytes, Gemm &g) {
  CK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  if (modeW >= 0) {
    CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &modeW, sizeof modeW));
    CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &modeX, sizeof modeX));
  }
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scaleW, sizeof scaleW));
  CK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scaleX, sizeof scaleX));
  CK(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_8F_E4M3, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_8F_E4M3, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&g.ld, dType, N, M, N));
  cublasLtMatmulPreference_t pref;
  CK(cublasLtMatmulPreferenceCreate(&pref));
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes));
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.la, g.lb, g.ld, g.ld, pref, 8, g.results, &g.found);
  if (s != CUBLAS_STATUS_SUCCESS)
    g.found = 0;
  cublasLtMatmulPreferenceDestroy(pref);
  return 0;
}

void freeGemm(Gemm &g) {
  cublasLtMatrixLayoutDestroy(g.la);
  cublasLtMatrixLayoutDestroy(g.lb);
  cublasLtMatrixLayoutDestroy(g.ld);
  cublasLtMatmulDescDestroy(g.desc);
}

// Runs the product of W and X (scales in the layouts given) once and compares it with the
// host's sum in double: prints the largest error relative to the largest |D|.
int checkLayouts(cublasLtHandle_t lt, void *ws, size_t wsBytes, Layout lw, Layout lx) {
  const long M = 256, N = 384, K = 640; // K/128 = 5: the padding to four blocks shows
  Operand w(N, K, lw, 11), x(M, K, lx, 23);
  void *dw, *dx, *dd;
  float *sw, *sx;
  CK(cudaMalloc(&dw, w.q.size()));
  CK(cudaMalloc(&dx, x.q.size()));
  CK(cudaMalloc(&dd, M * N * 4));
  CK(cudaMalloc(&sw, w.scales.size() * 4));
  CK(cudaMalloc(&sx, x.scales.size() * 4));
  CK(cudaMemcpy(dw, w.q.data(), w.q.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, x.q.data(), x.q.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sw, w.scales.data(), w.scales.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(sx, x.scales.data(), x.scales.size() * 4, cudaMemcpyHostToDevice));
  int modeW = isBlock(lw) ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  int modeX = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  for (cudaDataType_t dType : {CUDA_R_32F, CUDA_R_16BF}) {
    Gemm g;
    if (makeGemm(lt, M, N, K, modeW, modeX, sw, sx, dType, wsBytes, g)) return 1;
    printf("  W %-33s X %-20s D %s: ", kLayoutNames[lw], kLayoutNames[lx], dType == CUDA_R_32F ? "fp32" : "bf16");
    if (!g.found) {
      printf("no algorithm\n");
      freeGemm(g);
      continue;
    }
    float alpha = 1, beta = 0;
    CK(cublasLtMatmul(lt, g.desc, &alpha, dw, g.la, dx, g.lb, &beta, dd, g.ld, dd, g.ld, &g.results[0].algo, ws, wsBytes, 0));
    CK(cudaDeviceSynchronize());
    std::vector<float> d(M * N);
    if (dType == CUDA_R_32F) {
      CK(cudaMemcpy(d.data(), dd, M * N * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<__nv_bfloat16> h(M * N);
      CK(cudaMemcpy(h.data(), dd, M * N * 2, cudaMemcpyDeviceToHost));
      for (long i = 0; i < M * N; ++i) d[i] = __bfloat162float(h[i]);
    }
    double worst = 0, largest = 0;
    for (long m = 0; m < M; ++m)
      for (long n = 0; n < N; ++n) {
        double sum = 0;
        for (long k = 0; k < K; ++k) sum += double(x.value(m, k)) * w.value(n, k);
        largest = std::fmax(largest, std::fabs(sum));
        worst = std::fmax(worst, std::fabs(sum - d[m * N + n]));
      }
    printf("largest error %.3g of max |D| %.3g (%.2g)\n", worst, largest, worst / largest);
    freeGemm(g);
  }
  cudaFree(dw); cudaFree(dx); cudaFree(dd); cudaFree(sw); cudaFree(sx);
  return 0;
}

__global__ void fillFp8(__nv_fp8_e4m3 *x, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
    x[i] = __nv_fp8_e4m3((float)(h & 0xffff) / 65536.0f - 0.5f);
  }
}

__global__ void fillOnes(float *x, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) x[i] = 1.0f;
}

struct Case { const char *name; long m, n, k; };

} // namespace

int main() {
  cublasLtHandle_t lt;
  CK(cublasLtCreate(&lt));
  printf("cuBLASLt %zu\n", cublasLtGetVersion());
  size_t wsBytes = 32 << 20;
  void *ws;
  CK(cudaMalloc(&ws, wsBytes));
  printf("layouts (M 256, N 384, K 640), the first algorithm:\n");
  for (Layout lw : {BlkRowMajorPad4, BlkKbMajor, VecKbMajor, VecRowMajor})
    for (Layout lx : {VecKbMajor, VecRowMajor})
      if (checkLayouts(lt, ws, wsBytes, lw, lx)) return 1;
  // gpt-1.3b at 16 x 1024 tokens: the forward, dgrad (K = N of the forward) and wgrad (K = the
  // tokens; both operands 1x128) products of qkv, fc1 and fc2.
  const long T = 16384;
  Case cases[] = {{"qkv fwd", T, 6144, 2048},    {"fc1 fwd", T, 8192, 2048},   {"fc2 fwd", T, 2048, 8192},
                  {"qkv dgrad", T, 2048, 6144},  {"fc1 dgrad", T, 2048, 8192}, {"fc2 dgrad", T, 8192, 2048},
                  {"qkv wgrad", 6144, 2048, T},  {"fc1 wgrad", 8192, 2048, T}, {"fc2 wgrad", 2048, 8192, T}};
  const long most = T * 8192;
  __nv_fp8_e4m3 *a, *b;
  float *sa, *sb;
  void *d;
  CK(cudaMalloc(&a, most));
  CK(cudaMalloc(&b, most));
  CK(cudaMalloc(&d, most * 2));
  CK(cudaMalloc(&sa, most / 128 * 4));
  CK(cudaMalloc(&sb, most / 128 * 4));
  fillFp8<<<4096, 256>>>(a, most, 1);
  fillFp8<<<4096, 256>>>(b, most, 2);
  fillOnes<<<1024, 256>>>(sa, most / 128);
  fillOnes<<<1024, 256>>>(sb, most / 128);
  printf("%-10s %6s %6s %6s | %-24s | %-24s\n", "gemm", "m", "n", "k", "tensor scales: first/best", "block scales: first/best");
  double totals[4] = {0, 0, 0, 0};
  for (const Case &c : cases) {
    bool wgrad = c.k == T;
    printf("%-10s %6ld %6ld %6ld", c.name, c.m, c.n, c.k);
    for (int block = 0; block < 2; ++block) {
      int modeW = !block ? -1 : wgrad ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      Gemm g;
      if (makeGemm(lt, c.m, c.n, c.k, modeW, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, sa, sb, CUDA_R_16BF, wsBytes, g)) return 1;
      if (!g.found) {
        printf(" | %-24s", "no algorithm");
        freeGemm(g);
        continue;
      }
      float first = 0, best = 1e30f;
      for (int r = 0; r < g.found; ++r) {
        float ms;
        if (timeMatmul(lt, g.desc, a, g.la, b, g.lb, d, g.ld, &g.results[r].algo, ws, wsBytes, &ms)) return 1;
        if (r == 0) first = ms;
        best = ms < best ? ms : best;
      }
      printf(" | %6.3f / %6.3f (%4.0f TF)", first, best, 2.0 * c.m * c.n * c.k / (best * 1e-3) / 1e12);
      totals[2 * block] += first;
      totals[2 * block + 1] += best;
      freeGemm(g);
    }
    printf("\n");
  }
  printf("total: tensor scales %.3f / %.3f ms, block scales %.3f / %.3f ms\n", totals[0], totals[1], totals[2], totals[3]);
  return 0;
}
