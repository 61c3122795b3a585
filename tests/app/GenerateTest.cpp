// Generation with a KV cache against the full inference program: the decode program, fed one
// token a step, gives each position the logits the full program gives that position, for the
// model variants and in fp32 and bf16; the generator's tokens agree with and without the cache.
#include "tests/RandomWeights.h"
#include "tests/app/GenerationCases.h"
#include "backends/cpu/Pipeline.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "app/Generate.h"
#include "app/PrecisionProbe.h"
#include "app/Init.h"
#include "app/Trainer.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <algorithm>
#include <set>
#include <cmath>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

/// What the KV-cache tests compare with: the full program's logits for B random sequences of
/// seq_len tokens, from random weights, and the decode program to compare.
struct FullRun {
  ModelConfig c;
  std::unique_ptr<Graph> decode;
  std::map<std::string, Tensor> weights;
  Tensor tokens;           // [B, T]
  std::vector<float> want; // [B, T, V]
  double scale = 0;        // the largest logit
};

FullRun fullRun(const Case &param, int64_t B, Rng &rng) {
  FullRun r;
  r.c = unwrap(loadModelConfig(sourcePath(param.model)));
  r.c.precision.recipe = *parseRecipe(param.recipe);
  auto full = inferenceProgram(r.c, B, GPTOutput::Logits);
  r.decode = inferenceProgram(r.c, B, GPTOutput::Decode);
  if (!full || !r.decode)
    return r;
  r.weights = randomWeights(*full, rng);
  r.tokens = Tensor::zeros(TensorType(DType::I32, {B, r.c.seqLen}));
  for (int32_t &t : r.tokens.ints)
    t = int32_t(rng.below(r.c.vocab));
  Interpreter interp(*full);
  EXPECT_FALSE(bool(interp.bindAll(r.weights)));
  EXPECT_FALSE(bool(interp.bind("tokens", r.tokens)));
  r.want = unwrap(interp.run()).at(0).data;
  for (float v : r.want)
    r.scale = std::max(r.scale, double(std::fabs(v)));
  return r;
}

/// Binds `program`'s parameters from `weights`, its state (the KV caches) to zeros and its
/// sampling to greedy.
void bindLeaves(Interpreter &interp, const Graph &program, const std::map<std::string, Tensor> &weights) {
  for (const auto &[name, tensor] : greedySampling(program))
    EXPECT_FALSE(bool(interp.bind(name, tensor))) << name;
  for (const Op *op : program.ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    const std::string &name = op->result()->name();
    EXPECT_FALSE(bool(interp.bind(name, op->kind() == OpKind::Param ? weights.at(name)
                                                                    : Tensor::zeros(op->result()->type()))))
        << name;
  }
}

class KvCache : public testing::TestWithParam<Case> {};

TEST_P(KvCache, DecodeStepsGiveTheFullProgramsLogits) {
  Case param = GetParam();
  const int64_t B = 2;
  Rng rng(freshSeed());
  FullRun ref = fullRun(param, B, rng);
  ASSERT_TRUE(ref.decode && !ref.want.empty());
  const int64_t T = ref.c.seqLen, V = ref.c.vocab;
  Interpreter step(*ref.decode);
  bindLeaves(step, *ref.decode, ref.weights); // the KV caches past each position are never read
  for (int64_t pos = 0; pos < T; ++pos) {
    TensorType column(DType::I32, {B, 1});
    Tensor fed = Tensor::zeros(column), positions = Tensor::zeros(column);
    for (int64_t b = 0; b < B; ++b) {
      fed.ints[b] = ref.tokens.ints[b * T + pos];
      positions.ints[b] = int32_t(pos);
    }
    ASSERT_FALSE(bool(step.bind("tokens", fed)));
    ASSERT_FALSE(bool(step.bind("positions", positions)));
    std::vector<float> got = unwrap(step.run()).at(0).data; // [B, 1, V]
    double worst = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, double(std::fabs(got[b * V + v] - ref.want[(b * T + pos) * V + v])));
    ASSERT_LE(worst, param.bound * ref.scale) << "position " << pos << ", largest logit " << ref.scale;
  }
}

