// Causal attention without a [T, T] tensor, FlashAttention-2's scheme: the forward and a
// three-launch gradient (each query's statistics, then dk and dv by key tiles, then dq by
// query tiles; no atomics). BF16 on tensor cores (inline mma.sync) where the head dimension is
// a multiple of 16 up to 256, else a thread per row (fp32, or BF16 rounding where the BF16
// GEMMs round). The shapes are template arguments; each op's kernel is a one-line wrapper.
#pragma once

#include "common.cuh"
// ---- Causal attention without a [T, T] tensor (FlashAttention-2's scheme) ----
// qkv is [B, T, 3 * H * DH] (q | k | v, heads side by side), the output and dout [B, T, H * DH].
// A block takes 64 rows (queries, or keys in the key/value gradient) of one (sequence, head)
// and walks the other side 64 at a time; the softmax is taken online, so scores and
// probabilities never leave the block. lse and delta ([B * H, T]) carry, per query, the
// log-sum-exp of its scaled scores and sum_d dout * out from the statistics kernel to the two
// gradient kernels. Tiles of 64 rows: (T + 63) / 64 per (sequence, head).
enum { kAttentionRows = 64 }; // (an enumerator: no unused-variable warning)

__device__ __forceinline__ float quadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- BF16 on tensor cores (gemm_dtype = "bf16": operands rounded to BF16, fp32 sums) ----
// mma.sync m16n8k16 fragments, per lane (g = lane / 4, c = 2 * (lane % 4)):
//   A (16 x 16, row-major): {(g, c..c+1), (g+8, c..c+1), (g, c+8..c+9), (g+8, c+8..c+9)}
//   B (16 x 8, k x n):      {(k = c..c+1, n = g), (k = c+8..c+9, n = g)}
//   C (16 x 8 fp32):        (g, c), (g, c+1), (g+8, c), (g+8, c+1)
// so the C fragments of two neighbouring 8-column tiles are the A fragment of their 16 columns:
// probabilities go from one product to the next without leaving registers. Rows of the shared
// tiles are padded by 8 elements, which spreads a fragment's reads over all 32 banks.

// (cvt.rn rounds to nearest even as roundBf16 does, NaN to 0x7FFF too, in one instruction.)
__device__ __forceinline__ unsigned packBf16(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return (__float_as_uint(roundBf16(lo)) >> 16) | (__float_as_uint(roundBf16(hi)) & 0xffff0000u);
#endif
}

// d += a * b: a the A fragment, (b0, b1) the B fragment.
__device__ __forceinline__ void mmaBf16(float *d, const unsigned *a, unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
               "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap(); // BF16 GEMMs need compute capability 8.0 (the device policy never asks below it)
#endif
}

// Rows [first, first + 64) of one head's q, k, v or dout (src points at the head's first
// element of row 0; rows are `stride` floats apart) into a shared tile as BF16; rows at or past
// T are 0. The 128 threads issue BATCH float4 loads each before converting and storing any, so
// that a tile costs a few memory latencies rather than one per element group.
enum { kAttentionThreads = 128 }; // (an enumerator: no warning where only the other kernels are used)
template <int T, int DH, int BATCH>
__device__ void loadBf16Tile(unsigned short (*tile)[DH + 8], const float *src, int64 stride, int first) {
  constexpr int PER = kAttentionRows * DH / 4 / kAttentionThreads; // float4 per thread
  static_assert(PER % BATCH == 0, "the batches split a thread's loads evenly");
#pragma unroll 1
  for (int k0 = 0; k0 < PER; k0 += BATCH) {
    float4 x[BATCH];
#pragma unroll
    for (int k = 0; k < BATCH; ++k) {
      int i = threadIdx.x + (k0 + k) * kAttentionThreads, r = i / (DH / 4), d = 4 * (i % (DH / 4));
      x[k] = first + r < T ? *(const float4 *)(src + (first + r) * stride + d) : make_float4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < BATCH; ++k) {
      int i = threadIdx.x + (k0 + k) * kAttentionThreads, r = i / (DH / 4), d = 4 * (i % (DH / 4));
      *(uint2 *)&tile[r][d] = make_uint2(packBf16(x[k].x, x[k].y), packBf16(x[k].z, x[k].w));
    }
  }
}
// The loads in flight per thread: the largest divisor of the DH / 8 a thread loads that is at
// most MOST (8 in the key/value gradient, whose accumulators take more registers; else 16).
template <int DH, int MOST>
__host__ __device__ constexpr int tileBatch() {
  int batch = DH / 8 < MOST ? DH / 8 : MOST;
  while ((DH / 8) % batch != 0)
    --batch;
  return batch;
}

