// Random weights away from the init, for tests that compare two programs or devices on them.
#pragma once

#include "app/Init.h"
#include "models/ProgramInterface.h"
#include "support/Random.h"

#include <initializer_list>
#include <map>
#include <string>
#include <vector>

namespace tgc::test {

/// A generation program's sample op inputs (%sampling, %sample_seed), where `g` has them, set to
/// greedy decoding: temperature 0 (the sample op's argmax).
inline std::map<std::string, Tensor> greedySampling(const Graph &g) {
  std::map<std::string, Tensor> inputs;
  for (llvm::StringRef name : {program::kSampling, program::kSampleSeed})
    if (const Value *input = g.lookup(name))
      inputs[name.str()] = Tensor::zeros(input->type());
  return inputs;
}

/// initParams' leaves of `g` (norm weights and biases too), each value moved by a normal draw
/// of 0.1, by name; and greedySampling's inputs.
inline std::map<std::string, Tensor> randomWeights(const Graph &g, Rng &rng) {
  std::map<std::string, Tensor> weights = initParams(g, rng.next());
  for (auto &[name, t] : weights)
    for (float &v : t.data)
      v += float(rng.normal() * 0.1);
  weights.merge(greedySampling(g));
  return weights;
}

/// Prompts of `lengths` tokens, each drawn below `vocab` in order.
inline std::vector<std::vector<int32_t>> randomPrompts(Rng &rng, std::initializer_list<int64_t> lengths, int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t length : lengths) {
    prompts.emplace_back(size_t(length));
    for (int32_t &t : prompts.back())
      t = int32_t(rng.below(uint64_t(vocab)));
  }
  return prompts;
}

} // namespace tgc::test
