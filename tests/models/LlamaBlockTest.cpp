// The Llama block's pieces on the CPU reference: RoPE's rotation, and grouped-query attention
// as multi-head attention whose key and value heads are repeated (Llama's repeat_kv).
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "ir/Parser.h"
#include "ir/Rope.h"
#include "models/GPTBuilder.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

std::vector<Tensor> runGraph(const Graph &graph, const std::map<std::string, Tensor> &leaves) {
  Interpreter interp(graph);
  EXPECT_FALSE(bool(interp.bindAll(leaves)));
  return unwrap(interp.run());
}

TEST(Rope, RotatesEachPairByItsPositionsAngleAndTheInverseUndoesIt) {
  // x [2, 3, 4]: three positions, head dimension 4, pairs (0, 2) and (1, 3) at frequencies
  // theta^0 = 1 and theta^(-1/2) = 0.1 (theta 100): position t turns them by t and 0.1 t.
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[2,3,4]\n"
                                 "%y = rope(%x) {theta=100.0} : f32[2,3,4]\n"
                                 "%back = rope(%y) {inverse=true, theta=100.0} : f32[2,3,4]\n"
                                 "return %y, %back\n",
                                 "rope.ir"));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  Tensor x = Tensor::zeros(TensorType(DType::F32, {2, 3, 4}));
  for (float &v : x.data)
    v = float(rng.normal());
  std::vector<Tensor> out = runGraph(*graph, {{"x", x}});
  ASSERT_EQ(out.size(), 2u);
  for (int64_t r = 0; r < 6; ++r) {
    int64_t t = r % 3;
    for (int64_t i = 0; i < 2; ++i) {
      double angle = double(t) * (i == 0 ? 1.0 : 0.1);
      double a = x.data[r * 4 + i], b = x.data[r * 4 + i + 2];
      EXPECT_NEAR(out[0].data[r * 4 + i], a * std::cos(angle) - b * std::sin(angle), 1e-6) << r << " " << i;
      EXPECT_NEAR(out[0].data[r * 4 + i + 2], b * std::cos(angle) + a * std::sin(angle), 1e-6) << r << " " << i;
    }
  }
  for (int64_t i = 0; i < 4; ++i) // position 0 is not turned at all
    EXPECT_EQ(out[0].data[i], x.data[i]);
  for (size_t i = 0; i < x.data.size(); ++i)
    EXPECT_NEAR(out[1].data[i], x.data[i], 1e-6);
}

TEST(Rope, Llama3ScalingSlowsTheLowFrequenciesAndKeepsTheHighOnes) {
  // Llama-3.2-1B's: theta 500000, head dimension 64, factor 32, low 1, high 4, 8192 positions.
  // Pairs whose wavelength 2 pi / f is under 8192 / 4 = 2048 keep theta^(-2i/64); over 8192 / 1
  // they turn 32 times slower; between, the blend (Hugging Face's _compute_llama3_parameters).
  RopeOptions plain{500000.0, false, std::nullopt}, scaled{500000.0, false, RopeScaling{32.0, 1.0, 4.0, 8192.0}};
  int between = 0;
  for (int64_t i = 0; i < 32; ++i) {
    double f = ropeFrequency(plain, i, 64), g = ropeFrequency(scaled, i, 64), wavelength = 2 * M_PI / f;
    EXPECT_EQ(f, std::pow(500000.0, -2.0 * double(i) / 64.0));
    if (wavelength < 2048) {
      EXPECT_EQ(g, f) << i;
    } else if (wavelength > 8192) {
      EXPECT_DOUBLE_EQ(g, f / 32) << i;
    } else {
      ++between;
      double smooth = (8192 / wavelength - 1) / 3;
      EXPECT_DOUBLE_EQ(g, (1 - smooth) * f / 32 + smooth * f) << i;
      EXPECT_LT(g, f);
      EXPECT_GT(g, f / 32);
    }
  }
  EXPECT_GT(between, 0);
  EXPECT_EQ(ropeFrequency(scaled, 31, 64), std::pow(500000.0, -62.0 / 64.0) / 32);
  // The table: position 100's angle of the last pair is 100 f / 32.
  std::vector<float> table = ropeTable(scaled, 128, 64);
  EXPECT_EQ(table[size_t(100 * 32 + 31)], float(std::cos(100.0 * std::pow(500000.0, -62.0 / 64.0) / 32)));
}