// The pair (row, col), (row, col + 1) of a shared tile, as a fragment register.
template <int DH>
__device__ __forceinline__ unsigned rowPair(const unsigned short (*tile)[DH + 8], int row, int col) {
  return *(const unsigned *)&tile[row][col];
}
// The pair (row, col), (row + 1, col): a B fragment register of a k x n operand stored [k][n].
template <int DH>
__device__ __forceinline__ unsigned columnPair(const unsigned short (*tile)[DH + 8], int row, int col) {
  return (unsigned)tile[row][col] | ((unsigned)tile[row + 1][col] << 16);
}

// The A fragments of 16 rows of a head (this lane's two: row0 and row0 + 8), straight from global
// memory; rows at or past T are 0.
template <int T, int DH>
__device__ void loadBf16Rows(unsigned (*a)[4], const float *src, int64 stride, int row0) {
  int c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int kk = 0; kk < DH / 16; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int row = row0 + 8 * half, d = kk * 16 + c;
      float2 lo = row < T ? *(const float2 *)(src + row * stride + d) : make_float2(0, 0);
      float2 hi = row < T ? *(const float2 *)(src + row * stride + d + 8) : make_float2(0, 0);
      a[kk][half] = packBf16(lo.x, lo.y);
      a[kk][2 + half] = packBf16(hi.x, hi.y);
    }
}

// s = (16 rows of a) x (8 * NJ rows of tile)^T: NJ C fragments over the tile's rows.
template <int DH, int NJ = 8>
__device__ __forceinline__ void scoresBf16(float (*s)[4], const unsigned (*a)[4], const unsigned short (*tile)[DH + 8]) {
  int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < DH / 16; ++kk)
      mmaBf16(s[j], a[kk], rowPair<DH>(tile, j * 8 + g, kk * 16 + c), rowPair<DH>(tile, j * 8 + g, kk * 16 + 8 + c));
  }
}

// acc += p x tile: p 16 x (8 * NJ) (NJ C fragments, rounded to BF16 here), tile (8 * NJ) x DH.
template <int DH, int NJ = 8>
__device__ __forceinline__ void accumulateBf16(float (*acc)[4], const float (*p)[4], const unsigned short (*tile)[DH + 8]) {
  int g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
#pragma unroll
  for (int kk = 0; kk < NJ / 2; ++kk) {
    unsigned a[4] = {packBf16(p[2 * kk][0], p[2 * kk][1]), packBf16(p[2 * kk][2], p[2 * kk][3]),
                     packBf16(p[2 * kk + 1][0], p[2 * kk + 1][1]), packBf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int n = 0; n < DH / 8; ++n)
      mmaBf16(acc[n], a, columnPair<DH>(tile, kk * 16 + c, n * 8 + g), columnPair<DH>(tile, kk * 16 + 8 + c, n * 8 + g));
  }
}

