// Fused and unfused programs on the CPU interpreter: the same loss, logits and gradients of
// every parameter, bit for bit, on fresh random inputs each run, with all fusions on and with
// each one off.
#include "tests/RandomWeights.h"
#include "backends/cpu/Pipeline.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <cstring>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

std::vector<std::string> without(const std::vector<std::string> &all, const std::string &name) {
  std::vector<std::string> rest;
  for (const std::string &p : all)
    if (p != name)
      rest.push_back(p);
  return rest;
}

/// The loss-and-gradients program (no optimizer) with the given fusions, and the passes
/// `lowering` after autodiff.
std::unique_ptr<Graph> gradientProgram(const ModelConfig &c, int64_t batch,
                                       const std::vector<std::string> &fusions,
                                       GPTOutput output = GPTOutput::Loss,
                                       const std::vector<std::string> &lowering = {}, int64_t length = 0) {
  auto graph = unwrap(buildGPT(c, batch, output, length));
  if (!graph)
    return nullptr;
  // assign-precision where the pipelines put it (a no-op for fp32).
  std::vector<std::string> passes{"cse"};
  if (llvm::is_contained(fusions, "fuse-attention"))
    passes.push_back("fuse-attention");
  passes.push_back("assign-precision");
  for (const std::string &f : fusions)
    if (f != "fuse-attention")
      passes.push_back(f);
  if (output == GPTOutput::Loss)
    passes.push_back("autodiff");
  passes.insert(passes.end(), lowering.begin(), lowering.end());
  passes.push_back("dce");
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = resolveRecipeForCpu(c.precision);
  auto pipeline = unwrap(PassPipeline::create(passes, options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// Random parameters (norm weights and biases too) and a random batch.
std::map<std::string, Tensor> randomInputs(const Graph &g, const ModelConfig &c, int64_t batch,
                                           uint64_t seed) {
  Rng rng(seed);
  std::map<std::string, Tensor> leaves = randomWeights(g, rng);
  for (const char *name : {"tokens", "targets"}) {
    Tensor t = Tensor::zeros(TensorType(DType::I32, {batch, c.seqLen}));
    for (int32_t &v : t.ints)
      v = int32_t(rng.below(c.vocab));
    leaves[name] = std::move(t);
  }
  return leaves;
}

std::map<std::string, Tensor> runNamed(const Graph &g, std::map<std::string, Tensor> leaves) {
  if (!g.lookup("targets"))
    leaves.erase("targets");
  Interpreter interp(g);
  EXPECT_FALSE(bool(interp.bindAll(leaves)));
  auto outputs = unwrap(interp.run());
  std::map<std::string, Tensor> named;
  for (size_t i = 0; i < outputs.size(); ++i)
    named[g.outputs()[i]->name()] = std::move(outputs[i]);
  return named;
}

/// Every output of both programs, by name, bit for bit: the fused kernels are composed from the
/// primitive ones in the unfused graph's order, so an ulp of difference is a bug (one that a
/// BF16 GEMM downstream would turn into a whole BF16 step on some inputs).
void expectSameOutputs(const std::map<std::string, Tensor> &fused,
                       const std::map<std::string, Tensor> &plain) {
  ASSERT_EQ(fused.size(), plain.size());
  for (const auto &[name, want] : plain) {
    auto it = fused.find(name);
    ASSERT_NE(it, fused.end()) << name;
    const Tensor &got = it->second;
    ASSERT_EQ(got.type, want.type) << name;
    size_t differing = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < want.data.size(); ++i) {
      if (std::memcmp(&got.data[i], &want.data[i], sizeof(float)) == 0)
        continue;
      if (differing++ == 0)
        first = i;
      worst = std::max(worst, double(std::abs(got.data[i] - want.data[i])));
    }
    EXPECT_EQ(differing, 0u) << name << ": " << differing << " elements differ, the first at "
                             << first << "; the largest difference is " << worst;
  }
}

void compareFusedWithPlain(const ModelConfig &c, int64_t batch,
                           const std::vector<std::string> &fusions,
                           const std::vector<std::string> &lowering = {}) {
  uint64_t seed = freshSeed();
  for (GPTOutput output : {GPTOutput::Loss, GPTOutput::Logits}) {
    auto plain = gradientProgram(c, batch, {}, output);
    auto fused = gradientProgram(c, batch, fusions, output, lowering);
    ASSERT_TRUE(plain && fused);
    auto leaves = randomInputs(*plain, c, batch, seed);
    expectSameOutputs(runNamed(*fused, leaves), runNamed(*plain, leaves));
  }
}

ModelConfig loadModel(const char *path) { return unwrap(loadModelConfig(sourcePath(path))); }

TEST(Fusion, TinyAllFusionsMatchUnfused) {
  compareFusedWithPlain(loadModel("models/tiny.yaml"), 4, fusionPasses());
}

TEST(Fusion, SeedAllFusionsMatchUnfused) {
  // The seed architecture at batch 2, so that the interpreter runs it in seconds.
  compareFusedWithPlain(loadModel("models/seed.yaml"), 2, fusionPasses());
}

TEST(Fusion, Bf16FusedMatchesBf16Unfused) {
  // Fused kernels round their GEMM operands to BF16 exactly where the unfused graph does.
  ModelConfig c = loadModel("models/tiny.yaml");
  c.precision.recipe = Recipe::Bf16;
  compareFusedWithPlain(c, 2, fusionPasses());
}

TEST(Fusion, RMSNormSwiGLUTiedNoBiasMatchesUnfused) {
  compareFusedWithPlain(loadModel("tests/models/tiny-variants.yaml"), 3, fusionPasses());
}



// What the GPU runs: the LayerNorm fusions' ops expanded into their norm and GEMM ops, the
// residual adds then fused into the norms and their gradients (with the bias gradients that sum
// a norm gradient's dx), a BF16 GELU's gradient into the
// product before it, the other bias gradients into the GELU's,
// the loss's gradient into the loss; the attention's gradient reads its forward's head-major q, k, v.
const std::vector<std::string> kGpuLowering = {"expand-layernorm-fused", "fuse-residual-norm", "fuse-norm-grad-add",
                                               "fuse-norm-bias-grad", "fuse-dgelu", "fuse-gelu-bias-grad", "fuse-cross-entropy-grad", "keep-attention-heads",
                                               "fuse-gelu-epilogue"};

// The Llama block (RoPE, two KV heads for four query heads, RMSNorm, SwiGLU): its attention is
// one attention op with kv_heads and rope_theta, bit for bit the unfused graph's, in fp32 and
// BF16, with the GPU's passes (the gradient reading the head-major copy) and without; and the
// same with one KV head (multi-query), and with learned positions (no rope_theta).
TEST(Fusion, LlamaBlockAttentionMatchesUnfused) {
  for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16})
    for (auto [kvHeads, rope] : {std::pair{2, 1}, std::pair{1, 1}, std::pair{2, 0}, std::pair{2, 2}}) {
      // rope 2: with Llama 3's scaling (its frequencies reach the attention op's table too)
      SCOPED_TRACE(fmt::format("{} KV heads, rope {}, recipe {}", kvHeads, rope, int(recipe)));
      ModelConfig c = loadModel("models/llama-tiny.yaml");
      c.precision.recipe = recipe;
      c.kvHeads = kvHeads;
      c.position = rope ? PositionKind::Rope : PositionKind::Learned;
      if (rope == 2)
        c.ropeScaling = RopeScaling{4.0, 1.0, 4.0, 64.0}; // (wavelengths of 1.6 to 6e3 positions: all three cases)
      c.seqLen = 12;
      auto fused = gradientProgram(c, 2, fusionPasses());
      ASSERT_TRUE(fused);
      int attentions = 0;
      for (const Op *op : fused->ops())
        if (op->kind() == OpKind::Attention) {
          ++attentions;
          EXPECT_EQ(op->attrs().getInt("kv_heads"), std::optional<int64_t>(kvHeads));
          EXPECT_EQ(op->attrs().getFloat("rope_theta").has_value(), rope != 0);
          EXPECT_EQ(op->attrs().getFloat("rope_factor"), rope == 2 ? std::optional<double>(4.0) : std::nullopt);
        }
      EXPECT_EQ(attentions, 2);
      EXPECT_EQ(countOps(*fused)["rope"], 0);
      compareFusedWithPlain(c, 2, fusionPasses());
      compareFusedWithPlain(c, 2, fusionPasses(), kGpuLowering);
    }
}

