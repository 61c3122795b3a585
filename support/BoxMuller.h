// The standard normal draw behind parameter init, written once for the host (support/Random.h)
// and the device (backends/cuda/kernels/common.cuh, which NVRTC compiles from this same text):
// SplitMix64's mixer and a Box-Muller transform whose log and cos are tgc's own polynomials in
// correctly rounded double additions, multiplications and divisions only. The C library's log and
// cos and CUDA's differ by an ulp now and then, and such an ulp, rounded to float, changed one
// element in 67 million; here every operation is IEEE's, uncontracted on both sides (the device
// spells each one as its _rn intrinsic, the host build passes -ffp-contract=off), so the host and
// the GPU draw the same bits.
#pragma once

#if defined(__CUDACC__)
#define TGC_BM_FN __device__ __forceinline__
#define TGC_BM_ADD(a, b) __dadd_rn(a, b)
#define TGC_BM_SUB(a, b) __dsub_rn(a, b)
#define TGC_BM_MUL(a, b) __dmul_rn(a, b)
#define TGC_BM_DIV(a, b) __ddiv_rn(a, b)
#define TGC_BM_SQRT(a) __dsqrt_rn(a)
#define TGC_BM_FREXP(a, e) frexp(a, e)
#define TGC_BM_FLOOR(a) floor(a)
#else
#include <cmath>
#include <cstdint>
#define TGC_BM_FN inline
#define TGC_BM_ADD(a, b) ((a) + (b))
#define TGC_BM_SUB(a, b) ((a) - (b))
#define TGC_BM_MUL(a, b) ((a) * (b))
#define TGC_BM_DIV(a, b) ((a) / (b))
#define TGC_BM_SQRT(a) std::sqrt(a)
#define TGC_BM_FREXP(a, e) std::frexp(a, e)
#define TGC_BM_FLOOR(a) std::floor(a)
#endif

#if !defined(__CUDACC__)
namespace tgc {
#endif

/// SplitMix64's output function.
TGC_BM_FN unsigned long long mix64(unsigned long long x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// c[0] y^(N-1) + c[1] y^(N-2) + ... + c[N-1] by Horner's rule, each step rounded (uncontracted).
template <int N>
TGC_BM_FN double boxMullerHorner(const double (&c)[N], double y) {
  double p = c[0];
  for (int i = 1; i < N; ++i)
    p = TGC_BM_ADD(TGC_BM_MUL(p, y), c[i]);
  return p;
}

/// log(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s) with
/// s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^21 (the next term is below 2^-56 of the
/// sum); e ln 2 in two parts, the first exact for |e| <= 2^11.
TGC_BM_FN double boxMullerLog(double u) {
  int e = 0;
  double m = TGC_BM_FREXP(u, &e); // [0.5, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {
    m = TGC_BM_MUL(m, 2.0);
    e -= 1;
  }
  double s = TGC_BM_DIV(TGC_BM_SUB(m, 1.0), TGC_BM_ADD(m, 1.0));
  double z = TGC_BM_MUL(s, s);
  // 1/21, 1/19, ..., 1/3, 1
  const double c[] = {0x1.8618618618618p-5, 0x1.af286bca1af28p-5, 0x1.e1e1e1e1e1e1ep-5, 0x1.1111111111111p-4,
                      0x1.3b13b13b13b14p-4, 0x1.745d1745d1746p-4, 0x1.c71c71c71c71cp-4, 0x1.2492492492492p-3,
                      0x1.999999999999ap-3,  0x1.5555555555555p-2, 1.0};
  double p = boxMullerHorner(c, z);
  double logM = TGC_BM_MUL(TGC_BM_MUL(2.0, s), p);
  double de = double(e);
  // ln 2 = 0x1.62e42fee00000p-1 + 0x1.a39ef35793c76p-33 (fdlibm's split).
  return TGC_BM_ADD(TGC_BM_MUL(de, 0x1.62e42fee00000p-1),
                    TGC_BM_ADD(TGC_BM_MUL(de, 0x1.a39ef35793c76p-33), logM));
}

/// cos x and sin x for x in [0, pi/4], by their Taylor series to x^20 and x^21 (x^2 <= 0.617;
/// the next terms are below 2^-66).
TGC_BM_FN double boxMullerCos(double x) {
  const double c[] = {0x1.e542ba4020225p-62,  -0x1.6827863b97d97p-53, 0x1.ae7f3e733b81fp-45, -0x1.93974a8c07c9dp-37,
                      0x1.1eed8eff8d898p-29,  -0x1.27e4fb7789f5cp-22, 0x1.a01a01a01a01ap-16, -0x1.6c16c16c16c17p-10,
                      0x1.5555555555555p-5,   -0.5,                   1.0};
  return boxMullerHorner(c, TGC_BM_MUL(x, x));
}

TGC_BM_FN double boxMullerSin(double x) {
  const double c[] = {0x1.71b8ef6dcf572p-66, -0x1.2f49b46814157p-57, 0x1.952c77030ad4ap-49, -0x1.ae7f3e733b81fp-41,
                      0x1.6124613a86d09p-33, -0x1.ae64567f544e4p-26, 0x1.71de3a556c734p-19, -0x1.a01a01a01a01ap-13,
                      0x1.1111111111111p-7,  -0x1.5555555555555p-3};
  double y = TGC_BM_MUL(x, x);
  return TGC_BM_ADD(TGC_BM_MUL(TGC_BM_MUL(boxMullerHorner(c, y), y), x), x);
}

/// cos(2 pi u) for u in [0, 1): u = (q + r) / 4 with the quadrant q and r in [0, 1) exact, and
/// r folded into [0, 1/2] (1 - r is exact too) so the series see at most pi/4.
TGC_BM_FN double boxMullerCos2Pi(double u) {
  double v = TGC_BM_MUL(u, 4.0);
  double q = TGC_BM_FLOOR(v);
  double r = TGC_BM_SUB(v, q);
  const double halfPi = 0x1.921fb54442d18p+0;
  double c, s; // cos and sin of (pi/2) r
  if (r <= 0.5) {
    double x = TGC_BM_MUL(r, halfPi);
    c = boxMullerCos(x);
    s = boxMullerSin(x);
  } else {
    double x = TGC_BM_MUL(TGC_BM_SUB(1.0, r), halfPi);
    c = boxMullerSin(x);
    s = boxMullerCos(x);
  }
  int quadrant = int(q);
  return quadrant == 0 ? c : quadrant == 1 ? -s : quadrant == 2 ? -c : s;
}

/// The standard normal of two SplitMix64 outputs: u1 = 1 - (a >> 11) 2^-53 in (0, 1],
/// u2 = (b >> 11) 2^-53 in [0, 1), sqrt(-2 log u1) cos(2 pi u2).
TGC_BM_FN double boxMullerNormal(unsigned long long a, unsigned long long b) {
  double u1 = TGC_BM_SUB(1.0, TGC_BM_MUL(double(a >> 11), 0x1.0p-53));
  double u2 = TGC_BM_MUL(double(b >> 11), 0x1.0p-53);
  double radius = TGC_BM_SQRT(TGC_BM_MUL(-2.0, boxMullerLog(u1)));
  return TGC_BM_MUL(radius, boxMullerCos2Pi(u2));
}

#if !defined(__CUDACC__)
} // namespace tgc
#endif

#undef TGC_BM_FN
#undef TGC_BM_ADD
#undef TGC_BM_SUB
#undef TGC_BM_MUL
#undef TGC_BM_DIV
#undef TGC_BM_SQRT
#undef TGC_BM_FREXP
#undef TGC_BM_FLOOR
