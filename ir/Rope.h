// The rope op's rotation table (ir/Ops.def): each position's cos and sin, one per pair of the
// head dimension, computed in double and rounded to float. The CPU interpreter and the GPU's
// kernel (which takes it as the op's constants) rotate by the same table, so both give the same
// bits.
#pragma once

#include "ir/Attributes.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace tgc {

/// Llama 3's long-context frequencies (Hugging Face's rope_type "llama3"): the pairs whose
/// wavelength exceeds original_length / low_freq turn `factor` times slower, those under
/// original_length / high_freq as they are, and those between by a blend of the two.
struct RopeScaling {
  double factor = 8.0, lowFreq = 1.0, highFreq = 4.0, originalLength = 8192.0;
  bool operator==(const RopeScaling &o) const {
    return factor == o.factor && lowFreq == o.lowFreq && highFreq == o.highFreq && originalLength == o.originalLength;
  }
  bool operator!=(const RopeScaling &o) const { return !(*this == o); }
};

/// rope's attributes: theta (the base), inverse (rotating back: its gradient), and the scaling
/// (rope_factor, rope_low_freq_factor, rope_high_freq_factor, rope_original_length; absent: none).
/// The attention op carries the same under rope_theta (ropeOptions(attrs, "rope_theta")).
struct RopeOptions {
  double theta = 10000.0;
  bool inverse = false;
  std::optional<RopeScaling> scaling;
};
inline RopeOptions ropeOptions(const AttrMap &attrs, llvm::StringRef thetaKey = "theta") {
  RopeOptions o{attrs.getFloat(thetaKey).value_or(10000.0), attrs.getBool("inverse").value_or(false), std::nullopt};
  if (auto factor = attrs.getFloat("rope_factor"))
    o.scaling = RopeScaling{*factor, attrs.getFloat("rope_low_freq_factor").value_or(1.0),
                            attrs.getFloat("rope_high_freq_factor").value_or(4.0),
                            attrs.getFloat("rope_original_length").value_or(8192.0)};
  return o;
}
/// The scaling's attributes, on a rope or an attention op.
inline void setRopeScaling(AttrMap &attrs, const std::optional<RopeScaling> &scaling) {
  if (!scaling)
    return;
  attrs.set("rope_factor", scaling->factor);
  attrs.set("rope_low_freq_factor", scaling->lowFreq);
  attrs.set("rope_high_freq_factor", scaling->highFreq);
  attrs.set("rope_original_length", scaling->originalLength);
}
/// A rope op's attributes for these options.
inline AttrMap ropeAttrs(const RopeOptions &o) {
  AttrMap a;
  a.set("theta", o.theta);
  if (o.inverse)
    a.set("inverse", true);
  setRopeScaling(a, o.scaling);
  return a;
}

/// Pair i's frequency (radians a position) of head dimension dh: theta^(-2i/dh), scaled.
inline double ropeFrequency(const RopeOptions &options, int64_t i, int64_t dh) {
  double frequency = std::pow(options.theta, -2.0 * double(i) / double(dh));
  if (!options.scaling)
    return frequency;
  const RopeScaling &s = *options.scaling;
  double wavelength = 2.0 * M_PI / frequency;
  if (wavelength < s.originalLength / s.highFreq)
    return frequency;
  if (wavelength > s.originalLength / s.lowFreq)
    return frequency / s.factor;
  double smooth = (s.originalLength / wavelength - s.lowFreq) / (s.highFreq - s.lowFreq);
  return (1.0 - smooth) * frequency / s.factor + smooth * frequency;
}

/// Pair (a, b) = (x[i], x[i + dh/2]) of a head rotated by the cos and sin of its position's
/// entry: each product and sum rounded on its own, as the GPU's ropePair computes it.
inline void rotatePair(float &a, float &b, float c, float s) {
  float x = a, y = b;
  a = x * c - y * s;
  b = y * c + x * s;
}

/// rows * dh/2 cosines, then rows * dh/2 sines (negated under inverse): entry t * dh/2 + i is
/// the angle t * ropeFrequency(i) of position t's pair (i, i + dh/2).
inline std::vector<float> ropeTable(const RopeOptions &options, int64_t rows, int64_t dh) {
  int64_t half = dh / 2;
  std::vector<float> table(size_t(2 * rows * half));
  for (int64_t i = 0; i < half; ++i) {
    double frequency = ropeFrequency(options, i, dh);
    for (int64_t t = 0; t < rows; ++t) {
      double angle = double(t) * frequency;
      table[size_t(t * half + i)] = float(std::cos(angle));
      table[size_t((rows + t) * half + i)] = float(options.inverse ? -std::sin(angle) : std::sin(angle));
    }
  }
  return table;
}

} // namespace tgc
