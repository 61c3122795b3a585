// The deterministic random numbers behind parameter init and data: SplitMix64, the same stream
// on every machine and compiler.
#pragma once

#include "llvm/ADT/StringRef.h"

#include <cmath>
#include <cstdint>

namespace tgc {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// FNV-1a: a stable hash of a name, to derive one stream per parameter.
inline uint64_t hashName(llvm::StringRef name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name)
    h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

class Rng {
public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return mix64(state_++); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return next() % n; }
  /// Standard normal by Box-Muller (one value per call, so the stream has no hidden state).
  double normal() {
    double u1 = 1.0 - uniform(); // (0, 1]
    double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

private:
  uint64_t state_;
};

} // namespace tgc
