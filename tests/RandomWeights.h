// Random weights away from the init, for tests that compare two programs or devices on them.
#pragma once

#include "app/Init.h"
#include "support/Random.h"

#include <map>
#include <string>

namespace tgc::test {

/// initParams' leaves of `g` (norm weights and biases too), each value moved by a normal draw
/// of 0.1, by name.
inline std::map<std::string, Tensor> randomWeights(const Graph &g, Rng &rng) {
  std::map<std::string, Tensor> weights = initParams(g, rng.next());
  for (auto &[name, t] : weights)
    for (float &v : t.data)
      v += float(rng.normal() * 0.1);
  return weights;
}

} // namespace tgc::test