TEST_P(KvCache, PrefillThenDecodeGiveTheFullProgramsLogits) {
  // Two prompts of different lengths through one prefill program (its positions past a
  // prompt are padding), the caches handed to the decode program, then each sequence decoded
  // from its own position to the end of the window: every row of logits is the full
  // program's at that position, and %next is its argmax.
  Case param = GetParam();
  const int64_t B = 2;
  Rng rng(freshSeed());
  FullRun ref = fullRun(param, B, rng);
  ASSERT_TRUE(ref.decode && !ref.want.empty());
  const int64_t T = ref.c.seqLen, V = ref.c.vocab;
  const Tensor &tokens = ref.tokens;
  auto expectRows = [&](const std::vector<float> &got, const std::vector<int32_t> &next,
                        const std::vector<int64_t> &rows) {
    for (int64_t b = 0; b < B; ++b) {
      double worst = 0;
      const float *row = &ref.want[(b * T + rows[b]) * V];
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, double(std::fabs(got[b * V + v] - row[v])));
      EXPECT_LE(worst, param.bound * ref.scale) << "sequence " << b << ", position " << rows[b];
      EXPECT_EQ(next[b], int32_t(std::max_element(&got[b * V], &got[(b + 1) * V]) - &got[b * V]));
    }
  };
  for (auto [P, lengths] : {std::pair<int64_t, std::vector<int64_t>>{16, {3, 16}}, {T, {T / 2 + 1, T}}, {T, {1, T - 3}}}) {
    SCOPED_TRACE(fmt::format("prefill of {} positions, prompts of {} and {}", P, lengths[0], lengths[1]));
    auto prefill = inferenceProgram(ref.c, B, GPTOutput::Prefill, P);
    ASSERT_TRUE(prefill);
    Interpreter first(*prefill), step(*ref.decode);
    bindLeaves(first, *prefill, ref.weights);
    bindLeaves(step, *ref.decode, ref.weights);
    Tensor prompt = Tensor::zeros(TensorType(DType::I32, {B, P})), lastRows = Tensor::zeros(TensorType(DType::I32, {B, 1}));
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < lengths[b]; ++t)
        prompt.ints[b * P + t] = tokens.ints[b * T + t];
      for (int64_t t = lengths[b]; t < P; ++t) // padding: whatever it is, no prompt position reads it
        prompt.ints[b * P + t] = int32_t(rng.below(V));
      lastRows.ints[b] = int32_t(b * P + lengths[b] - 1);
    }
    ASSERT_FALSE(bool(first.bind("tokens", prompt)));
    ASSERT_FALSE(bool(first.bind("last_rows", lastRows)));
    auto out = unwrap(first.run()); // logits [B, 1, V], next [B, 1]
    ASSERT_EQ(out.size(), 2u);
    expectRows(out[0].data, out[1].ints, {lengths[0] - 1, lengths[1] - 1});
    for (const Op *op : ref.decode->ops()) {
      if (op->kind() == OpKind::State) {
        ASSERT_FALSE(bool(step.copyLeafFrom(op->result()->name(), first)));
      }
    }
    for (int64_t n = 0; lengths[0] + n < T || lengths[1] + n < T; ++n) {
      Tensor fed = Tensor::zeros(TensorType(DType::I32, {B, 1})), positions = fed;
      std::vector<int64_t> rows(B);
      for (int64_t b = 0; b < B; ++b) {
        rows[b] = std::min(lengths[b] + n, T - 1); // a sequence at the window's end repeats it
        fed.ints[b] = tokens.ints[b * T + rows[b]];
        positions.ints[b] = int32_t(rows[b]);
      }
      ASSERT_FALSE(bool(step.bind("tokens", fed)));
      ASSERT_FALSE(bool(step.bind("positions", positions)));
      auto next = unwrap(step.run());
      ASSERT_EQ(next.size(), 2u);
      expectRows(next[0].data, next[1].ints, rows);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, KvCache, generationCases(), caseName);