// The forward for 64 queries: out = softmax(mask(scale * q k^T)) v. With STATS (the gradient's
// first kernel) it writes lse and delta instead of the output.
template <int T, int H, int DH, bool STATS, typename Out>
__device__ void attentionForwardBf16(const float *qkv, Out out, float scale, const float *dout, float *lse, float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ __align__(16) unsigned short ks[kAttentionRows][DH + 8], vs[kAttentionRows][DH + 8];
  const int tile = TILES - 1 - blockIdx.x % TILES; // the longest rows of tiles first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
  const float *q = qkv + (int64)b * T * 3 * D + h * DH;
  const int row0 = tile * kAttentionRows + warp * 16 + g, row1 = row0 + 8;
  unsigned qa[DH / 16][4];
  loadBf16Rows<T, DH>(qa, q, 3 * D, row0);
  float o[DH / 8][4] = {};
  float m0 = __int_as_float(0xff800000), m1 = m0, l0 = 0.0f, l1 = 0.0f;
  for (int kt = 0; kt <= tile; ++kt) {
    __syncthreads(); // every warp is done with the previous keys
    loadBf16Tile<T, DH, tileBatch<DH, 8>()>(ks, q + D, 3 * D, kt * kAttentionRows);
    loadBf16Tile<T, DH, tileBatch<DH, 8>()>(vs, q + 2 * D, 3 * D, kt * kAttentionRows);
    __syncthreads();
    float s[8][4];
    scoresBf16<DH>(s, qa, ks);
    float max0 = m0, max1 = m1;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = kt * kAttentionRows + j * 8 + c + (e & 1), row = e < 2 ? row0 : row1;
        float x = key <= row && key < T ? s[j][e] * scale : __int_as_float(0xff800000);
        s[j][e] = x;
        if (e < 2) max0 = fmaxf(max0, x); else max1 = fmaxf(max1, x);
      }
    max0 = quadMax(max0);
    max1 = quadMax(max1);
    // Key 0 is in every row's first tile: the maxima are finite from there on.
    float alpha0 = expf(m0 - max0), alpha1 = expf(m1 - max1);
    m0 = max0;
    m1 = max1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = expf(s[j][e] - (e < 2 ? m0 : m1));
        s[j][e] = p;
        if (e < 2) sum0 += p; else sum1 += p;
      }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < DH / 8; ++n) {
      o[n][0] *= alpha0; o[n][1] *= alpha0;
      o[n][2] *= alpha1; o[n][3] *= alpha1;
    }
    accumulateBf16<DH>(o, s, vs);
  }
  l0 = quadSum(l0);
  l1 = quadSum(l1);
  float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = e < 2 ? row0 : row1, d = n * 8 + c + (e & 1);
      float value = o[n][e] / (e < 2 ? l0 : l1);
      if (row >= T)
        continue;
      int64 at = ((int64)b * T + row) * D + h * DH + d;
      if (STATS) { // dout rounded as the dp products read it (one key: dp - delta is 0)
        float d = roundBf16(dout[at]);
        if (e < 2) dot0 += d * value; else dot1 += d * value;
      } else {
        out[at] = value;
      }
    }
  if (STATS) {
    dot0 = quadSum(dot0);
    dot1 = quadSum(dot1);
    if (threadIdx.x % 4 == 0) {
      if (row0 < T) { lse[(int64)bh * T + row0] = m0 + logf(l0); delta[(int64)bh * T + row0] = dot0; }
      if (row1 < T) { lse[(int64)bh * T + row1] = m1 + logf(l1); delta[(int64)bh * T + row1] = dot1; }
    }
  }
}

