// Sampling's arithmetic, written once for the host (the CPU interpreter's sample op and the
// windowed generation, support/Sampling.cpp) and the device (backends/cuda/kernels/sample.cuh,
// which NVRTC compiles from this same text). A sampled token is decided in integers: each token
// weighs exp((logit - max) / temperature) in units of 2^-40 (tgc's own exp, a polynomial in
// correctly rounded double operations, uncontracted on both sides as BoxMuller.h's), top-k and
// top-p are thresholds on the logits' order found by those weights' sums, and one 64-bit draw
// per row, scaled to the kept weights' total, lands on the first token whose running sum passes
// it. Integer sums are the same in any order, so the GPU's parallel passes pick the host's token.
#pragma once

#include "BoxMuller.h"

#if defined(__CUDACC__)
#define TGC_SP_FN __device__ __forceinline__
#define TGC_SP_ADD(a, b) __dadd_rn(a, b)
#define TGC_SP_SUB(a, b) __dsub_rn(a, b)
#define TGC_SP_MUL(a, b) __dmul_rn(a, b)
#define TGC_SP_DIV(a, b) __ddiv_rn(a, b)
#define TGC_SP_RINT(a) rint(a)
#define TGC_SP_CEIL(a) ceil(a)
#define TGC_SP_LDEXP(a, e) ldexp(a, e)
#define TGC_SP_BITS(f) __float_as_uint(f)
#define TGC_SP_MULHI(a, b) __umul64hi(a, b)
#else
#include <cmath>
#include <cstdint>
#include <cstring>
#define TGC_SP_FN inline
#define TGC_SP_ADD(a, b) ((a) + (b))
#define TGC_SP_SUB(a, b) ((a) - (b))
#define TGC_SP_MUL(a, b) ((a) * (b))
#define TGC_SP_DIV(a, b) ((a) / (b))
#define TGC_SP_RINT(a) std::rint(a)
#define TGC_SP_CEIL(a) std::ceil(a)
#define TGC_SP_LDEXP(a, e) std::ldexp(a, e)
#define TGC_SP_BITS(f) tgc::samplingFloatBits(f)
#define TGC_SP_MULHI(a, b) (unsigned long long)(((unsigned __int128)(a) * (unsigned __int128)(b)) >> 64)
#endif

