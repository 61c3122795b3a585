// What the CPU generation tests share (GenerateTest.cpp, SpeculativeTest.cpp): a generation
// program as the CPU pipeline compiles it, and the model and recipe cases they run, each with
// its bound on the logits.
#pragma once

#include "backends/cpu/Pipeline.h"
#include "models/GPTBuilder.h"
#include "tests/TestUtil.h"
#include "transforms/Pass.h"

#include <algorithm>
#include <gtest/gtest.h>

namespace tgc::test {

/// `output`'s program of `c` for `batch` sequences (`length`: a prefill's positions, a verify
/// step's tokens), after the CPU's forward pipeline.
inline std::unique_ptr<Graph> inferenceProgram(const ModelConfig &c, int64_t batch, GPTOutput output,
                                               int64_t length = 0) {
  auto graph = unwrap(buildGPT(c, batch, output, length));
  if (!graph)
    return nullptr;
  PipelineOptions options;
  options.passOptions.precision = resolveRecipeForCpu(c.precision);
  auto pipeline = unwrap(PassPipeline::create(forwardPipeline(), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

struct Case {
  const char *model;
  const char *recipe;
  double bound; // relative to the largest logit
};

/// The cases: the GPT-2 block, its variants (RMSNorm, SwiGLU, tied embeddings, no biases) and
/// the Llama block (RoPE: the caches hold rotated keys; two KV heads for four query heads), in
/// fp32 and bf16 (the attention's probabilities are rounded to BF16 on both sides, from values
/// that differ in the last bits: one can land on the neighbouring BF16).
inline auto generationCases() {
  return testing::Values(Case{"models/tiny.yaml", "fp32", 1e-5}, Case{"tests/models/tiny-variants.yaml", "fp32", 1e-5},
                         Case{"models/tiny.yaml", "bf16", 1e-2}, Case{"models/llama-tiny.yaml", "fp32", 1e-5},
                         Case{"models/llama-tiny.yaml", "bf16", 1e-2});
}

/// A case's test name: tiny_fp32, tiny_variants_fp32, llama_tiny_bf16, ...
inline std::string caseName(const testing::TestParamInfo<Case> &info) {
  std::string model = info.param.model;
  model = model.substr(model.rfind('/') + 1);
  model = model.substr(0, model.find('.'));
  std::replace(model.begin(), model.end(), '-', '_');
  return model + "_" + info.param.recipe;
}

} // namespace tgc::test