// dk and dv for 64 keys: each query tile from the keys' own on, p^T and dp^T = v dout^T
// recomputed from lse and delta.
template <int T, int H, int DH, typename Out>
__device__ void attentionKeyValueGradBf16(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ __align__(16) unsigned short qs[kAttentionRows][DH + 8], dos[kAttentionRows][DH + 8];
  __shared__ float lses[kAttentionRows], deltas[kAttentionRows];
  const int tile = blockIdx.x % TILES; // the earliest keys have the most queries: first
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
  const float *q = qkv + (int64)b * T * 3 * D + h * DH, *dy = dout + (int64)b * T * D + h * DH;
  const int key0 = tile * kAttentionRows + warp * 16 + g, key1 = key0 + 8;
  unsigned ka[DH / 16][4], va[DH / 16][4];
  loadBf16Rows<T, DH>(ka, q + D, 3 * D, key0);
  loadBf16Rows<T, DH>(va, q + 2 * D, 3 * D, key0);
  float dk[DH / 8][4] = {}, dv[DH / 8][4] = {};
  for (int qt = tile; qt < TILES; ++qt) {
    __syncthreads();
    loadBf16Tile<T, DH, tileBatch<DH, 4>()>(qs, q, 3 * D, qt * kAttentionRows);
    loadBf16Tile<T, DH, tileBatch<DH, 4>()>(dos, dy, D, qt * kAttentionRows);
    for (int i = threadIdx.x; i < kAttentionRows; i += blockDim.x) {
      int row = qt * kAttentionRows + i;
      lses[i] = row < T ? lse[(int64)bh * T + row] : 0.0f;
      deltas[i] = row < T ? delta[(int64)bh * T + row] : 0.0f;
    }
    __syncthreads();
    // 32 queries at a time: fewer registers live next to dk and dv.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float p[4][4], dp[4][4];
      scoresBf16<DH, 4>(p, ka, qs + 32 * half);   // s^T: keys x queries
      scoresBf16<DH, 4>(dp, va, dos + 32 * half); // dp^T = v dout^T
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          int i = 32 * half + j * 8 + c + (e & 1), query = qt * kAttentionRows + i, key = e < 2 ? key0 : key1;
          float prob = key <= query && query < T ? expf(p[j][e] * scale - lses[i]) : 0.0f;
          p[j][e] = prob;
          dp[j][e] = prob * (dp[j][e] - deltas[i]) * scale; // ds^T
        }
      accumulateBf16<DH, 4>(dv, p, dos + 32 * half);
      accumulateBf16<DH, 4>(dk, dp, qs + 32 * half);
    }
  }
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int key = e < 2 ? key0 : key1, d = n * 8 + c + (e & 1);
      if (key >= T)
        continue;
      int64 at = ((int64)b * T + key) * 3 * D + h * DH + d;
      dqkv[at + D] = dk[n][e];
      dqkv[at + 2 * D] = dv[n][e];
    }
}

// dq for 64 queries: ds = p (dp - delta) scale against every key tile up to theirs, times k.
template <int T, int H, int DH, typename Out>
__device__ void attentionQueryGradBf16(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ __align__(16) unsigned short ks[kAttentionRows][DH + 8], vs[kAttentionRows][DH + 8];
  const int tile = TILES - 1 - blockIdx.x % TILES;
  const int bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, c = 2 * (threadIdx.x % 4);
  const float *q = qkv + (int64)b * T * 3 * D + h * DH, *dy = dout + (int64)b * T * D + h * DH;
  const int row0 = tile * kAttentionRows + warp * 16 + g, row1 = row0 + 8;
  unsigned qa[DH / 16][4], da[DH / 16][4];
  loadBf16Rows<T, DH>(qa, q, 3 * D, row0);
  loadBf16Rows<T, DH>(da, dy, D, row0);
  float lse0 = row0 < T ? lse[(int64)bh * T + row0] : 0.0f, lse1 = row1 < T ? lse[(int64)bh * T + row1] : 0.0f;
  float delta0 = row0 < T ? delta[(int64)bh * T + row0] : 0.0f, delta1 = row1 < T ? delta[(int64)bh * T + row1] : 0.0f;
  float dq[DH / 8][4] = {};
  for (int kt = 0; kt <= tile; ++kt) {
    __syncthreads();
    loadBf16Tile<T, DH, tileBatch<DH, 8>()>(ks, q + D, 3 * D, kt * kAttentionRows);
    loadBf16Tile<T, DH, tileBatch<DH, 8>()>(vs, q + 2 * D, 3 * D, kt * kAttentionRows);
    __syncthreads();
    float ds[8][4], dp[8][4];
    scoresBf16<DH>(ds, qa, ks);
    scoresBf16<DH>(dp, da, vs);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int key = kt * kAttentionRows + j * 8 + c + (e & 1), row = e < 2 ? row0 : row1;
        float prob = key <= row && key < T ? expf(ds[j][e] * scale - (e < 2 ? lse0 : lse1)) : 0.0f;
        ds[j][e] = prob * (dp[j][e] - (e < 2 ? delta0 : delta1)) * scale;
      }
    accumulateBf16<DH>(dq, ds, ks);
  }
