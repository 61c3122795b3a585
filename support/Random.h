// The deterministic random numbers behind parameter init and data: SplitMix64, the same stream
// on every machine and compiler.
#pragma once

#include "support/BoxMuller.h"

#include "llvm/ADT/StringRef.h"

#include <cstdint>

namespace tgc {

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
  /// Standard normal by Box-Muller of the next two draws (one value per call, so the stream has
  /// no hidden state); support/BoxMuller.h, the device's too.
  double normal() {
    uint64_t a = next();
    return boxMullerNormal(a, next());
  }

private:
  uint64_t state_;
};

} // namespace tgc
