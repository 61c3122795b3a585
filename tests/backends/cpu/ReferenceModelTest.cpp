// The GPT forward loss of the interpreter against an independent computation: plain loops in
// double precision written from the model's definition, sharing no code with the interpreter.
#include "ir/Verifier.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "app/Data.h"
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

using Vec = std::vector<double>;

/// Independent GPT-2-style forward pass over named parameters.
class ReferenceGPT {
public:
  ReferenceGPT(const ModelConfig &c, const std::map<std::string, Tensor> &params)
      : c_(c), params_(params) {}

  double loss(const std::vector<int32_t> &tokens, const std::vector<int32_t> &targets,
              int64_t batch) const {
    const int64_t T = c_.seqLen, D = c_.dModel, V = c_.vocab;
    double total = 0;
    for (int64_t b = 0; b < batch; ++b) {
      // x[t][i], the residual stream of one sequence.
      std::vector<Vec> x(T, Vec(D));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D; ++i)
          x[t][i] = p("wte")[tokens[b * T + t] * D + i] + p("wpe")[t * D + i];
      for (int64_t l = 0; l < c_.layers; ++l) {
        std::string h = "h" + std::to_string(l);
        attentionBlock(x, h);
        mlpBlock(x, h);
      }
      const std::string head = c_.tieEmbeddings ? "wte" : "lm_head.weight";
      for (int64_t t = 0; t < T; ++t) {
        Vec f = norm(x[t], "lnf");
        Vec logits(V);
        for (int64_t v = 0; v < V; ++v)
          for (int64_t i = 0; i < D; ++i)
            logits[v] += f[i] * p(head)[v * D + i];
        double max = *std::max_element(logits.begin(), logits.end()), sum = 0;
        for (double z : logits)
          sum += std::exp(z - max);
        total += max + std::log(sum) - logits[targets[b * T + t]];
      }
    }
    return total / double(batch * c_.seqLen);
  }

private:
  const float *p(const std::string &name) const { return params_.at(name).data.data(); }
  bool has(const std::string &name) const { return params_.count(name) != 0; }

  Vec norm(const Vec &x, const std::string &name) const {
    const int64_t D = x.size();
    Vec y(D);
    if (c_.norm == NormKind::LayerNorm) {
      double mean = 0, var = 0;
      for (double v : x)
        mean += v / D;
      for (double v : x)
        var += (v - mean) * (v - mean) / D;
      for (int64_t i = 0; i < D; ++i)
        y[i] = (x[i] - mean) / std::sqrt(var + c_.normEps) * p(name + ".weight")[i] +
               p(name + ".bias")[i];
    } else {
      double ms = 0;
      for (double v : x)
        ms += v * v / D;
      for (int64_t i = 0; i < D; ++i)
        y[i] = x[i] / std::sqrt(ms + c_.normEps) * p(name + ".weight")[i];
    }
    return y;
  }

  /// y = W x + b with W stored [out, in].
  Vec linear(const Vec &x, const std::string &name, int64_t out) const {
    const int64_t in = x.size();
    Vec y(out);
    for (int64_t o = 0; o < out; ++o) {
      double s = has(name + ".bias") ? p(name + ".bias")[o] : 0.0;
      for (int64_t i = 0; i < in; ++i)
        s += p(name + ".weight")[o * in + i] * x[i];
      y[o] = s;
    }
    return y;
  }

  void attentionBlock(std::vector<Vec> &x, const std::string &h) const {
    const int64_t T = c_.seqLen, D = c_.dModel, H = c_.heads, Dh = D / H;
    std::vector<Vec> qkv(T);
    for (int64_t t = 0; t < T; ++t)
      qkv[t] = linear(norm(x[t], h + ".ln1"), h + ".attn.qkv", 3 * D);
    std::vector<Vec> context(T, Vec(D));
    for (int64_t head = 0; head < H; ++head)
      for (int64_t t = 0; t < T; ++t) {
        Vec scores(t + 1);
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < Dh; ++i)
            dot += qkv[t][head * Dh + i] * qkv[s][D + head * Dh + i];
          scores[s] = dot / std::sqrt(double(Dh));
        }
        double max = *std::max_element(scores.begin(), scores.end()), sum = 0;
        for (double &sc : scores)
          sum += (sc = std::exp(sc - max));
        for (int64_t s = 0; s <= t; ++s)
          for (int64_t i = 0; i < Dh; ++i)
            context[t][head * Dh + i] += scores[s] / sum * qkv[s][2 * D + head * Dh + i];
      }
    for (int64_t t = 0; t < T; ++t) {
      Vec y = linear(context[t], h + ".attn.proj", D);
      for (int64_t i = 0; i < D; ++i)
        x[t][i] += y[i];
    }
  }

  void mlpBlock(std::vector<Vec> &x, const std::string &h) const {
    const int64_t D = c_.dModel, F = c_.ffn;
    for (Vec &row : x) {
      Vec n = norm(row, h + ".ln2");
      Vec act(F);
      if (c_.activation == ActivationKind::Gelu) {
        Vec u = linear(n, h + ".mlp.fc1", F);
        for (int64_t i = 0; i < F; ++i)
          act[i] = 0.5 * u[i] *
                   (1 + std::tanh(std::sqrt(2 / M_PI) * (u[i] + 0.044715 * std::pow(u[i], 3))));
      } else {
        Vec u = linear(n, h + ".mlp.fc1", 2 * F);
        for (int64_t i = 0; i < F; ++i)
          act[i] = u[i] / (1 + std::exp(-u[i])) * u[F + i];
      }
      Vec y = linear(act, h + ".mlp.fc2", D);
      for (int64_t i = 0; i < D; ++i)
        row[i] += y[i];
    }
  }

  const ModelConfig &c_;
  const std::map<std::string, Tensor> &params_;
};