#pragma unroll
  for (int n = 0; n < DH / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      int row = e < 2 ? row0 : row1, d = n * 8 + c + (e & 1);
      if (row < T)
        dqkv[((int64)b * T + row) * 3 * D + h * DH + d] = dq[n][e];
    }
}
// ---- A thread per query (or key), CUDA-core products ----
// fp32 attention (no gemm_dtype), and BF16 attention whose head dimension the tensor-core
// kernels do not take (ROUND: the operands and the probabilities rounded to BF16 where the
// BF16 GEMMs round them). Blocks of 64 threads, the other side through shared memory 32 rows at
// a time.
template <bool ROUND, int T, int DH>
__device__ void loadSimtTile(float (*tile)[DH], const float *src, int64 stride, int first) {
  for (int i = threadIdx.x; i < 32 * DH; i += blockDim.x) {
    int r = i / DH, d = i % DH;
    tile[r][d] = first + r < T ? gemmOperand<ROUND>(src[(first + r) * stride + d]) : 0.0f;
  }
}

// Keys and values k0 .. k0 + 31 of one head into shared memory, once every thread is done with
// the previous ones.
template <bool ROUND, int T, int DH>
__device__ void loadKeyValueTiles(float (*ks)[DH], float (*vs)[DH], const float *q, int D, int k0) {
  __syncthreads();
  loadSimtTile<ROUND, T, DH>(ks, q + D, 3 * D, k0);
  loadSimtTile<ROUND, T, DH>(vs, q + 2 * D, 3 * D, k0);
  __syncthreads();
}

template <int DH>
__device__ __forceinline__ float dotSimt(const float *a, const float *b) {
  float s = 0.0f;
  for (int d = 0; d < DH; ++d)
    s += a[d] * b[d];
  return s;
}

template <bool ROUND, int T, int H, int DH, bool STATS, typename Out>
__device__ void attentionForwardSimt(const float *qkv, Out out, float scale, const float *dout, float *lse, float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float ks[32][DH], vs[32][DH];
  const int tile = TILES - 1 - blockIdx.x % TILES, bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int row = tile * kAttentionRows + threadIdx.x;
  const float *q = qkv + (int64)b * T * 3 * D + h * DH;
  float qr[DH], o[DH];
  for (int d = 0; d < DH; ++d) {
    qr[d] = row < T ? gemmOperand<ROUND>(q[(int64)row * 3 * D + d]) : 0.0f;
    o[d] = 0.0f;
  }
  float m = __int_as_float(0xff800000), l = 0.0f;
  const int keys = min(T, (tile + 1) * kAttentionRows);
  for (int k0 = 0; k0 < keys; k0 += 32) {
    loadKeyValueTiles<ROUND, T, DH>(ks, vs, q, D, k0);
    for (int j = 0; j < 32 && k0 + j <= row && k0 + j < T; ++j) {
      float s = dotSimt<DH>(qr, ks[j]) * scale;
      if (s > m) {
        float alpha = expf(m - s);
        l *= alpha;
        for (int d = 0; d < DH; ++d)
          o[d] *= alpha;
        m = s;
      }
      float p = expf(s - m);
      l += p;
      for (int d = 0; d < DH; ++d)
        o[d] += gemmOperand<ROUND>(p) * vs[j][d];
    }
  }
  if (row >= T)
    return;
  int64 at = ((int64)b * T + row) * D + h * DH;
  if (STATS) {
    float dot = 0.0f;
    for (int d = 0; d < DH; ++d)
      dot += gemmOperand<ROUND>(dout[at + d]) * (o[d] / l);
    lse[(int64)bh * T + row] = m + logf(l);
    delta[(int64)bh * T + row] = dot;
  } else {
    for (int d = 0; d < DH; ++d)
      out[at + d] = o[d] / l;
  }
}

