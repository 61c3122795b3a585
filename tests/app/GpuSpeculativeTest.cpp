// Speculative decoding on the GPU against the CPU (SpeculativeTest.cpp's twin): the verify
// program's logits, several tokens a sequence over random caches, and the generator with a
// draft giving the CPU's plain greedy tokens. Skipped where there is no GPU.
#include "tests/RandomWeights.h"
#include "tests/backends/cuda/GpuTestUtil.h"

#include <algorithm>

using namespace tgc;
using namespace tgc::test;

namespace {

class GpuVerify : public testing::TestWithParam<std::string> {};

TEST_P(GpuVerify, RowsFollowTheCpuOverRandomCaches) {
  // Four sequences, each checking 5 tokens from a position of its own (the last one's ending at
  // the window's last row), over caches of random values: kv_write's rows at each sequence's
  // positions, then the attention of each query up to its own position (decode.cuh, S = 5).
  SKIP_WITHOUT_GPU();
  const GpuDecodeCase param = gpuDecodeCase(GetParam());
  const bool bf16 = param.recipe == "bf16";
  ModelConfig c = unwrap(loadModelConfig(sourcePath(param.model)));
  const int64_t B = 4, S = 5, T = c.seqLen; // (tinyGpuProgram's batch of 4)
  auto program = tinyGpuProgram(param.recipe, GPTOutput::Verify, param.model, S);
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = randomWeights(*program, rng);
  for (int trial = 0; trial < 3; ++trial) {
    Tensor tokens = Tensor::zeros(TensorType(DType::I32, {B, S})), at = tokens;
    Tensor first = Tensor::zeros(TensorType(DType::I32, {B, 1}));
    for (int64_t b = 0; b < B; ++b) {
      first.ints[b] = b == B - 1 ? int32_t(T - S) : int32_t(rng.below(uint64_t(T - S + 1)));
      for (int64_t s = 0; s < S; ++s) {
        tokens.ints[b * S + s] = int32_t(rng.below(uint64_t(c.vocab)));
        at.ints[b * S + s] = first.ints[b] + int32_t(s);
      }
    }
    leaves["tokens"] = tokens;
    leaves["positions"] = first;
    leaves["token_positions"] = at;
    std::vector<Tensor> want, got;
    runOnBoth(*program, leaves, want, got);
    ASSERT_EQ(want.size(), 2u);
    ASSERT_EQ(got.size(), 2u);
    Gap gap = gapOf(want[0].data, got[0].data);
    EXPECT_LE(gap.worst, param.bound * gap.scale) << "trial " << trial;
    if (!bf16) { // (under BF16 a near tie may go either way)
      EXPECT_EQ(got[1].ints, want[1].ints) << "trial " << trial;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuVerify, gpuDecodeCases(), gpuDecodeCaseName);

TEST(GpuSpeculative, GivesTheCpusPlainGreedyTokens) {
  // The model as its own draft (every proposal kept) and another model's draft, lookahead 3,
  // prompts of four lengths, to the window's end: the GPU's tokens are the CPU's plain greedy
  // decoding's (fp32).
  SKIP_WITHOUT_GPU();
  ModelConfig small = unwrap(loadModelConfig(sourcePath("tests/models/tiny-variants.yaml")));
  small.precision.recipe = Recipe::Fp32;
  for (const char *model : {"models/tiny.yaml", "models/llama-tiny.yaml"}) {
    SCOPED_TRACE(model);
    ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
    c.precision.recipe = Recipe::Fp32;
    auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits)), smallGraph = unwrap(buildGPT(small, 1, GPTOutput::Logits));
    ASSERT_TRUE(graph && smallGraph);
    Rng rng(freshSeed());
    std::map<std::string, Tensor> weights = randomWeights(*graph, rng), other = randomWeights(*smallGraph, rng);
    auto cpu = unwrap(Generator::create(c, weights, 4, Device::cpu()));
    auto gpu = unwrap(Generator::create(c, weights, 4, theGpu()));
    ASSERT_TRUE(cpu && gpu);
    std::vector<std::vector<int32_t>> prompts = randomPrompts(rng, {1, 7, 12, 3}, c.vocab);
    const int64_t count = c.seqLen - 12 + 1;
    auto want = unwrap(cpu->generate(prompts, count, {}));
    for (bool self : {true, false}) {
      auto draft = unwrap(self ? Generator::create(c, weights, 4, theGpu()) : Generator::create(small, other, 4, theGpu()));
      ASSERT_TRUE(draft);
      ASSERT_FALSE(bool(gpu->setDraft(std::move(draft), 3)));
      EXPECT_EQ(unwrap(gpu->generate(prompts, count, {})), want) << (self ? "its own draft" : "another draft");
      EXPECT_GT(gpu->stats().verifySteps, 0);
      if (self) {
        EXPECT_EQ(gpu->stats().acceptedTokens, gpu->stats().draftedTokens);
      }
    }
  }
}

} // namespace