/// The model with `kvHeads` key and value heads, RoPE on.
ModelConfig llamaShaped(int64_t kvHeads) {
  ModelConfig c;
  c.name = "gqa";
  c.vocab = 13;
  c.seqLen = 8;
  c.dModel = 16;
  c.heads = 4;
  c.layers = 2;
  c.ffn = 24;
  c.norm = NormKind::RMSNorm;
  c.activation = ActivationKind::SwiGLU;
  c.bias = false;
  c.position = PositionKind::Rope;
  c.kvHeads = kvHeads;
  return c;
}

TEST(GroupedQueryAttention, IsMultiHeadAttentionWithEachKeyValueHeadRepeated) {
  // Two KV heads for four query heads: query heads 0 and 1 read KV head 0, heads 2 and 3 KV
  // head 1. The same model with four KV heads whose keys and values are those rows repeated
  // so gives the same loss.
  ModelConfig grouped = llamaShaped(2), full = llamaShaped(4);
  auto g = unwrap(buildGPT(grouped, 2, GPTOutput::Loss)), f = unwrap(buildGPT(full, 2, GPTOutput::Loss));
  ASSERT_TRUE(g && f);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = initParams(*g, rng.next()), wide = leaves;
  const int64_t D = 16, Dh = 4, KV = 2, G = 2;
  for (int64_t l = 0; l < 2; ++l) {
    std::string name = "h" + std::to_string(l) + ".attn.qkv.weight";
    const Tensor &w = leaves.at(name); // [D + 2 KV Dh, D]
    ASSERT_EQ(w.type.dim(0), D + 2 * KV * Dh);
    Tensor repeated = Tensor::zeros(TensorType(DType::F32, {3 * D, D}));
    auto copyRow = [&](int64_t from, int64_t to) {
      std::copy_n(w.data.begin() + from * D, D, repeated.data.begin() + to * D);
    };
    for (int64_t row = 0; row < D; ++row) // the queries as they are
      copyRow(row, row);
    for (int64_t part = 0; part < 2; ++part) // keys, then values: query head h gets KV head h / G
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t j = 0; j < Dh; ++j)
          copyRow(D + part * KV * Dh + (h / G) * Dh + j, D + part * D + h * Dh + j);
    wide[name] = std::move(repeated);
  }
  Tensor tokens = Tensor::zeros(TensorType(DType::I32, {2, 8})), targets = tokens;
  for (int32_t &v : tokens.ints)
    v = int32_t(rng.below(13));
  for (int32_t &v : targets.ints)
    v = int32_t(rng.below(13));
  for (auto *m : {&leaves, &wide}) {
    (*m)["tokens"] = tokens;
    (*m)["targets"] = targets;
  }
  double groupedLoss = runGraph(*g, leaves).at(0).data[0], fullLoss = runGraph(*f, wide).at(0).data[0];
  EXPECT_NEAR(groupedLoss, fullLoss, 1e-6 * std::fabs(fullLoss));
  // And it is not the loss of pairing the heads the other way (h % KV): the test can fail.
  std::map<std::string, Tensor> strided = wide;
  for (int64_t l = 0; l < 2; ++l) {
    std::string name = "h" + std::to_string(l) + ".attn.qkv.weight";
    const Tensor &w = leaves.at(name);
    Tensor &t = strided[name];
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t h = 0; h < 4; ++h)
        std::copy_n(w.data.begin() + (D + part * KV * Dh + (h % KV) * Dh) * D, Dh * D,
                    t.data.begin() + (D + part * D + h * Dh) * D);
  }
  EXPECT_GT(std::fabs(runGraph(*f, strided).at(0).data[0] - groupedLoss), 1e-5);
}

} // namespace

namespace {

TEST(GroupedQueryAttention, TheKvCacheHoldsTheKeyValueHeadsOnly) {
  // A decode step's caches are [B, T, kv_heads x head_dim]: with one KV head for four query
  // heads, a quarter of multi-head attention's; its rope turns q and k at the step's positions.
  for (int64_t kv : {1, 2, 4}) {
    auto decode = unwrap(buildGPT(llamaShaped(kv), 3, GPTOutput::Decode));
    ASSERT_TRUE(decode);
    int caches = 0, ropes = 0;
    for (const Op *op : decode->ops()) {
      ropes += op->kind() == OpKind::Rope && op->numOperands() == 2 && op->operand(1)->name() == "positions";
      if (op->kind() != OpKind::State)
        continue;
      ++caches;
      EXPECT_EQ(op->result()->type(), TensorType(DType::F32, {3, 8, kv * 4})) << op->result()->name();
    }
    EXPECT_EQ(caches, 2 * 2); // keys and values, two layers
    EXPECT_EQ(ropes, 2 * 2);  // q and k, two layers
  }
}

} // namespace