#if !defined(__CUDACC__)
namespace tgc {
inline unsigned samplingFloatBits(float f) {
  unsigned bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
#endif

/// exp(x) for x <= 0 (0 below -700 and for NaN): x = k ln 2 + r with |r| <= ln 2 / 2 (k ln 2 in
/// two parts, the first exact for |k| <= 2^11), e^r by its Taylor series to r^13 (the next term
/// below 2^-60), times 2^k exactly.
TGC_SP_FN double samplingExp(double x) {
  if (!(x > -700.0))
    return 0.0;
  double k = TGC_SP_RINT(TGC_SP_MUL(x, 0x1.71547652b82fep+0)); // x / ln 2, to the nearest integer
  double r = TGC_SP_SUB(TGC_SP_SUB(x, TGC_SP_MUL(k, 0x1.62e42fee00000p-1)), TGC_SP_MUL(k, 0x1.a39ef35793c76p-33));
  // 1/13!, 1/12!, ..., 1/2!, 1, 1
  const double c[] = {0x1.6124613a86d09p-33, 0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22,
                      0x1.71de3a556c734p-19, 0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10,
                      0x1.1111111111111p-7,  0x1.5555555555555p-5,  0x1.5555555555555p-3, 0x1.0p-1,
                      1.0,                   1.0};
  return TGC_SP_LDEXP(boxMullerHorner(c, r), int(k));
}

/// A token's weight: exp((logit - max) / temperature) in units of 2^-40, truncated (0 for a
/// token under 2^-40 of the most likely one's probability, and for NaN).
TGC_SP_FN unsigned long long samplingWeight(float logit, float max, float temperature) {
  double x = TGC_SP_DIV(TGC_SP_SUB(double(logit), double(max)), double(temperature));
  return (unsigned long long)TGC_SP_MUL(samplingExp(x), 0x1.0p+40);
}

/// The logit's place in the logits' order as an unsigned key (larger logit, larger key); NaN 0.
TGC_SP_FN unsigned samplingKey(float logit) {
  if (logit != logit)
    return 0u;
  unsigned bits = TGC_SP_BITS(logit);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/// The weight the top-p cut keeps at least: ceil(total * topP), within [1, total] (1 for topP
/// <= 0 or NaN: the most likely token alone; converted only once in range, as a double out of
/// a 64-bit integer's range converts differently on the host and the device).
TGC_SP_FN unsigned long long samplingMassTarget(unsigned long long total, float topP) {
  double target = TGC_SP_CEIL(TGC_SP_MUL(double(total), double(topP)));
  if (!(target >= 1.0))
    return 1;
  if (!(target < double(total)))
    return total;
  return (unsigned long long)target;
}
/// How many of `vocab` tokens the top-k cut keeps: k truncated, 0 (no cut) unless 1 <= k < vocab
/// (NaN too), so that no float out of range is converted.
TGC_SP_FN long long samplingTopK(float k, long long vocab) {
  return k >= 1.0f && double(k) < double(vocab) ? (long long)k : 0;
}
/// Row `row`'s draw for the token after position `counter`, scaled to [0, total): the high 64
/// bits of a SplitMix64 hash of (seed, row, counter) times total.
TGC_SP_FN unsigned long long samplingDraw(unsigned long long seed, long long row, long long counter,
                                          unsigned long long total) {
  unsigned long long h = mix64(mix64(seed) ^ mix64(((unsigned long long)row << 32) ^ (unsigned)counter));
  return TGC_SP_MULHI(h, total);
}

/// The draw over all of a row's blocks in one cooperative launch (sample.cuh's sampleGrid), as
/// the kernel runs it and the host plans it: blocks of 256 threads, 4 resident on an SM, and
/// each row's 64-bit words of sums but its blocks' own: the bins of 9 radix rounds (4 top-k, the
/// total, 4 top-p) and the barrier (one word a block follows).
constexpr int kSampleGridThreads = 256, kSampleGridBlocksPerSM = 4, kSampleGridSlots = 9;
constexpr long long kSampleGridRowWords = kSampleGridSlots * 256 + 1;

#if !defined(__CUDACC__)
/// What the sample op reads besides the logits: temperature (<= 0: greedy), top_k (0: every
/// token), top_p (1: no cut) and the seed.
struct SamplingParams {
  float temperature = 0, topP = 1;
  int64_t topK = 0;
  uint64_t seed = 0;
};

/// The sample op's sampling f32[3] (temperature, top_p, top_k) and seed i32[2] (the low word,
/// then the high) of `params`, and `params` of them: the one place their layout is written.
void packSampling(const SamplingParams &params, float sampling[3], int32_t seed[2]);
SamplingParams unpackSampling(const float sampling[3], const int32_t seed[2]);

/// The first largest of `n` values (a NaN never wins; all NaN gives 0): argmax and greedy
/// decoding's token.
int32_t firstLargest(const float *values, int64_t n);

/// The token a row of `vocab` logits gives: the first largest (NaN never) where temperature <=
/// 0; else the token among the topK largest logits (ties at the k-th kept), then the fewest
/// largest whose weight reaches topP of theirs (ties at the cut kept), that row `row`'s draw
/// for position `counter` lands on, in token order. The sample op's definition; the GPU's
/// kernels compute the same token.
int32_t sampleRow(const float *logits, int64_t vocab, const SamplingParams &params, int64_t row, int64_t counter);

} // namespace tgc
#endif

#undef TGC_SP_FN
#undef TGC_SP_ADD
#undef TGC_SP_SUB
#undef TGC_SP_MUL
#undef TGC_SP_DIV
#undef TGC_SP_RINT
#undef TGC_SP_CEIL
#undef TGC_SP_LDEXP
#undef TGC_SP_BITS
#undef TGC_SP_MULHI