TEST(KvCacheOps, RowsWrittenAttendedAndPositionsChecked) {
  auto g = unwrap(parseGraph("graph @g\n%k = input() : f32[2,4,2]\n%v = input() : f32[2,4,2]\n"
                             "%qkv = input() : f32[2,1,6]\n%prompt = input() : f32[2,3,6]\n"
                             "%positions = input() : i32[2,1]\n"
                             "%k.new, %v.new = kv_write(%k, %v, %qkv, %positions) : f32[2,4,2], f32[2,4,2]\n"
                             "%out = decode_attention(%qkv, %k.new, %v.new, %positions) {heads=1, scale=0.5} : f32[2,1,2]\n"
                             "%k.first, %v.first = kv_write(%k, %v, %prompt) : f32[2,4,2], f32[2,4,2]\n"
                             "%best = argmax(%prompt) : i32[2,3]\n"
                             "return %k.new, %v.new, %out, %k.first, %best\n",
                             "kv.ir"));
  ASSERT_TRUE(g);
  Interpreter interp(*g);
  for (const char *cache : {"k", "v"})
    ASSERT_FALSE(bool(interp.bind(cache, Tensor::zeros(TensorType(DType::F32, {2, 4, 2})))));
  Tensor qkv = Tensor::zeros(TensorType(DType::F32, {2, 1, 6})), prompt = Tensor::zeros(TensorType(DType::F32, {2, 3, 6}));
  for (size_t i = 0; i < qkv.data.size(); ++i)
    qkv.data[i] = float(i);
  for (size_t i = 0; i < prompt.data.size(); ++i)
    prompt.data[i] = float(i % 7);
  ASSERT_FALSE(bool(interp.bind("qkv", qkv)));
  ASSERT_FALSE(bool(interp.bind("prompt", prompt)));
  ASSERT_FALSE(bool(interp.bind("positions", Tensor{TensorType(DType::I32, {2, 1}), {}, {2, 0}})));
  auto out = unwrap(interp.run());
  ASSERT_EQ(out.size(), 5u);
  // Sequence 0 writes row 2, sequence 1 row 0: keys are qkv's columns 2..3, values 4..5.
  EXPECT_EQ(out[0].data[(0 * 4 + 2) * 2 + 1], 3.0f);
  EXPECT_EQ(out[1].data[(0 * 4 + 2) * 2 + 0], 4.0f);
  EXPECT_EQ(out[0].data[(1 * 4 + 0) * 2 + 0], 8.0f);
  EXPECT_EQ(out[1].data[(1 * 4 + 0) * 2 + 1], 11.0f);
  EXPECT_EQ(out[0].data[(0 * 4 + 1) * 2 + 1], 0.0f);
  // Sequence 0 attends over rows 0..2 (two of zeros): its value weighted by its probability;
  // sequence 1 over row 0 alone: exactly its value.
  EXPECT_GT(out[2].data[0], 0.0f);
  EXPECT_LT(out[2].data[0], 4.0f);
  EXPECT_EQ(out[2].data[2], 10.0f);
  EXPECT_EQ(out[2].data[3], 11.0f);
  // Without positions, the prompt's three rows from row 0.
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t s = 0; s < 3; ++s)
      EXPECT_EQ(out[3].data[(b * 4 + s) * 2 + 1], prompt.data[((b * 3 + s) * 3 + 1) * 2 + 1]);
  EXPECT_EQ(out[3].data[(0 * 4 + 3) * 2], 0.0f);
  // argmax: the first largest of each row of six.
  for (int64_t row = 0; row < 6; ++row) {
    const float *x = &prompt.data[row * 6];
    EXPECT_EQ(out[4].ints[row], int32_t(std::max_element(x, x + 6) - x)) << "row " << row;
  }
  ASSERT_FALSE(bool(interp.bind("positions", Tensor{TensorType(DType::I32, {2, 1}), {}, {1, 4}})));
  EXPECT_NE(errorOf(interp.run()).find("position 4 of sequence 1 is outside the cache [0, 4)"), std::string::npos);
  ASSERT_FALSE(bool(interp.bind("positions", Tensor{TensorType(DType::I32, {2, 1}), {}, {-1, 0}})));
  EXPECT_NE(errorOf(interp.run()).find("position -1 of sequence 0 is outside the cache [0, 4)"), std::string::npos);
}