/// Random-normal values for every parameter (not the init's ones/zeros), so that norm weights
/// and biases take part in the comparison.
std::map<std::string, Tensor> randomParams(const Graph &graph, uint64_t seed) {
  std::map<std::string, Tensor> params = initParams(graph, seed);
  uint64_t state = seed;
  for (auto &[name, t] : params)
    for (float &v : t.data) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      v += float(double(state >> 40) / double(1ull << 24) - 0.5) * 0.2f;
    }
  return params;
}

double interpreterLoss(const Graph &graph, const std::map<std::string, Tensor> &params,
                       const Batch &batch) {
  Interpreter interp(graph);
  EXPECT_FALSE(bool(interp.bindAll(params)));
  TensorType ids(DType::I32, {batch.batch, batch.seqLen});
  EXPECT_FALSE(bool(interp.bind("tokens", Tensor{ids, {}, batch.tokens})));
  EXPECT_FALSE(bool(interp.bind("targets", Tensor{ids, {}, batch.targets})));
  auto outputs = unwrap(interp.run());
  return outputs.empty() ? NAN : outputs[0].data[0];
}

void compareWithReference(const ModelConfig &config, uint64_t seed, bool randomize) {
  const int64_t batch = 4;
  auto graph = unwrap(buildGPT(config, batch));
  ASSERT_TRUE(graph);
  auto pipeline = unwrap(PassPipeline::create(forwardPipeline(), {}));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  auto params = randomize ? randomParams(*graph, seed) : initParams(*graph, seed);
  ArithmeticData data(config.vocab, config.seqLen, config.data, seed);
  Batch b = data.trainBatch(int64_t(seed % 1000), batch);
  double got = interpreterLoss(*graph, params, b);
  double want = ReferenceGPT(config, params).loss(b.tokens, b.targets, batch);
  EXPECT_NEAR(got, want, 1e-5 * want) << "seed " << seed;
}

TEST(ReferenceModel, TinyLossMatchesIndependentLoops) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  compareWithReference(config, freshSeed(), /*randomize=*/false);
}

TEST(ReferenceModel, TinyWithRandomNormsAndBiasesMatches) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  compareWithReference(config, freshSeed(), /*randomize=*/true);
}

TEST(ReferenceModel, RMSNormSwiGLUTiedNoBiasMatches) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  config.norm = NormKind::RMSNorm;
  config.activation = ActivationKind::SwiGLU;
  config.tieEmbeddings = true;
  config.bias = false;
  config.heads = 8;
  compareWithReference(config, freshSeed(), /*randomize=*/true);
}

TEST(ReferenceModel, RandomInitLossIsCloseToLnVocab) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(config, config.train.batch));
  ASSERT_TRUE(graph);
  uint64_t seed = freshSeed();
  ArithmeticData data(config.vocab, config.seqLen, config.data, seed);
  double loss = interpreterLoss(*graph, initParams(*graph, seed),
                                data.trainBatch(0, config.train.batch));
  EXPECT_NEAR(loss, std::log(double(config.vocab)), 0.05);
}

TEST(ReferenceModel, SameSeedSameLossBitForBit) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(config, 8));
  ASSERT_TRUE(graph);
  ArithmeticData data(config.vocab, config.seqLen, config.data, 7);
  double a = interpreterLoss(*graph, initParams(*graph, 7), data.trainBatch(3, 8));
  double b = interpreterLoss(*graph, initParams(*graph, 7), data.trainBatch(3, 8));
  double c = interpreterLoss(*graph, initParams(*graph, 8), data.trainBatch(3, 8));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

} // namespace
