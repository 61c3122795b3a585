// tgc's FP8 and BF16 conversions against CUDA's own (cuda_fp8.h and cuda_bf16.h, whose
// conversion functions compile for the host), on every interesting float and a sweep of bit
// patterns. Built where the CUDA headers are.
#include "support/Numerics.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace tgc;

namespace {

float fromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// Floats worth checking: specials, each FP8 value and the midpoints between neighbours with
/// their float neighbours, values beyond the largest finite, and a sweep of all bit patterns.
std::vector<float> samples() {
  std::vector<float> xs = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, fromBits(0x7FA00000),
                           fromBits(0x7F800001), fromBits(0xFFC00001), 1e30f, -1e30f,
                           3.4e38f, 1e-40f, -1e-45f};
  for (auto format : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int c = 0; c < 255; ++c) {
      float a = fp8ToFloat(uint8_t(c), format), b = fp8ToFloat(uint8_t(c + 1), format);
      for (float v : {a, 0.5f * (a + b)})
        if (std::isfinite(v))
          for (float w : {v, std::nextafter(v, INFINITY), std::nextafter(v, -INFINITY)})
            xs.insert(xs.end(), {w, -w});
    }
  for (float v : {448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f})
    for (float w : {v, std::nextafter(v, INFINITY), std::nextafter(v, 0.0f)})
      xs.insert(xs.end(), {w, -w});
  for (uint64_t bits = 0; bits < (uint64_t(1) << 32); bits += 4093) // a prime stride: about a million patterns
    xs.push_back(fromBits(uint32_t(bits)));
  return xs;
}

TEST(NumericsVsCuda, Fp8EncodingMatchesCudaBitForBit) {
  int64_t checked = 0;
  for (float x : samples()) {
    ASSERT_EQ(floatToFp8(x, Fp8Format::E4M3), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3))
        << std::hexfloat << x;
    ASSERT_EQ(floatToFp8(x, Fp8Format::E5M2), __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2))
        << std::hexfloat << x;
    ++checked;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(NumericsVsCuda, Fp8DecodingMatchesCuda) {
  for (int c = 0; c < 256; ++c)
    for (auto [ours, theirs] : {std::pair{Fp8Format::E4M3, __NV_E4M3}, std::pair{Fp8Format::E5M2, __NV_E5M2}}) {
      __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(c), theirs);
      float cuda = __half2float(__half(h));
      float mine = fp8ToFloat(uint8_t(c), ours);
      if (std::isnan(cuda))
        EXPECT_TRUE(std::isnan(mine)) << c;
      else
        EXPECT_EQ(mine, cuda) << c;
    }
}

TEST(NumericsVsCuda, Bf16MatchesCudaBitForBit) {
  for (float x : samples()) {
    __nv_bfloat16 b = __float2bfloat16(x);
    uint16_t bits;
    std::memcpy(&bits, &b, sizeof bits);
    ASSERT_EQ(floatToBf16(x), bits) << std::hexfloat << x;
  }
}

} // namespace