TEST(KvCacheOps, ArgmaxTakesTheFirstOfTiesAndNeverNaN) {
  auto g = unwrap(parseGraph("graph @g\n%x = input() : f32[3,4]\n%i = argmax(%x) : i32[3]\nreturn %i\n", "a.ir"));
  ASSERT_TRUE(g);
  Interpreter interp(*g);
  float nan = std::nanf("");
  ASSERT_FALSE(bool(interp.bind("x", Tensor{TensorType(DType::F32, {3, 4}), {1, 5, 5, 2, nan, -1, 3, nan, nan, nan, nan, nan}, {}})));
  EXPECT_EQ(unwrap(interp.run()).at(0).ints, (std::vector<int32_t>{1, 2, 0}));
}

class CachedGenerator : public testing::TestWithParam<const char *> {};
constexpr uint64_t kGenerationSeed = 20261202;

TEST_P(CachedGenerator, TokensWithAndWithoutTheCacheAgree) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(GetParam())));
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  // Fixed weights: the cached and the full program's logits differ in their last bits (the
  // attention sums in another order), so a sampled token can, rarely, fall on the other side of
  // a draw's threshold (seen once in about ten random seeds): the tokens compared here are those
  // of weights where no draw lands within those bits of a threshold.
  Rng rng(kGenerationSeed);
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  auto generator = unwrap(Generator::create(c, weights, 4));
  ASSERT_TRUE(generator);
  // Three prompts of different lengths; the longest, 5 + 28 - 1 = 32 positions, fills the
  // whole cache; greedy, then sampled with a seed (top-k, then top-p too).
  std::vector<std::vector<int32_t>> prompts = randomPrompts(rng, {5, 1, 3}, c.vocab);
  for (SamplingOptions options : {SamplingOptions{}, SamplingOptions{0.8, 10, 1, 7}, SamplingOptions{1.2, 0, 0.7, 9}}) {
    std::vector<int64_t> streamed;
    auto cached = unwrap(generator->generate(prompts, 28, options, [&](int64_t step, const std::vector<int32_t> &tokens) {
      EXPECT_EQ(step, int64_t(streamed.size()));
      streamed.push_back(tokens[2]);
    }));
    EXPECT_TRUE(generator->stats().cached);
    EXPECT_EQ(generator->stats().prefillLength, 16);
    EXPECT_EQ(generator->stats().promptTokens, 9);
    EXPECT_EQ(generator->stats().generatedTokens, 3 * 28);
    EXPECT_EQ(generator->stats().decodeSteps, 27);
    auto uncached = unwrap(generator->generateWithoutCache(prompts, 28, options));
    EXPECT_EQ(cached, uncached) << "temperature " << options.temperature;
    ASSERT_EQ(cached.size(), 3u);
    EXPECT_EQ(cached[0].size(), 28u);
    EXPECT_EQ(std::vector<int64_t>(cached[2].begin(), cached[2].end()), streamed);
  }
  // Past seq_len the generator slides the window with the full program.
  auto longer = unwrap(generator->generate(prompts, 40, {}));
  ASSERT_EQ(longer.size(), 3u);
  EXPECT_EQ(longer[0].size(), 40u);
  EXPECT_EQ(std::vector<int32_t>(longer[0].begin(), longer[0].begin() + 28),
            unwrap(generator->generate(prompts, 28, {}))[0]);
}

