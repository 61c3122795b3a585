// The rope op's rotation table (ir/Ops.def): each position's cos and sin, one per pair of the
// head dimension, computed in double and rounded to float. The CPU interpreter and the GPU's
// kernel (which takes it as the op's constants) rotate by the same table, so both give the same
// bits.
#pragma once

#include "ir/Attributes.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace tgc {

/// rope's attributes: theta (the base) and inverse (rotating back: its gradient).
struct RopeOptions {
  double theta = 10000.0;
  bool inverse = false;
};
inline RopeOptions ropeOptions(const AttrMap &attrs) {
  return {attrs.getFloat("theta").value_or(10000.0), attrs.getBool("inverse").value_or(false)};
}

/// rows * dh/2 cosines, then rows * dh/2 sines (negated under inverse): entry t * dh/2 + i is
/// the angle t * theta^(-2i/dh) of position t's pair (i, i + dh/2).
inline std::vector<float> ropeTable(const RopeOptions &options, int64_t rows, int64_t dh) {
  int64_t half = dh / 2;
  std::vector<float> table(size_t(2 * rows * half));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double angle = double(t) * std::pow(options.theta, -2.0 * double(i) / double(dh));
      table[size_t(t * half + i)] = float(std::cos(angle));
      table[size_t((rows + t) * half + i)] = float(options.inverse ? -std::sin(angle) : std::sin(angle));
    }
  return table;
}

} // namespace tgc