TEST(Fusion, GpuExpansionOfLayerNormFusionsMatchesUnfused) {
  compareFusedWithPlain(loadModel("models/tiny.yaml"), 2, fusionPasses(), kGpuLowering);
}

TEST(Fusion, GpuExpansionInBf16MatchesUnfused) {
  ModelConfig c = loadModel("models/tiny.yaml");
  c.precision.recipe = Recipe::Bf16;
  compareFusedWithPlain(c, 2, fusionPasses(), kGpuLowering);
  // 96 rows (past the few-row products): where no gradient keeps fc1's h (the forward alone),
  // fuse-gelu-epilogue gives fc1's product the GELU, its h unread.
  compareFusedWithPlain(c, 3, fusionPasses(), kGpuLowering);
  auto forward = gradientProgram(c, 3, fusionPasses(), GPTOutput::Logits, kGpuLowering);
  ASSERT_TRUE(forward);
  int epilogues = 0;
  for (const Op *op : forward->ops())
    epilogues += op->kind() == OpKind::MatMulBiasGelu && op->result(1)->users().empty();
  EXPECT_EQ(epilogues, c.layers);
  EXPECT_EQ(countOps(*forward)["gelu"], 0);
}

TEST(Fusion, GpuExpansionOfRMSNormSwiGLUTiedNoBiasMatchesUnfused) {
  compareFusedWithPlain(loadModel("tests/models/tiny-variants.yaml"), 3, fusionPasses(),
                        kGpuLowering);
}