// Each prompt length runs a prefill program of that length rounded up to 16 positions (not to
// a power of two), and the programs of earlier lengths give way beyond four: the tokens stay
// those of the full program at every length, the first length's again after it was evicted.
TEST(Generator, PrefillsRoundPromptsToSixteenPositionsAndKeepFourPrograms) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.seqLen = 128;
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(kGenerationSeed + 1);
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  auto generator = unwrap(Generator::create(c, weights, 2));
  ASSERT_TRUE(generator);
  EXPECT_EQ(generator->prefillLength(1), 16);
  EXPECT_EQ(generator->prefillLength(16), 16);
  EXPECT_EQ(generator->prefillLength(17), 32);
  EXPECT_EQ(generator->prefillLength(65), 80);
  EXPECT_EQ(generator->prefillLength(127), 128);
  for (int64_t longest : {40, 17, 65, 81, 100, 33, 40}) {
    std::vector<std::vector<int32_t>> prompts = randomPrompts(rng, {longest, 5}, c.vocab);
    auto cached = unwrap(generator->generate(prompts, 4, {}));
    EXPECT_EQ(generator->stats().prefillLength, (longest + 15) / 16 * 16) << longest;
    EXPECT_EQ(cached, unwrap(generator->generateWithoutCache(prompts, 4, {}))) << longest;
    EXPECT_LE(generator->prefillPrograms(), Generator::kKeptPrefills);
  }
  EXPECT_EQ(generator->prefillPrograms(), Generator::kKeptPrefills);
}

INSTANTIATE_TEST_SUITE_P(Models, CachedGenerator, testing::Values("models/tiny.yaml", "models/llama-tiny.yaml"),
                         [](const testing::TestParamInfo<const char *> &info) {
                           return std::string(info.param).find("llama") != std::string::npos ? "llama" : "tiny";
                         });

TEST(Generator, AnFp8CheckpointGeneratesAtAnyBatch) {
  // An FP8 run's checkpoint holds the scaling state of the layers training ran in FP8; every
  // inference program runs those layers in FP8 at any batch (the decode step's rows need not be a
  // multiple of 16) with the scales frozen, so the cached decode gives the tokens of the full
  // program over the window, for delayed and current scaling alike, at 1 to 17 sequences; and
  // the held-out evaluation runs at 5.
  for (Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Current}) {
    ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
    c.precision.recipe = Recipe::Fp8;
    c.precision.fp8Scaling = scaling;
    auto trainer = unwrap(Trainer::create(c));
    ASSERT_TRUE(trainer);
    for (int step = 0; step < 3; ++step)
      ASSERT_TRUE(std::isfinite(unwrap(trainer->step()).loss));
    Checkpoint checkpoint = unwrap(trainer->checkpoint());
    std::vector<std::string> layers = fp8LayersOf(checkpoint.tensors);
    EXPECT_EQ(layers, (std::vector<std::string>{"h0.attn.proj", "h0.attn.qkv", "h0.mlp.fc1", "h0.mlp.fc2",
                                                "h1.attn.proj", "h1.attn.qkv", "h1.mlp.fc1", "h1.mlp.fc2"}));
    for (int64_t batch : {1, 5, 16, 17}) {
      SCOPED_TRACE(fmt::format("{} scaling, batch {}", fp8ScalingName(scaling).str(), batch));
      auto generator = unwrap(Generator::create(c, checkpoint.tensors, batch));
      ASSERT_TRUE(generator);
      std::vector<std::vector<int32_t>> prompts(size_t(batch), std::vector<int32_t>{3, 8, 13});
      prompts.back() = {5, 7};
      if (batch > 1)
        prompts.front() = {9, 10, 11, 12, 13};
      auto cached = unwrap(generator->generate(prompts, 6, {}));
      EXPECT_TRUE(generator->stats().cached);
      ASSERT_EQ(cached.size(), size_t(batch));
      for (const auto &tokens : cached) {
        ASSERT_EQ(tokens.size(), 6u);
        for (int32_t t : tokens)
          EXPECT_TRUE(t >= 0 && t < c.vocab) << t;
      }
      EXPECT_EQ(cached, unwrap(generator->generateWithoutCache(prompts, 6, {})));
      // A sequence's tokens do not depend on the batch it is in.
      auto alone = unwrap(unwrap(Generator::create(c, checkpoint.tensors, 1))->generate({prompts.back()}, 6, {}));
      EXPECT_EQ(alone[0], cached.back());
    }
    auto generator = unwrap(Generator::create(c, checkpoint.tensors, 5));
    ASSERT_TRUE(generator);
    EvalResult result = unwrap(evaluateArithmetic(*generator, c, 5, 8, 5));
    EXPECT_EQ(result.sequences, 5);
  }
}

