// Speculative decoding: the verify program (several tokens a sequence over the KV cache) gives
// each of its rows the full program's logits at that position, and the generator with a draft
// gives plain greedy decoding's tokens, whatever the draft proposes and however many tokens a
// step keeps.
#include "tests/RandomWeights.h"
#include "tests/app/GenerationCases.h"
#include "app/Generate.h"
#include "backends/cpu/Interpreter.h"
#include "backends/cpu/Pipeline.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

class VerifyProgram : public testing::TestWithParam<Case> {};

TEST_P(VerifyProgram, EachRowGivesTheFullProgramsLogitsAtItsPosition) {
  // Two sequences at positions of their own: decode steps fill each one's cache up to its
  // position, then one verify step of S tokens a sequence writes rows position .. position +
  // S - 1 and attends over the rows before each; its rows of logits are the full program's,
  // %next their argmax. Then a second verify step from one row on (the first's rows after it
  // rejected): what it reads of them it has written again first.
  Case param = GetParam();
  const int64_t B = 2, S = 4;
  ModelConfig c = unwrap(loadModelConfig(sourcePath(param.model)));
  c.precision.recipe = *parseRecipe(param.recipe);
  const int64_t T = c.seqLen, V = c.vocab;
  auto full = inferenceProgram(c, B, GPTOutput::Logits), decode = inferenceProgram(c, B, GPTOutput::Decode);
  auto verify = inferenceProgram(c, B, GPTOutput::Verify, S);
  ASSERT_TRUE(full && decode && verify);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*full, rng);
  Tensor tokens = Tensor::zeros(TensorType(DType::I32, {B, T}));
  for (int32_t &t : tokens.ints)
    t = int32_t(rng.below(V));
  Interpreter whole(*full);
  ASSERT_FALSE(bool(whole.bindAll(weights)));
  ASSERT_FALSE(bool(whole.bind("tokens", tokens)));
  std::vector<float> want = unwrap(whole.run()).at(0).data;
  double scale = 0;
  for (float v : want)
    scale = std::max(scale, double(std::fabs(v)));
  Interpreter step(*decode), check(*verify);
  for (Interpreter *interp : {&step, &check}) {
    const Graph &g = interp == &step ? *decode : *verify;
    ASSERT_FALSE(bool(interp->bindAll(greedySampling(g))));
    for (const Op *op : g.ops()) {
      if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
        continue;
      const std::string &name = op->result()->name();
      Tensor value = op->kind() == OpKind::Param ? weights.at(name) : Tensor::zeros(op->result()->type());
      ASSERT_FALSE(bool(interp->bind(name, value)));
    }
  }
  const std::vector<int32_t> start{int32_t(T / 2), int32_t(T - S)};
  TensorType column(DType::I32, {B, 1});
  for (int32_t pos = 0; pos < start[1]; ++pos) { // the caches up to each sequence's start
    Tensor fed = Tensor::zeros(column), positions = Tensor::zeros(column);
    for (int64_t b = 0; b < B; ++b) {
      positions.ints[b] = std::min(pos, start[b] - 1);
      fed.ints[b] = tokens.ints[b * T + positions.ints[b]];
    }
    ASSERT_FALSE(bool(step.bindAll({{"tokens", fed}, {"positions", positions}})));
    ASSERT_TRUE(bool(step.run()));
  }
  for (const Op *op : verify->ops()) {
    if (op->kind() == OpKind::State) {
      ASSERT_FALSE(bool(check.copyLeafFrom(op->result()->name(), step)));
    }
  }
  auto runVerify = [&](std::vector<int32_t> first) {
    Tensor fed = Tensor::zeros(TensorType(DType::I32, {B, S})), at = fed;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        at.ints[b * S + s] = first[b] + int32_t(s);
        fed.ints[b * S + s] = tokens.ints[b * T + first[b] + s];
      }
    ASSERT_FALSE(bool(check.bindAll({{"tokens", fed}, {"positions", Tensor{column, {}, first}}, {"token_positions", at}})));
    auto out = unwrap(check.run()); // logits [B, S, V], next [B, S]
    ASSERT_EQ(out.size(), 2u);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) {
        const float *got = &out[0].data[(b * S + s) * V], *row = &want[(b * T + first[b] + s) * V];
        double worst = 0;
        for (int64_t v = 0; v < V; ++v)
          worst = std::max(worst, double(std::fabs(got[v] - row[v])));
        EXPECT_LE(worst, param.bound * scale) << "sequence " << b << ", position " << first[b] + s;
        EXPECT_EQ(out[1].ints[b * S + s], int32_t(std::max_element(got, got + V) - got));
      }
  };
  runVerify(start);
  runVerify({start[0] + 1, start[1] - 2});
}

