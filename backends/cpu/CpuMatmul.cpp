// The CPU reference's matrix product (matmul): operands packed so that every output is one
// contiguous dot product, summed in a fixed order (dotRows), the work split over tiles and threads
// without changing a bit.
#include "backends/cpu/CpuKernels.h"

#include "backends/cpu/WorkerPool.h"
#include "ir/Attributes.h"
#include "support/Numerics.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tgc::cpu {

namespace {

/// Row-major copy of the [rows, cols] matrix `src` (or of its transpose when `transpose`).
void packMatrix(const float *src, int64_t r, int64_t c, bool transpose, std::vector<float> &dst) {
  dst.resize(r * c);
  if (!transpose) {
    std::copy_n(src, r * c, dst.data());
    return;
  }
  // src is stored [c, r]; dst[i][j] = src[j][i], in 32 x 32 blocks so that both sides stay
  // in cache (a plain loop reads src a whole row apart at every step).
  constexpr int64_t kBlock = 32;
  parallelFor((r + kBlock - 1) / kBlock, r * c * 8, [&](int64_t block) {
    int64_t i0 = block * kBlock;
    for (int64_t j0 = 0; j0 < c; j0 += kBlock)
      for (int64_t i = i0; i < std::min(r, i0 + kBlock); ++i)
        for (int64_t j = j0; j < std::min(c, j0 + kBlock); ++j)
          dst[i * c + j] = src[j * r + i];
  });
}

/// Dot products of a with the rows b + r * stride, r < Rows, each with 32 partial sums (four
/// vectors of eight, so that the adds of one vector do not wait on each other) combined in the
/// same order: one output's bits do not depend on how many are computed together. The clones
/// below are AVX2 and the SSE2 default, neither of which has FMA, so no multiply-add is
/// contracted and both give identical bits; an AVX-512 clone would contract them (the GEMM
/// test checks this).
template <int Rows>
inline __attribute__((always_inline)) void dotRows(const float *a, const float *b, int64_t stride,
                                                   int64_t n, float *out) {
  // The 32 partial sums of each row held as four vectors of eight (GCC's vector extension:
  // registers, where an array of 32 floats was zeroed in memory each call and added to there,
  // which for rows of 64 took three times as long); the tail and the tree as the plain loops
  // order them.
  using Lanes8 = float __attribute__((vector_size(32)));
  constexpr int kLanes = 32, kVectors = kLanes / 8;
  Lanes8 acc[Rows][kVectors];
  for (int r = 0; r < Rows; ++r)
    for (int q = 0; q < kVectors; ++q)
      acc[r][q] = Lanes8{};
  // Lanes 8q .. 8q + 7 of each row's sums take the products of a and b's rows at t .. t + 7.
  auto addEight = [&](int64_t t, int q) {
    Lanes8 x;
    std::memcpy(&x, a + t, sizeof x);
    for (int r = 0; r < Rows; ++r) {
      Lanes8 y;
      std::memcpy(&y, b + r * stride + t, sizeof y);
      acc[r][q] += x * y;
    }
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int q = 0; q < kVectors; ++q)
      addEight(i + 8 * q, q);
  // The last n % 32 products, each into lane t % 32: whole vectors of eight, then one at a time.
  int64_t whole = (n - i) / 8;
  for (int q = 0; q < whole; ++q)
    addEight(i + 8 * q, q);
  i += 8 * whole;
  for (int r = 0; r < Rows; ++r) {
    if (i < n) {
      float lanes[kLanes];
      std::memcpy(lanes, acc[r], sizeof lanes);
      for (int64_t t = i; t < n; ++t)
        lanes[t % kLanes] += a[t] * b[r * stride + t];
      std::memcpy(acc[r], lanes, sizeof lanes);
    }
    // The tree: lane j + width into lane j for width 16 (vectors 2 and 3 into 0 and 1), 8, 4, 2, 1.
    Lanes8 eight = (acc[r][0] + acc[r][2]) + (acc[r][1] + acc[r][3]);
    float s[8];
    std::memcpy(s, &eight, sizeof s);
    for (int j = 0; j < 4; ++j)
      s[j] += s[j + 4];
    for (int j = 0; j < 2; ++j)
      s[j] += s[j + 2];
    out[r] = s[0] + s[1];
  }
}

__attribute__((target_clones("avx2", "default")))
float dot(const float *a, const float *b, int64_t n) {
  float out;
  dotRows<1>(a, b, 0, n, &out);
  return out;
}

/// Four outputs at once: a is read once for four rows of b.
__attribute__((target_clones("avx2", "default")))
void dot4(const float *a, const float *b, int64_t stride, int64_t n, float *out) {
  dotRows<4>(a, b, stride, n, out);
}

} // namespace