TEST(Fusion, GpuExpansionWithRecomputeMatchesUnfused) {
  ModelConfig c = loadModel("tests/models/tiny-variants.yaml");
  c.train.recompute = true;
  compareFusedWithPlain(c, 3, fusionPasses(), kGpuLowering);
  c = loadModel("models/tiny.yaml");
  c.train.recompute = true;
  c.precision.recipe = Recipe::Bf16;
  compareFusedWithPlain(c, 2, fusionPasses(), kGpuLowering);
}

TEST(Fusion, GpuExpansionLeavesNoLayerNormFusedOp) {
  for (bool recompute : {false, true}) {
    ModelConfig c = loadModel("tests/models/tiny-variants.yaml");
    c.train.recompute = recompute;
    auto fused = gradientProgram(c, 2, fusionPasses());
    auto expanded = gradientProgram(c, 2, fusionPasses(), GPTOutput::Loss, kGpuLowering);
    ASSERT_TRUE(fused && expanded);
    OpCounts before = countOps(*fused), after = countOps(*expanded);
    EXPECT_GT(before["layer_norm_mlp"] + before["layer_norm_mlp_backward"], 0);
    EXPECT_GT(before["layer_norm_linear"] + before["layer_norm_linear_backward"], 0);
    for (const char *kind : {"layer_norm_linear", "layer_norm_mlp", "layer_norm_linear_backward",
                             "layer_norm_mlp_backward"})
      EXPECT_EQ(after[kind], 0) << kind;
    // One more norm per fused op; with recompute, per fused gradient too.
    int64_t gradients = before["layer_norm_mlp_backward"] + before["layer_norm_linear_backward"];
    EXPECT_EQ(after["rms_norm"] + after["residual_norm"],
              before["rms_norm"] + before["residual_norm"] + before["layer_norm_mlp"] +
                  before["layer_norm_linear"] + (recompute ? gradients : 0))
        << "recompute " << recompute;
    // Each fused gradient's norm gradient takes the residual gradient's add after it.
    EXPECT_EQ(after["rms_norm_backward"], gradients);
    EXPECT_LT(after["add"], before["add"]);
    // The loss returns its gradient.
    EXPECT_EQ(before["cross_entropy_backward"], 1);
    EXPECT_EQ(after["cross_entropy_backward"], 0);
  }
}