TEST(Generator, AnFp8CheckpointRunsInFp8OnlyTheLayersItTrainedInFp8) {
  // fp8_layers keeps fc1 alone in FP8; the inference programs follow the checkpoint's state,
  // whatever the recipe's rules would choose at their rows.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.precision.fp8Layers = std::vector<std::string>{"h*.mlp.fc1"};
  auto trainer = unwrap(Trainer::create(c));
  ASSERT_TRUE(trainer);
  ASSERT_TRUE(std::isfinite(unwrap(trainer->step()).loss));
  Checkpoint checkpoint = unwrap(trainer->checkpoint());
  EXPECT_EQ(fp8LayersOf(checkpoint.tensors), (std::vector<std::string>{"h0.mlp.fc1", "h1.mlp.fc1"}));
  ModelConfig saved = unwrap(checkpointModel(checkpoint, "ckpt"));
  ASSERT_TRUE(saved.precision.fp8Layers);
  EXPECT_EQ(*saved.precision.fp8Layers, std::vector<std::string>{"h*.mlp.fc1"});
  c.precision.fp8Layers.reset(); // as a model file without fp8_layers would give
  auto generator = unwrap(Generator::create(c, checkpoint.tensors, 3));
  ASSERT_TRUE(generator);
  auto tokens = unwrap(generator->generate({{1, 2, 3}, {4}, {7, 7}}, 5, {}));
  EXPECT_EQ(tokens, unwrap(generator->generateWithoutCache({{1, 2, 3}, {4}, {7, 7}}, 5, {})));
}
} // namespace

TEST(Generator, PromptValuesAreTheFullProgramsOwn) {
  // promptValues traces the full inference program's run of a prompt (19 values of the fused
  // 2-layer program): every value once, the token embedding first, and its logits
  // promptLogits's bit for bit, run after it.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  Rng rng(freshSeed());
  auto graph = unwrap(buildGPT(c, 2, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  auto generator = unwrap(Generator::create(c, randomWeights(*graph, rng), 2));
  ASSERT_TRUE(generator);
  std::vector<int32_t> prompt = randomPrompts(rng, {7}, c.vocab)[0];
  auto traced = unwrap(generator->promptValues(prompt));
  ASSERT_GT(traced.size(), 10u);
  std::set<std::string> names;
  for (const auto &[name, value] : traced)
    EXPECT_TRUE(names.insert(name).second) << "%" << name << " twice";
  EXPECT_EQ(traced.front().first, "tok_emb");
  auto logits = std::find_if(traced.begin(), traced.end(), [](const auto &v) { return v.first == "logits"; });
  ASSERT_NE(logits, traced.end());
  Tensor want = unwrap(generator->promptLogits(prompt));
  ASSERT_LE(want.data.size(), logits->second.data.size());
  EXPECT_TRUE(std::equal(want.data.begin(), want.data.end(), logits->second.data.begin()));
}