llvm::Error evalMatMul(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &a = *in[0], &b = *in[1];
  MatMulLayout layout = matmulLayout(attrs);
  bool ta = layout.transposeA, tb = layout.transposeB;
  int64_t m = out[0].type.dim(-2), n = out[0].type.dim(-1);
  int64_t k = ta ? a.type.dim(-2) : a.type.dim(-1);
  int64_t batches = a.size() / (m * k);
  bool sharedB = b.type.rank() == 2;
  // gemm_dtype=bf16: the operands are rounded to BF16, the products accumulate in fp32.
  bool bf16 = hasBf16Gemms(attrs);
  auto round = [bf16](std::vector<float> &v) {
    if (bf16)
      for (float &x : v)
        x = roundToBf16(x);
  };
  // Pack A as [m, k] and B as [n, k] so every output is a contiguous dot product. Each output
  // element is one dot product however the work is split, so tiles and threads change no bit.
  std::vector<float> packedB;
  if (sharedB) {
    packMatrix(&b.data[0], n, k, !tb, packedB);
    round(packedB);
  }
  // Tiles of 64 rows of B and 256 rows of A stay in cache while they are reused.
  constexpr int64_t kTileB = 64, kTileA = 256;
  auto multiply = [&](const float *pa, const float *pb, float *c, int64_t j0, int64_t j1) {
    for (int64_t i0 = 0; i0 < m; i0 += kTileA)
      for (int64_t i = i0; i < std::min(m, i0 + kTileA); ++i)
        for (int64_t j = j0; j < j1;) {
          if (j + 4 <= j1) {
            dot4(&pa[i * k], &pb[j * k], k, k, &c[i * n + j]);
            j += 4;
          } else {
            c[i * n + j] = dot(&pa[i * k], &pb[j * k], k);
            ++j;
          }
        }
  };
  if (batches > 1 && m * n * k < (int64_t(1) << 22)) {
    // Many small products (attention's heads): the threads take whole batches.
    parallelFor(batches, batches * m * n * k, [&](int64_t batch) {
      thread_local std::vector<float> ownA, ownB;
      packMatrix(&a.data[batch * m * k], m, k, ta, ownA);
      round(ownA);
      if (!sharedB) {
        packMatrix(&b.data[batch * k * n], n, k, !tb, ownB);
        round(ownB);
      }
      multiply(ownA.data(), sharedB ? packedB.data() : ownB.data(), &out[0].data[batch * m * n], 0, n);
    });
    return llvm::Error::success();
  }
  std::vector<float> packedA;
  for (int64_t batch = 0; batch < batches; ++batch) {
    packMatrix(&a.data[batch * m * k], m, k, ta, packedA);
    round(packedA);
    if (!sharedB) {
      packMatrix(&b.data[batch * k * n], n, k, !tb, packedB);
      round(packedB);
    }
    float *c = &out[0].data[batch * m * n];
    int64_t tiles = (n + kTileB - 1) / kTileB;
    parallelFor(tiles, m * n * k, [&](int64_t tile) {
      int64_t j0 = tile * kTileB;
      multiply(packedA.data(), packedB.data(), c, j0, std::min(n, j0 + kTileB));
    });
  }
  return llvm::Error::success();
}

} // namespace tgc::cpu