/// Two decode steps (the second reads the cache rows the first wrote) of the unfused program
/// and of the one with every fusion and the GPU's lowering passes, bit for bit: the cache ops
/// rotating the qkv they read (fuse-cache-rope), the attention
/// writing its caches (fuse-kv-write; under grouped heads too), the GEMVs normalising their rows
/// (fuse-residual-norm-gemv, which needs BF16 products of one row) and, past one row, fc1's
/// product applying the GELU (fuse-gemv-gelu).
void compareDecodeSteps(const ModelConfig &c, int64_t batch) {
  std::vector<std::string> lowering = kGpuLowering;
  lowering.insert(lowering.end(),
                  {"fuse-cache-rope", "fuse-kv-write", "fuse-residual-norm-gemv", "fuse-gemv-gelu", "unit-transposes"});
  auto plain = gradientProgram(c, batch, {}, GPTOutput::Decode);
  auto fused = gradientProgram(c, batch, fusionPasses(), GPTOutput::Decode, lowering);
  ASSERT_TRUE(plain && fused);
  OpCounts counts = countOps(*fused);
  // RoPE's ops (three slices, four transposes, two ropes and a concat a layer) are the cache
  // ops' own rotations.
  for (const char *kind : {"transpose", "rope", "slice", "concat"})
    EXPECT_EQ(counts[kind], 0) << kind;
  if (c.position == PositionKind::Rope) {
    EXPECT_EQ(countOps(*plain)["transpose"], 4 * c.layers);
    EXPECT_EQ(countOps(*plain)["rope"], 2 * c.layers);
  }
  EXPECT_EQ(counts["kv_write"], 0); // every attention writes its caches, grouped or not
  EXPECT_EQ(counts["decode_attention"], c.layers);
  bool bf16 = c.precision.recipe == Recipe::Bf16;
  if (bf16 && batch == 1) {
    EXPECT_GE(counts["residual_norm_linear"], 2 * c.layers); // qkv and fc1 (the head's too where small)
    EXPECT_EQ(counts["swiglu"], 0);                           // fc1's GEMV applies it
  } else {
    EXPECT_EQ(counts["residual_norm_linear"], 0);
  }
  // fc1 with its GELU: cuBLASLt's epilogue in fp32, fuse-gemv-gelu's past one row in BF16 (at
  // one, residual_norm_linear's).
  bool geluWithBias = c.activation == ActivationKind::Gelu && c.bias;
  EXPECT_EQ(counts["matmul_bias_gelu"], geluWithBias && (!bf16 || batch > 1) ? c.layers : 0);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = randomWeights(*plain, rng);
  Interpreter a(*plain), b(*fused);
  ASSERT_FALSE(bool(a.bindAll(leaves)));
  ASSERT_FALSE(bool(b.bindAll(leaves)));
  std::vector<int32_t> positions(batch);
  for (int64_t i = 0; i < batch; ++i)
    positions[i] = int32_t(rng.below(c.seqLen - 1));
  for (int step = 0; step < 2; ++step) {
    std::map<std::string, Tensor> feed;
    for (const char *name : {"tokens", "positions"})
      feed[name] = Tensor::zeros(TensorType(DType::I32, {batch, 1}));
    for (int64_t i = 0; i < batch; ++i) {
      feed["tokens"].ints[i] = int32_t(rng.below(c.vocab));
      feed["positions"].ints[i] = positions[i] + step;
    }
    ASSERT_FALSE(bool(a.bindAll(feed)));
    ASSERT_FALSE(bool(b.bindAll(feed)));
    auto want = unwrap(a.run()), got = unwrap(b.run());
    std::map<std::string, Tensor> wantNamed, gotNamed;
    for (size_t i = 0; i < want.size(); ++i)
      wantNamed[plain->outputs()[i]->name()] = std::move(want[i]);
    for (size_t i = 0; i < got.size(); ++i)
      gotNamed[fused->outputs()[i]->name()] = std::move(got[i]);
    SCOPED_TRACE("step " + std::to_string(step));
    expectSameOutputs(gotNamed, wantNamed);
    EXPECT_EQ(gotNamed["next"].ints, wantNamed["next"].ints);
  }
}

TEST(Fusion, GpuDecodeStepMatchesUnfused) {
  for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16}) {
    // (The last: llama-tiny multi-head, so that its attention writes the caches and rotates the
    // key it writes, with Llama 3's RoPE scaling.)
    for (int model = 0; model < 4; ++model) {
      const char *paths[] = {"models/tiny.yaml", "tests/models/tiny-variants.yaml", "models/llama-tiny.yaml",
                             "models/llama-tiny.yaml"};
      SCOPED_TRACE(paths[model] + std::string(model == 3 ? ", multi-head, RoPE scaled" : ""));
      ModelConfig c = loadModel(paths[model]);
      if (model == 3) {
        c.kvHeads = c.heads;
        c.ropeScaling = RopeScaling{8.0, 1.0, 4.0, 8.0};
      }
      c.precision.recipe = recipe;
      for (int64_t batch : {1, 3, 12}) {
        SCOPED_TRACE("batch " + std::to_string(batch));
        compareDecodeSteps(c, batch);
      }
    }
  }
}