INSTANTIATE_TEST_SUITE_P(Models, VerifyProgram, generationCases(), caseName);

class SpeculativeGenerator : public testing::TestWithParam<const char *> {};

TEST_P(SpeculativeGenerator, GivesPlainGreedyDecodingsTokens) {
  // Drafts: the model itself (every proposal kept: the draft's catch-up step each round) and
  // another model of the same vocabulary (few kept); lookaheads 1, 3 and 7; three prompts of
  // different lengths, the longest filling the window (the last tokens by plain decode steps).
  ModelConfig c = unwrap(loadModelConfig(sourcePath(GetParam())));
  ModelConfig small = unwrap(loadModelConfig(sourcePath("tests/models/tiny-variants.yaml")));
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits)), smallGraph = unwrap(buildGPT(small, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph && smallGraph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng), other = randomWeights(*smallGraph, rng);
  auto generator = unwrap(Generator::create(c, weights, 4));
  ASSERT_TRUE(generator);
  std::vector<std::vector<int32_t>> prompts = randomPrompts(rng, {5, 1, 3}, c.vocab);
  const int64_t count = c.seqLen - 4;
  auto plain = unwrap(generator->generate(prompts, count, {}));
  ASSERT_EQ(plain.size(), 3u);
  for (bool self : {true, false})
    for (int64_t lookahead : {1, 3, 7}) {
      SCOPED_TRACE(fmt::format("{} draft, lookahead {}", self ? "the model as its own" : "another model's", lookahead));
      auto draft = unwrap(self ? Generator::create(c, weights, 4) : Generator::create(small, other, 4));
      ASSERT_TRUE(draft);
      ASSERT_FALSE(bool(generator->setDraft(std::move(draft), lookahead)));
      EXPECT_EQ(generator->lookahead(), lookahead);
      std::vector<int32_t> streamed;
      auto got = unwrap(generator->generate(prompts, count, {}, [&](int64_t step, const std::vector<int32_t> &tokens) {
        EXPECT_EQ(step, int64_t(streamed.size()));
        streamed.push_back(tokens[1]);
      }));
      EXPECT_EQ(got, plain);
      EXPECT_EQ(streamed, plain[1]);
      const GenerationStats &s = generator->stats();
      EXPECT_EQ(s.generatedTokens, 3 * count);
      EXPECT_GT(s.verifySteps, 0);
      EXPECT_EQ(s.draftedTokens % lookahead, 0);
      if (self) {
        EXPECT_EQ(s.acceptedTokens, s.draftedTokens);
        EXPECT_LT(s.decodeSteps, count - 1); // fewer steps of the model than plain decoding's
      }
    }
  // Sampling runs without the draft: the tokens of the generator without one.
  SamplingOptions sampled{0.9, 0, 0.8, 5};
  auto withDraft = unwrap(generator->generate(prompts, 8, sampled));
  EXPECT_EQ(generator->stats().verifySteps, 0);
  ASSERT_FALSE(bool(generator->setDraft(nullptr, 0)));
  EXPECT_EQ(generator->lookahead(), 0);
  EXPECT_EQ(withDraft, unwrap(generator->generate(prompts, 8, sampled)));
}

INSTANTIATE_TEST_SUITE_P(Models, SpeculativeGenerator, testing::Values("models/tiny.yaml", "models/llama-tiny.yaml"),
                         [](const testing::TestParamInfo<const char *> &info) {
                           return std::string(info.param).find("llama") != std::string::npos ? "llama" : "tiny";
                         });

TEST(SpeculativeGenerator, RefusesADraftThatCannotServe) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  auto generator = unwrap(Generator::create(c, weights, 2));
  ModelConfig wider = c;
  wider.vocab = 80;
  auto widerGraph = unwrap(buildGPT(wider, 1, GPTOutput::Logits));
  ASSERT_TRUE(generator && widerGraph);
  EXPECT_NE(errorOf(generator->setDraft(unwrap(Generator::create(wider, randomWeights(*widerGraph, rng), 2)), 3))
                .find("the draft model's vocabulary (80 tokens) is not the model's (64)"),
            std::string::npos);
  EXPECT_NE(errorOf(generator->setDraft(unwrap(Generator::create(c, weights, 3)), 3)).find("the same batch (2)"),
            std::string::npos);
  for (int64_t lookahead : {int64_t(0), c.seqLen})
    EXPECT_NE(errorOf(generator->setDraft(unwrap(Generator::create(c, weights, 2)), lookahead))
                  .find("the lookahead must be between 1 and seq_len - 1 (31)"),
              std::string::npos);
  EXPECT_EQ(generator->lookahead(), 0);
}

} // namespace
