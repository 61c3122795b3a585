// Generation with a KV cache against the full inference program: the decode program, fed one
// token a step, gives each position the logits the full program gives that position, for the
// model variants and in fp32 and bf16; the generator's tokens agree with and without the cache.
#include "backends/cpu/Pipeline.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "app/Generate.h"
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

std::unique_ptr<Graph> inferenceProgram(const ModelConfig &c, int64_t batch, GPTOutput output) {
  auto graph = unwrap(buildGPT(c, batch, output));
  if (!graph)
    return nullptr;
  PipelineOptions options;
  options.passOptions.precision = resolveRecipeForCpu(c.precision);
  auto pipeline = unwrap(PassPipeline::create(forwardPipeline(), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// Random weights away from the init (norm weights and biases too), by name.
std::map<std::string, Tensor> randomWeights(const Graph &g, Rng &rng) {
  std::map<std::string, Tensor> weights = initParams(g, rng.next());
  for (auto &[name, t] : weights)
    for (float &v : t.data)
      v += float(rng.normal() * 0.1);
  return weights;
}

struct Case {
  const char *model;
  const char *recipe;
  double bound; // relative to the largest logit
};

class KvCache : public testing::TestWithParam<Case> {};

TEST_P(KvCache, DecodeStepsGiveTheFullProgramsLogits) {
  Case param = GetParam();
  ModelConfig c = unwrap(loadModelConfig(sourcePath(param.model)));
  c.precision.recipe = *parseRecipe(param.recipe);
  const int64_t B = 2, T = c.seqLen, V = c.vocab;
  auto full = inferenceProgram(c, B, GPTOutput::Logits);
  auto decode = inferenceProgram(c, B, GPTOutput::Decode);
  ASSERT_TRUE(full && decode);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*full, rng);
  Tensor tokens = Tensor::zeros(TensorType(DType::I32, {B, T}));
  for (int32_t &t : tokens.ints)
    t = int32_t(rng.below(V));
  Interpreter fullRun(*full);
  ASSERT_FALSE(bool(fullRun.bindAll(weights)));
  ASSERT_FALSE(bool(fullRun.bind("tokens", tokens)));
  std::vector<float> want = unwrap(fullRun.run()).at(0).data; // [B, T, V]
  Interpreter step(*decode);
  for (const Op *op : decode->ops()) {
    const std::string &name = op->result() ? op->result()->name() : "";
    if (op->kind() == OpKind::Param) {
      ASSERT_FALSE(bool(step.bind(name, weights.at(name))));
    } else if (op->kind() == OpKind::State) { // the KV caches; past pos they are never read
      ASSERT_FALSE(bool(step.bind(name, Tensor::zeros(op->result()->type()))));
    }
  }
  double scale = 0;
  for (float v : want)
    scale = std::max(scale, double(std::fabs(v)));
  for (int64_t pos = 0; pos < T; ++pos) {
    TensorType column(DType::I32, {B, 1});
    Tensor fed = Tensor::zeros(column), positions = Tensor::zeros(column);
    for (int64_t b = 0; b < B; ++b) {
      fed.ints[b] = tokens.ints[b * T + pos];
      positions.ints[b] = int32_t(pos);
    }
    ASSERT_FALSE(bool(step.bind("tokens", fed)));
    ASSERT_FALSE(bool(step.bind("positions", positions)));
    ASSERT_FALSE(bool(step.bind("pos", Tensor{TensorType(DType::I32, {}), {}, {int32_t(pos)}})));
    std::vector<float> got = unwrap(step.run()).at(0).data; // [B, 1, V]
    double worst = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, double(std::fabs(got[b * V + v] - want[(b * T + pos) * V + v])));
    ASSERT_LE(worst, param.bound * scale) << "position " << pos << ", largest logit " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, KvCache,
    testing::Values(Case{"models/tiny.yaml", "fp32", 1e-5},
                    // RMSNorm, SwiGLU, tied embeddings, no biases
                    Case{"tests/models/tiny-variants.yaml", "fp32", 1e-5},
                    // The attention's probabilities are rounded to BF16 in both, from values that
                    // differ in the last bits: one can land on the neighbouring BF16.
                    Case{"models/tiny.yaml", "bf16", 1e-2}),
    [](const testing::TestParamInfo<Case> &info) {
      return std::string(info.param.model).find("variants") != std::string::npos
                 ? std::string("variants_") + info.param.recipe
                 : std::string("tiny_") + info.param.recipe;
    });

TEST(KvCacheOps, APositionOutsideTheCacheIsAnError) {
  auto g = unwrap(parseGraph("graph @g\n%cache = input() : f32[2,4,8]\n%x = input() : f32[2,1,8]\n"
                             "%pos = input() : i32[]\n%new = kv_write(%cache, %x, %pos) : f32[2,4,8]\n"
                             "%out = decode_attention(%x, %new, %new, %pos) {heads=2, scale=0.5} : f32[2,1,8]\n"
                             "return %new, %out\n",
                             "kv.ir"));
  ASSERT_TRUE(g);
  Interpreter interp(*g);
  ASSERT_FALSE(bool(interp.bind("cache", Tensor::zeros(TensorType(DType::F32, {2, 4, 8})))));
  Tensor x = Tensor::zeros(TensorType(DType::F32, {2, 1, 8}));
  for (size_t i = 0; i < x.data.size(); ++i)
    x.data[i] = float(i);
  ASSERT_FALSE(bool(interp.bind("x", x)));
  ASSERT_FALSE(bool(interp.bind("pos", Tensor{TensorType(DType::I32, {}), {}, {2}})));
  auto out = unwrap(interp.run());
  ASSERT_EQ(out.size(), 2u);
  // Row 2 of each sequence holds x; the others stay zero. Keys 0..2: zeros and x; the softmax
  // over three scores weights x's value by its probability.
  EXPECT_EQ(out[0].data[(0 * 4 + 2) * 8 + 3], 3.0f);
  EXPECT_EQ(out[0].data[(1 * 4 + 2) * 8 + 5], 13.0f);
  EXPECT_EQ(out[0].data[(0 * 4 + 1) * 8 + 3], 0.0f);
  EXPECT_GT(out[1].data[0 * 8 + 3], 0.0f);
  EXPECT_LT(out[1].data[0 * 8 + 3], 3.0f);
  ASSERT_FALSE(bool(interp.bind("pos", Tensor{TensorType(DType::I32, {}), {}, {4}})));
  EXPECT_NE(errorOf(interp.run()).find("position 4 is outside the cache [0, 4)"), std::string::npos);
  ASSERT_FALSE(bool(interp.bind("pos", Tensor{TensorType(DType::I32, {}), {}, {-1}})));
  EXPECT_NE(errorOf(interp.run()).find("position -1 is outside the cache [0, 4)"), std::string::npos);
}

TEST(Generator, TokensWithAndWithoutTheCacheAgree) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  auto generator = unwrap(Generator::create(c, weights, 4));
  ASSERT_TRUE(generator);
  std::vector<std::vector<int32_t>> prompts(3, std::vector<int32_t>(5));
  for (auto &p : prompts)
    for (int32_t &t : p)
      t = int32_t(rng.below(c.vocab));
  // 5 + 28 - 1 = 32 positions: the whole cache; greedy, then sampled with a seed.
  for (SamplingOptions options : {SamplingOptions{}, SamplingOptions{0.8, 10, 7}}) {
    auto cached = unwrap(generator->generate(prompts, 28, options));
    auto uncached = unwrap(generator->generateWithoutCache(prompts, 28, options));
    EXPECT_EQ(cached, uncached) << "temperature " << options.temperature;
    ASSERT_EQ(cached.size(), 3u);
    EXPECT_EQ(cached[0].size(), 28u);
  }
  // Past seq_len the generator slides the window with the full program.
  auto longer = unwrap(generator->generate(prompts, 40, {}));
  ASSERT_EQ(longer.size(), 3u);
  EXPECT_EQ(longer[0].size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(longer[0].begin(), longer[0].begin() + 28),
            unwrap(generator->generate(prompts, 28, {}))[0]);
}

} // namespace