template <bool ROUND, int T, int H, int DH, typename Out>
__device__ void attentionKeyValueGradSimt(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float qs[32][DH], dos[32][DH], lses[32], deltas[32];
  const int tile = blockIdx.x % TILES, bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int key = tile * kAttentionRows + threadIdx.x;
  const float *q = qkv + (int64)b * T * 3 * D + h * DH, *dy = dout + (int64)b * T * D + h * DH;
  float kr[DH], vr[DH], dk[DH], dv[DH];
  for (int d = 0; d < DH; ++d) {
    kr[d] = key < T ? gemmOperand<ROUND>(q[(int64)key * 3 * D + D + d]) : 0.0f;
    vr[d] = key < T ? gemmOperand<ROUND>(q[(int64)key * 3 * D + 2 * D + d]) : 0.0f;
    dk[d] = dv[d] = 0.0f;
  }
  for (int q0 = tile * kAttentionRows; q0 < T; q0 += 32) {
    __syncthreads();
    loadSimtTile<ROUND, T, DH>(qs, q, 3 * D, q0);
    loadSimtTile<ROUND, T, DH>(dos, dy, D, q0);
    if (threadIdx.x < 32) {
      int row = q0 + threadIdx.x;
      lses[threadIdx.x] = row < T ? lse[(int64)bh * T + row] : 0.0f;
      deltas[threadIdx.x] = row < T ? delta[(int64)bh * T + row] : 0.0f;
    }
    __syncthreads();
    for (int j = 0; j < 32; ++j) {
      int query = q0 + j;
      if (query < key || query >= T)
        continue;
      float p = expf(dotSimt<DH>(kr, qs[j]) * scale - lses[j]);
      float ds = p * (dotSimt<DH>(vr, dos[j]) - deltas[j]) * scale;
      for (int d = 0; d < DH; ++d) {
        dv[d] += gemmOperand<ROUND>(p) * dos[j][d];
        dk[d] += gemmOperand<ROUND>(ds) * qs[j][d];
      }
    }
  }
  if (key >= T)
    return;
  int64 at = ((int64)b * T + key) * 3 * D + h * DH;
  for (int d = 0; d < DH; ++d) {
    dqkv[at + D + d] = dk[d];
    dqkv[at + 2 * D + d] = dv[d];
  }
}

template <bool ROUND, int T, int H, int DH, typename Out>
__device__ void attentionQueryGradSimt(const float *dout, const float *qkv, Out dqkv, float scale, const float *lse, const float *delta) {
  constexpr int D = H * DH, TILES = (T + kAttentionRows - 1) / kAttentionRows;
  __shared__ float ks[32][DH], vs[32][DH];
  const int tile = TILES - 1 - blockIdx.x % TILES, bh = blockIdx.x / TILES, b = bh / H, h = bh % H;
  const int row = tile * kAttentionRows + threadIdx.x;
  const float *q = qkv + (int64)b * T * 3 * D + h * DH, *dy = dout + (int64)b * T * D + h * DH;
  float qr[DH], dr[DH], dq[DH];
  for (int d = 0; d < DH; ++d) {
    qr[d] = row < T ? gemmOperand<ROUND>(q[(int64)row * 3 * D + d]) : 0.0f;
    dr[d] = row < T ? gemmOperand<ROUND>(dy[(int64)row * D + d]) : 0.0f;
    dq[d] = 0.0f;
  }
  const float rowLse = row < T ? lse[(int64)bh * T + row] : 0.0f;
  const float rowDelta = row < T ? delta[(int64)bh * T + row] : 0.0f;
  const int keys = min(T, (tile + 1) * kAttentionRows);
  for (int k0 = 0; k0 < keys; k0 += 32) {
    loadKeyValueTiles<ROUND, T, DH>(ks, vs, q, D, k0);
    for (int j = 0; j < 32 && k0 + j <= row && k0 + j < T; ++j) {
      float p = expf(dotSimt<DH>(qr, ks[j]) * scale - rowLse);
      float ds = p * (dotSimt<DH>(dr, vs[j]) - rowDelta) * scale;
      for (int d = 0; d < DH; ++d)
        dq[d] += gemmOperand<ROUND>(ds) * ks[j][d];
    }
  }
  if (row < T)
    for (int d = 0; d < DH; ++d)
      dqkv[((int64)b * T + row) * 3 * D + h * DH + d] = dq[d];
}
