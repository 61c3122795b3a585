// A training program's leaves for one step on the CPU interpreter, shared by the tests that run
// two programs side by side: parameters and state as initialisation draws them, a random batch
// of token ids below 64, the first step.
#pragma once

#include "app/Init.h"
#include "support/Random.h"

#include <map>
#include <string>

namespace tgc::test {

inline std::map<std::string, Tensor> randomStepLeaves(const Graph &graph, uint64_t seed) {
  Rng rng(seed);
  std::map<std::string, Tensor> leaves = initParams(graph, rng.next());
  for (const char *name : {"tokens", "targets"}) {
    Tensor t = Tensor::zeros(graph.lookup(name)->type());
    for (int32_t &v : t.ints)
      v = int32_t(rng.below(64));
    leaves[name] = std::move(t);
  }
  leaves["step"] = Tensor{graph.lookup("step")->type(), {}, {1}};
  return leaves;
}

} // namespace tgc::test
