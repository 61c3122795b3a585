// Low-precision number formats on the CPU, bit for bit as CUDA converts them (cuda_fp8.h with
// __NV_SATFINITE, cuda_bf16.h's __float2bfloat16): round to nearest even, FP8 saturating to
// the largest finite value. The interpreter emulates BF16 and FP8 programs with these.
#pragma once

#include <cstdint>

namespace tgc {

enum class Fp8Format { E4M3, E5M2 };

/// Largest finite value: 448 (E4M3) and 57344 (E5M2).
float fp8Max(Fp8Format format);
/// float -> FP8 code, round to nearest even, saturating finite (as __NV_SATFINITE).
uint8_t floatToFp8(float x, Fp8Format format);
/// FP8 code -> float (exact).
float fp8ToFloat(uint8_t code, Fp8Format format);
/// x rounded to the nearest value of `format` (saturating), as a float.
inline float roundToFp8(float x, Fp8Format format) { return fp8ToFloat(floatToFp8(x, format), format); }

/// float -> BF16 bits, round to nearest even; NaN becomes 0x7FFF.
uint16_t floatToBf16(float x);
float bf16ToFloat(uint16_t bits);
/// x rounded to the nearest BF16 value.
inline float roundToBf16(float x) { return bf16ToFloat(floatToBf16(x)); }
/// IEEE half-precision bits -> float (exact, subnormals, infinities and NaN included).
float halfToFloat(uint16_t bits);

} // namespace tgc
