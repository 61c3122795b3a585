#include "support/Numerics.h"

#include <algorithm>
#include <array>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>

namespace tgc {

namespace {

struct Fp8Spec {
  int mantissaBits;
  int bias;
  uint8_t maxCode;
  double maxValue;
  /// Magnitudes at or above this saturate: the largest finite value plus half an ulp, where
  /// rounding to nearest even would leave the finite range (E5M2's ties go to infinity).
  double saturateFrom;
  bool saturateAtTie;
};

const Fp8Spec &spec(Fp8Format format) {
  static const Fp8Spec e4m3{3, 7, 0x7E, 448.0, 464.0, false};
  static const Fp8Spec e5m2{2, 15, 0x7B, 57344.0, 61440.0, true};
  return format == Fp8Format::E4M3 ? e4m3 : e5m2;
}

uint32_t bitsOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

} // namespace

float fp8Max(Fp8Format format) { return float(spec(format).maxValue); }

uint8_t floatToFp8(float x, Fp8Format format) {
  const Fp8Spec &s = spec(format);
  uint32_t bits = bitsOf(x);
  uint8_t sign = uint8_t((bits >> 31) << 7);
  if (std::isnan(x)) // CUDA makes every NaN the canonical positive one first: 0x7F in both
    return 0x7F;
  double a = std::fabs(double(x));
  if (a > s.saturateFrom || (s.saturateAtTie && a == s.saturateFrom))
    return uint8_t(sign | s.maxCode); // infinities too: satfinite
  // FP8's normal binades: float's own bits, the mantissa cut to FP8's with rounding to nearest
  // even (a carry moves into the exponent, as rounding up into the next binade should), the
  // exponent rebiased. (The same codes as the exact quotient below, faster: the CPU's FP8
  // emulation converts every element.)
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= uint32_t(128 - s.bias) << 23) { // at least 2^(1 - bias)
    int shift = 23 - s.mantissaBits;
    uint32_t rounded = magnitude + ((1u << (shift - 1)) - 1) + ((magnitude >> shift) & 1);
    return uint8_t(sign | ((rounded >> shift) - (uint32_t(127 - s.bias) << s.mantissaBits)));
  }
  double minSubnormal = std::ldexp(1.0, 1 - s.bias - s.mantissaBits);
  if (a <= minSubnormal / 2) // ties at half the smallest subnormal go to even: zero
    return sign;
  // The quantum at a's binade (subnormals share the smallest normal binade's), then round the
  // exact quotient to an integer, ties to even.
  int exponent = std::max(std::ilogb(a), 1 - s.bias);
  double quantum = std::ldexp(1.0, exponent - s.mantissaBits);
  double steps = std::nearbyint(a / quantum); // exact division; FE_TONEAREST
  int64_t m = int64_t(steps);
  if (m == (int64_t(1) << (s.mantissaBits + 1))) { // rounded up into the next binade
    m >>= 1;
    ++exponent;
  }
  uint8_t code;
  if (m < (int64_t(1) << s.mantissaBits)) // subnormal
    code = uint8_t(m);
  else
    code = uint8_t(((exponent + s.bias) << s.mantissaBits) | (m - (int64_t(1) << s.mantissaBits)));
  return uint8_t(sign | code);
}

namespace {

/// fp8ToFloat's value of `code`, from the format's fields.
float decodeFp8(uint8_t code, Fp8Format format) {
  const Fp8Spec &s = spec(format);
  bool negative = code & 0x80;
  int exponentField = (code & 0x7F) >> s.mantissaBits;
  int mantissa = code & ((1 << s.mantissaBits) - 1);
  int maxField = (1 << (7 - s.mantissaBits)) - 1;
  double value;
  if (format == Fp8Format::E4M3 && exponentField == maxField && mantissa == (1 << s.mantissaBits) - 1)
    return std::nanf("");
  if (format == Fp8Format::E5M2 && exponentField == maxField)
    return mantissa ? std::nanf("") : (negative ? -INFINITY : INFINITY);
  if (exponentField == 0)
    value = std::ldexp(double(mantissa), 1 - s.bias - s.mantissaBits);
  else
    value = std::ldexp(double((1 << s.mantissaBits) | mantissa),
                       exponentField - s.bias - s.mantissaBits);
  return float(negative ? -value : value);
}

} // namespace

float fp8ToFloat(uint8_t code, Fp8Format format) {
  // Every code's value, decoded once (the CPU's FP8 emulation reads one an element).
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int c = 0; c < 256; ++c) {
      t[0][size_t(c)] = decodeFp8(uint8_t(c), Fp8Format::E4M3);
      t[1][size_t(c)] = decodeFp8(uint8_t(c), Fp8Format::E5M2);
    }
    return t;
  }();
  return tables[format == Fp8Format::E4M3 ? 0 : 1][code];
}

uint16_t floatToBf16(float x) {
  uint32_t bits = bitsOf(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return 0x7FFF;
  uint32_t upper = bits >> 16, remainder = bits << 16;
  if (remainder > 0x80000000u || (remainder == 0x80000000u && (upper & 1)))
    ++upper;
  return uint16_t(upper);
}

float bf16ToFloat(uint16_t bits) {
  uint32_t wide = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

float halfToFloat(uint16_t bits) {
  float sign = bits & 0x8000 ? -1.0f : 1.0f;
  int exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  if (exponent == 0x1F)
    return mantissa ? std::numeric_limits<float>::quiet_NaN() : sign * std::numeric_limits<float>::infinity();
  if (exponent == 0) // subnormal: mantissa * 2^-24
    return sign * std::ldexp(float(mantissa), -24);
  return sign * std::ldexp(float(1024 + mantissa), exponent - 25);
}

} // namespace tgc
