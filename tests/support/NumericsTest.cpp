// FP8 and BF16 conversions from their definitions (the CUDA comparison is NumericsVsCudaTest).
#include "support/Numerics.h"
#include "support/ScalarMath.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace tgc;

namespace {

/// The value of an FP8 code from the format's definition, written out independently.
double reference(uint8_t code, int exponentBits, int mantissaBits, int bias) {
  int sign = code >> 7, e = (code >> mantissaBits) & ((1 << exponentBits) - 1);
  int m = code & ((1 << mantissaBits) - 1);
  double magnitude = e == 0 ? m * std::pow(2.0, 1 - bias - mantissaBits)
                            : (1 + m / double(1 << mantissaBits)) * std::pow(2.0, e - bias);
  return sign ? -magnitude : magnitude;
}

TEST(Fp8, All256CodesDecodeExactly) {
  for (int c = 0; c < 256; ++c) {
    uint8_t code = uint8_t(c);
    float e4 = fp8ToFloat(code, Fp8Format::E4M3), e5 = fp8ToFloat(code, Fp8Format::E5M2);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(e4)) << c;
    } else {
      EXPECT_EQ(double(e4), reference(code, 4, 3, 7)) << c;
    }
    if ((c & 0x7C) == 0x7C) {
      EXPECT_TRUE((c & 3) ? std::isnan(e5) : std::isinf(e5)) << c;
    } else {
      EXPECT_EQ(double(e5), reference(code, 5, 2, 15)) << c;
    }
  }
  EXPECT_EQ(fp8ToFloat(0x7E, Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(fp8ToFloat(0x7B, Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(fp8ToFloat(0x01, Fp8Format::E5M2), std::ldexp(1.0f, -16));
}

TEST(Fp8, EveryFiniteCodeEncodesBackToItself) {
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int c = 0; c < 256; ++c) {
      float v = fp8ToFloat(uint8_t(c), f);
      if (std::isfinite(v)) {
        EXPECT_EQ(floatToFp8(v, f), uint8_t(c)) << c; // -0 is 0x80
      }
    }
}

TEST(Fp8, RoundsToNearestEvenAndSaturates) {
  // 1 + 1/16 lies halfway between 1 and 1.125 in E4M3: to the even mantissa, 1.
  EXPECT_EQ(floatToFp8(1.0625f, Fp8Format::E4M3), 0x38);
  EXPECT_EQ(floatToFp8(1.1875f, Fp8Format::E4M3), 0x3A); // halfway 1.125..1.25 -> 1.25
  EXPECT_EQ(floatToFp8(1.07f, Fp8Format::E4M3), 0x39);
  EXPECT_EQ(floatToFp8(460.0f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(floatToFp8(464.0f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(floatToFp8(1e30f, Fp8Format::E4M3), 0x7E);
  EXPECT_EQ(floatToFp8(-INFINITY, Fp8Format::E4M3), 0xFE);
  EXPECT_EQ(floatToFp8(INFINITY, Fp8Format::E5M2), 0x7B);
  EXPECT_EQ(floatToFp8(61440.0f, Fp8Format::E5M2), 0x7B);
  EXPECT_EQ(floatToFp8(std::ldexp(1.0f, -10), Fp8Format::E4M3), 0x00); // half the min: to 0
  EXPECT_EQ(floatToFp8(std::ldexp(1.5f, -10), Fp8Format::E4M3), 0x01);
  EXPECT_EQ(floatToFp8(-0.0f, Fp8Format::E4M3), 0x80);
  EXPECT_EQ(floatToFp8(NAN, Fp8Format::E4M3), 0x7F);
  EXPECT_EQ(floatToFp8(-NAN, Fp8Format::E5M2), 0x7F);
}

TEST(Gelu, TheSplitFormsGiveTheSameBitsAsGeluAndItsGradient) {
  // geluTanhInner, geluTanhOf and geluTanhGradientOf (the CPU's fused MLP gradient takes the
  // tanh once) against geluTanh and geluTanhGradient, over floats from -16 to 16 a few ulps and
  // 1e-4 apart, and the extremes.
  std::vector<float> xs = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, INFINITY, -INFINITY};
  for (float x = -16.0f; x < 16.0f; x = std::nextafter(std::nextafter(x, 17.0f), 17.0f) + 1e-4f)
    xs.push_back(x);
  size_t differ = 0;
  for (float x : xs) {
    float t = geluTanhInner(x), dy = 0.75f - x / 32.0f;
    float values[4] = {geluTanhOf(x, t), geluTanh(x), geluTanhGradientOf(dy, x, t), geluTanhGradient(dy, x)};
    differ += std::memcmp(&values[0], &values[1], 4) != 0;
    differ += std::memcmp(&values[2], &values[3], 4) != 0;
  }
  EXPECT_GT(xs.size(), 300000u);
  EXPECT_EQ(differ, 0u);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(floatToBf16(bf16ToFloat(0x3F80) + std::ldexp(1.0f, -8)), 0x3F80); // tie to even
  EXPECT_EQ(floatToBf16(bf16ToFloat(0x3F81) + std::ldexp(1.0f, -8)), 0x3F82); // tie to even
  EXPECT_EQ(floatToBf16(NAN), 0x7FFF);
  EXPECT_EQ(floatToBf16(-INFINITY), 0xFF80);
  EXPECT_EQ(roundToBf16(3.14159f), 3.140625f);
}

} // namespace