/// A prompt of 5 positions through llama-tiny (grouped heads, and every head its own KV head),
/// unfused and with every fusion and the GPU's lowering passes, bit for bit: its logits and the
/// caches it writes, where the attention and kv_write rotate the qkv they read (fuse-cache-rope),
/// and the last layer after its attention runs on each sequence's last row alone
/// (prune-last-rows: its operands from before gathered at %last_rows).
TEST(Fusion, GpuPromptMatchesUnfused) {
  std::vector<std::string> lowering = kGpuLowering;
  lowering.insert(lowering.end(), {"fuse-cache-rope", "fuse-kv-write", "unit-transposes", "prune-last-rows"});
  for (int64_t kvHeads : {0, 2}) {
    SCOPED_TRACE("kv_heads " + std::to_string(kvHeads));
    ModelConfig c = loadModel("models/llama-tiny.yaml");
    c.kvHeads = kvHeads;
    c.precision.recipe = Recipe::Bf16;
    const int64_t batch = 3, length = 5;
    auto plain = gradientProgram(c, batch, {}, GPTOutput::Prefill, {}, length);
    auto fused = gradientProgram(c, batch, fusionPasses(), GPTOutput::Prefill, lowering, length);
    ASSERT_TRUE(plain && fused);
    OpCounts counts = countOps(*fused);
    EXPECT_EQ(counts["rope"], 0);
    EXPECT_EQ(counts["attention"], c.layers);
    // The attention's and the residual's rows gathered in place of the layer's output's.
    EXPECT_EQ(countOps(*plain)["embedding"] + 1, counts["embedding"]);
    for (const Op *op : fused->ops()) // the last layer's products after its attention: a row a sequence
      if (op->kind() == OpKind::MatMul && llvm::StringRef(op->result()->name()).starts_with("h1.") &&
          !llvm::StringRef(op->result()->name()).contains("attn.q")) {
        EXPECT_EQ(op->operand(0)->type().numElements() / op->operand(0)->type().dim(-1), batch) << op->result()->name();
      }
    Rng rng(freshSeed());
    std::map<std::string, Tensor> leaves = randomWeights(*plain, rng);
    leaves["tokens"] = Tensor::zeros(TensorType(DType::I32, {batch, length}));
    leaves["last_rows"] = Tensor::zeros(TensorType(DType::I32, {batch, 1}));
    for (int64_t i = 0; i < batch * length; ++i)
      leaves["tokens"].ints[i] = int32_t(rng.below(c.vocab));
    for (int64_t b = 0; b < batch; ++b)
      leaves["last_rows"].ints[b] = int32_t(b * length + rng.below(length));
    Interpreter a(*plain), f(*fused);
    ASSERT_FALSE(bool(a.bindAll(leaves)));
    ASSERT_FALSE(bool(f.bindAll(leaves)));
    auto want = unwrap(a.run()), got = unwrap(f.run());
    ASSERT_EQ(want.size(), got.size());
    std::map<std::string, Tensor> wantNamed, gotNamed;
    for (size_t i = 0; i < want.size(); ++i) {
      wantNamed[plain->outputs()[i]->name()] = std::move(want[i]);
      gotNamed[fused->outputs()[i]->name()] = std::move(got[i]);
    }
    for (const char *cache : {"h0.attn.k_cache", "h1.attn.k_cache", "h1.attn.v_cache"}) {
      wantNamed[cache] = unwrap(a.read(cache));
      gotNamed[cache] = unwrap(f.read(cache));
    }
    expectSameOutputs(gotNamed, wantNamed);
  }
}

class FusionDisabled : public testing::TestWithParam<std::string> {};

TEST_P(FusionDisabled, EachFusionOffStillMatchesUnfused) {
  compareFusedWithPlain(loadModel("models/tiny.yaml"), 2, without(fusionPasses(), GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Fusions, FusionDisabled, testing::ValuesIn(fusionPasses()),
                         [](const testing::TestParamInfo<std::string> &info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Fusion, EachFusionAloneMatchesUnfused) {
  // Alone, residual-norm and bias-activation find the norms and GELUs that the larger
  // fusions otherwise take.
  for (const std::string &fusion : fusionPasses()) {
    SCOPED_TRACE(fusion);
    compareFusedWithPlain(loadModel("models/tiny.yaml"), 2, {fusion});
  }
}

int64_t computeOps(const Graph &g) {
  int64_t n = 0;
  for (const Op *op : g.ops())
    n += !isLeaf(op->kind()) && !hasSideEffects(op->kind());
  return n;
}

TEST(Fusion, SeedTrainingProgramHasFarFewerOps) {
  // Forward, loss and backward; the optimizer after them is the same with or without fusion.
  ModelConfig c = loadModel("models/seed.yaml");
  auto fused = gradientProgram(c, c.train.batch, fusionPasses());
  auto plain = gradientProgram(c, c.train.batch, {});
  ASSERT_TRUE(fused && plain);
  EXPECT_LT(computeOps(*fused) * 3, computeOps(*plain))
      << computeOps(*fused) << " vs " << computeOps(*plain);
}

} // namespace
