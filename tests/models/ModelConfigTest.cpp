// Model descriptions: the standard models load, and bad files get one line naming the place.
#include "models/GPTBuilder.h"
#include "models/ModelConfig.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

TEST(ModelConfig, StandardModelsMatchTheDesignTable) {
  struct Row {
    const char *name;
    int64_t vocab, seq, d, heads, layers, ffn, batch;
  };
  for (const Row &r : {Row{"tiny", 64, 32, 64, 4, 2, 256, 16},
                       Row{"seed", 1024, 128, 512, 8, 4, 2048, 32},
                       Row{"gpt2-124m", 50304, 1024, 768, 12, 12, 3072, 16},
                       Row{"gpt2-350m", 50304, 1024, 1024, 16, 24, 4096, 16},
                       Row{"gpt-1.3b", 50304, 1024, 2048, 16, 24, 8192, 16}}) {
    SCOPED_TRACE(r.name);
    auto c = unwrap(loadModelConfig(sourcePath(std::string("models/") + r.name + ".yaml")));
    EXPECT_EQ(c.name, r.name);
    EXPECT_EQ(c.vocab, r.vocab);
    EXPECT_EQ(c.seqLen, r.seq);
    EXPECT_EQ(c.dModel, r.d);
    EXPECT_EQ(c.heads, r.heads);
    EXPECT_EQ(c.layers, r.layers);
    EXPECT_EQ(c.ffn, r.ffn);
    EXPECT_EQ(c.train.batch, r.batch);
  }
}

TEST(ModelConfig, ParameterCountMatchesGPT2Small) {
  // GPT-2 small with the vocab padded to 50304 and tied embeddings: 124,475,904 parameters
  // (llm.c prints this number for the padded model).
  auto c = unwrap(loadModelConfig(sourcePath("models/gpt2-124m.yaml")));
  EXPECT_EQ(c.numParams(), 124475904);
}

TEST(ModelConfig, ReadsEveryField) {
  auto c = unwrap(parseModelConfig(R"(name: custom
model: {vocab: 100, seq_len: 16, d_model: 48, heads: 6, layers: 3, ffn: 96, norm: rmsnorm,
        activation: swiglu, bias: false, tie_embeddings: true, norm_eps: 1.0e-6}
train: {batch: 4, lr: 0.01, steps: 7, warmup: 2, weight_decay: 0.0, beta1: 0.8, beta2: 0.9,
        eps: 1.0e-7, grad_clip: 0.5, recompute: true, seed: 18446744073709551615}
data: {min_step: 2, max_step: 5}
precision: {recipe: fp8, fp8_format: e4m3, margin: 1, amax_history_len: 32,
            amax_compute_algo: most_recent, fp8_scaling: current, fp8_layers: ["h*.mlp.*", h0.attn.qkv]}
)",
                                   "custom.yaml"));
  EXPECT_EQ(c.name, "custom");
  EXPECT_EQ(c.norm, NormKind::RMSNorm);
  EXPECT_EQ(c.activation, ActivationKind::SwiGLU);
  EXPECT_FALSE(c.bias);
  EXPECT_TRUE(c.tieEmbeddings);
  EXPECT_EQ(c.normEps, 1e-6);
  EXPECT_EQ(c.train.batch, 4);
  EXPECT_EQ(c.train.lr, 0.01);
  EXPECT_EQ(c.train.gradClip, 0.5);
  EXPECT_TRUE(c.train.recompute);
  EXPECT_EQ(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).train.recompute, true);
  EXPECT_EQ(c.train.seed, 18446744073709551615ULL);
  EXPECT_EQ(c.data.minStep, 2);
  EXPECT_EQ(c.data.maxStep, 5);
  EXPECT_EQ(c.precision.recipe, Recipe::Fp8);
  EXPECT_EQ(c.precision.fp8Format, Fp8Formats::E4M3);
  EXPECT_EQ(c.precision.margin, 1);
  EXPECT_EQ(c.precision.amaxHistoryLen, 32);
  EXPECT_EQ(c.precision.amaxComputeAlgo, "most_recent");
  EXPECT_EQ(c.precision.fp8Scaling, Fp8Scaling::Current);
  EXPECT_EQ(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Scaling, Fp8Scaling::Current);
  c.precision.fp8Scaling = Fp8Scaling::Mixed;
  EXPECT_EQ(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Scaling, Fp8Scaling::Mixed);
  c.precision.fp8Scaling = Fp8Scaling::Block;
  EXPECT_EQ(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Scaling, Fp8Scaling::Block);
  EXPECT_EQ(c.headDim(), 8);
  ASSERT_TRUE(c.precision.fp8Layers);
  EXPECT_EQ(*c.precision.fp8Layers, (std::vector<std::string>{"h*.mlp.*", "h0.attn.qkv"}));
  EXPECT_EQ(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Layers, c.precision.fp8Layers);
  // Absent: every legal layer; [] (none) is another thing, and reads back as such.
  c.precision.fp8Layers.reset();
  EXPECT_FALSE(unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Layers);
  c.precision.fp8Layers.emplace();
  auto none = unwrap(parseModelConfig(formatModelConfig(c), "again.yaml")).precision.fp8Layers;
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
}

struct BadModel {
  const char *what;
  const char *text;
  const char *message;
  const char *where; // "line:col", or "" for errors about the whole file
};

class ModelConfigErrors : public testing::TestWithParam<BadModel> {};

TEST_P(ModelConfigErrors, NameThePlaceAndTheProblem) {
  const BadModel &c = GetParam();
  std::string message = errorOf(parseModelConfig(c.text, "m.yaml"));
  std::string prefix = std::string("m.yaml:") + c.where + (*c.where ? ": " : "") + "error: ";
  if (!*c.where)
    prefix = "m.yaml: error: ";
  EXPECT_EQ(message.find(prefix), 0u) << message;
  EXPECT_NE(message.find(c.message), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
}

#define MODEL(body) "name: m\nmodel:\n" body
#define GOOD "  vocab: 64\n  seq_len: 8\n  d_model: 16\n  heads: 2\n  layers: 1\n  ffn: 32\n"

INSTANTIATE_TEST_SUITE_P(
    Models, ModelConfigErrors,
    testing::Values(
        BadModel{"empty", "", "empty model description", "1:1"},
        BadModel{"heads", MODEL("  vocab: 64\n  seq_len: 8\n  d_model: 512\n  heads: 6\n  layers: 1\n  ffn: 32\n"),
                 "heads (6) does not divide d_model (512)", "6:10"},
        BadModel{"negative", MODEL("  vocab: 64\n  seq_len: -8\n  d_model: 16\n  heads: 2\n  layers: 1\n  ffn: 32\n"),
                 "seq_len (-8) must be between 2 and 65536", "4:12"},
        BadModel{"absurd", MODEL("  vocab: 64\n  seq_len: 8\n  d_model: 16\n  heads: 2\n  layers: 1\n  ffn: 999999999999999999999\n"),
                 "ffn (999999999999999999999) must be between 1 and 1048576", "8:8"},
        BadModel{"not a number", MODEL("  vocab: many\n  seq_len: 8\n  d_model: 16\n  heads: 2\n  layers: 1\n  ffn: 32\n"),
                 "vocab must be an integer, got 'many'", "3:10"},
        BadModel{"missing key", MODEL("  vocab: 64\n  seq_len: 8\n  d_model: 16\n  layers: 1\n  ffn: 32\n"),
                 "missing required key 'heads' in 'model'", "3:3"},
        BadModel{"unknown key", MODEL(GOOD "  hedas: 2\n"), "unknown key 'hedas' in 'model'", "9:3"},
        BadModel{"duplicate key", MODEL(GOOD "  vocab: 32\n"), "key 'vocab' appears twice", "9:3"},
        BadModel{"bad choice", MODEL(GOOD "  norm: batchnorm\n"),
                 "norm must be one of layernorm | rmsnorm, got 'batchnorm'", "9:9"},
        BadModel{"bad recipe", MODEL(GOOD) "precision:\n  recipe: fp4\n",
                 "recipe must be one of auto | fp32 | bf16 | fp8, got 'fp4'", "10:11"},
        BadModel{"bad lr", MODEL(GOOD) "train:\n  lr: -1\n", "lr (-1) must be between 1e-12 and 10", "10:7"},
        BadModel{"bad recompute", MODEL(GOOD) "train:\n  recompute: some\n", "recompute must be true or false, got 'some'",
                 "10:14"},
        BadModel{"layers and auto", MODEL(GOOD) "train:\n  recompute: auto\n  recompute_layers: 2\n",
                 "recompute_layers chooses the layers, recompute: auto chooses them", "11:21"},
        BadModel{"budget without auto", MODEL(GOOD) "train:\n  memory_budget: 40\n",
                 "memory_budget is recompute: auto's budget", "10:18"},
        BadModel{"fp8_min_dim past the largest dimension", MODEL(GOOD) "precision:\n  fp8_min_dim: 2147483648\n",
                 "fp8_min_dim (2147483648) must be between 0 and 2147483647", "10:16"},
        BadModel{"fp8_layers not a glob", MODEL(GOOD) "precision:\n  fp8_layers: [\"h[0.*\"]\n",
                 "'h[0.*' in fp8_layers is not a glob pattern", "10:16"},
        BadModel{"keep_bf16 a name with a space", MODEL(GOOD) "precision:\n  keep_bf16: [\"lm head\"]\n",
                 "'lm head' in keep_bf16 holds a space or a control character", "10:15"},
        BadModel{"fp8_layers a name across lines", MODEL(GOOD) "precision:\n  fp8_layers: [h0.*\n h1.*]\n",
                 "'h0.*' in fp8_layers holds a space or a control character", "10:16"},
        BadModel{"fp8_layers not a list", MODEL(GOOD) "precision:\n  fp8_layers: h0.*\n",
                 "fp8_layers must be a list", "10:15"},
        BadModel{"bad steps range", MODEL(GOOD) "data:\n  min_step: 5\n  max_step: 2\n",
                 "max_step (2) is below min_step (5)", "11:13"},
        BadModel{"no model", "name: m\n", "missing required section 'model'", "1:1"},
        BadModel{"not a mapping", "just a string\n", "must be a mapping", "1:1"},
        BadModel{"truncated", "name: m\nmodel:\n  vocab: 64\n  seq_len: [8,\n", "", "4:15"},
        BadModel{"binary garbage", "\x7f" "ELF\x02\x01\x01\x00\x00\x00\xff\xfe", "", "1:1"},
        BadModel{"too many parameters",
                 MODEL("  vocab: 1048576\n  seq_len: 8\n  d_model: 65536\n  heads: 2\n  layers: 1024\n  ffn: 1048576\n"),
                 "parameters, more than the limit", ""},
        BadModel{"two documents", MODEL(GOOD) "---\nname: other\n", "only one YAML document", ""},
        BadModel{"kv_heads not dividing heads", MODEL(GOOD "  kv_heads: 3\n"), "kv_heads (3) must divide heads (2)", "9:13"},
        BadModel{"no kv head", MODEL(GOOD "  kv_heads: 0\n"), "kv_heads (0) must be between 1 and 1024", "9:13"},
        BadModel{"rope_theta without rope", MODEL(GOOD "  rope_theta: 500000\n"),
                 "rope_theta belongs to position: rope", "9:15"},
        BadModel{"rope scaling of another kind", MODEL(GOOD "  position: rope\n  rope_scaling: yarn\n"),
                 "rope_scaling must be one of llama3, got 'yarn'", "10:17"},
        BadModel{"rope scaling as a mapping", MODEL(GOOD "  position: rope\n  rope_scaling: {factor: 8}\n"),
                 "'rope_scaling' must be a single value", "10:18"},
        BadModel{"rope scaling without rope", MODEL(GOOD "  rope_scaling: llama3\n"),
                 "rope_scaling belongs to position: rope", "9:17"},
        BadModel{"a rope factor alone", MODEL(GOOD "  position: rope\n  rope_factor: 8\n"),
                 "rope_factor belongs to rope_scaling: llama3", "10:16"},
        BadModel{"rope frequency factors the wrong way",
                 MODEL(GOOD "  position: rope\n  rope_scaling: llama3\n  rope_low_freq_factor: 4\n"
                            "  rope_high_freq_factor: 1\n"),
                 "rope_high_freq_factor (1) must exceed rope_low_freq_factor (4)", "12:26"},
        BadModel{"rope of an odd head dimension",
                 MODEL("  vocab: 64\n  seq_len: 8\n  d_model: 18\n  heads: 2\n  layers: 1\n  ffn: 32\n  position: rope\n"),
                 "position: rope needs an even head dimension; d_model / heads is 9", "9:13"},
        BadModel{"unknown position", MODEL(GOOD "  position: absolute\n"),
                 "position must be one of learned | rope, got 'absolute'", "9:13"},
        BadModel{"rope_theta at 1", MODEL(GOOD "  position: rope\n  rope_theta: 1\n"),
                 "rope_theta (1) must be between 1.0001 and 1000000000", "10:15"}));

TEST(ModelConfig, ALlamaBlockHasRopeAndFewerKeyValueHeads) {
  // llama-tiny: rotary positions (no wpe), two KV heads for four query heads, so the qkv
  // projection is 64 + 2 * 2 * 16 wide; the count of parameters is the builder's.
  auto c = unwrap(loadModelConfig(sourcePath("models/llama-tiny.yaml")));
  EXPECT_EQ(c.position, PositionKind::Rope);
  EXPECT_EQ(c.ropeTheta, 10000.0);
  EXPECT_EQ(c.kvHeads, 2);
  EXPECT_EQ(c.qkvWidth(), 128);
  auto graph = unwrap(buildGPT(c, 2, GPTOutput::Loss));
  int64_t params = 0;
  for (const Op *op : graph->ops())
    if (op->kind() == OpKind::Param)
      params += op->result()->type().numElements();
  EXPECT_EQ(c.numParams(), params);
  EXPECT_EQ(graph->lookup("wpe"), nullptr);
  // Without kv_heads, every head has its own (and the description says so when written back).
  auto gpt = unwrap(parseModelConfig(MODEL(GOOD), "m.yaml"));
  EXPECT_EQ(gpt.kvHeads, 0);
  EXPECT_EQ(gpt.kvHeadCount(), 2);
  EXPECT_EQ(gpt.position, PositionKind::Learned);
  for (const ModelConfig &config : {c, gpt}) {
    std::string text = formatModelConfig(config);
    EXPECT_EQ(formatModelConfig(unwrap(parseModelConfig(text, "again.yaml"))), text);
  }
}

TEST(ModelConfig, Llama3RopeScalingReadsAndWritesBack) {
  // Llama-3.2-1B's file: rope_scaling llama3 with Hugging Face's numbers; written back and read
  // again the same.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/llama-3.2-1b.yaml")));
  ASSERT_TRUE(c.ropeScaling.has_value());
  EXPECT_EQ(*c.ropeScaling, (RopeScaling{32.0, 1.0, 4.0, 8192.0}));
  std::string text = formatModelConfig(c);
  EXPECT_NE(text.find("rope_scaling: llama3"), std::string::npos) << text;
  ModelConfig again = unwrap(parseModelConfig(text, "again.yaml"));
  EXPECT_EQ(formatModelConfig(again), text);
  // Left out, the numbers are Llama 3.2's.
  auto defaults = unwrap(parseModelConfig(MODEL(GOOD "  position: rope\n  rope_scaling: llama3\n"), "m.yaml"));
  EXPECT_EQ(*defaults.ropeScaling, (RopeScaling{32.0, 1.0, 4.0, 8192.0}));
}

TEST(ModelConfig, TheLlamaShapedModelFilesHaveTheirCheckpointsParameterCounts) {
  // TinyLlama-1.1B, Llama-3.2-1B and Llama-2-7B as their Hugging Face checkpoints count them (the
  // tied head once): the shapes of every tensor, the KV heads' narrower k and v projections
  // included.
  struct Expected {
    const char *file;
    int64_t params, cacheRow; // and a KV cache row: kv_heads x head_dim
  };
  for (Expected e : {Expected{"models/tinyllama.yaml", 1100048384, 4 * 64},
                     Expected{"models/llama-3.2-1b.yaml", 1235814400, 8 * 64},
                     Expected{"models/llama-7b.yaml", 6738415616, 32 * 128}}) {
    ModelConfig c = unwrap(loadModelConfig(sourcePath(e.file)));
    EXPECT_EQ(c.numParams(), e.params) << e.file;
    EXPECT_EQ(c.kvHeadCount() * c.headDim(), e.cacheRow) << e.file;
    EXPECT_EQ(c.position, PositionKind::Rope) << e.file;
  }
}

// The command line's overrides follow the model file's rules (one table, settingRange), and
// their errors name the flag.
TEST(ModelConfig, OverridesAreCheckedAsTheModelFileIs) {
  ModelConfig config = unwrap(parseModelConfig(MODEL(GOOD), "m.yaml"));
  ConfigOverrides ok;
  ok.batch = 7;
  ok.fp8MinDim = 2000000; // past 2^20: the model file takes it too
  ok.recipe = "bf16";
  ok.recompute = true;
  EXPECT_FALSE(config.train.recompute);
  EXPECT_FALSE(bool(applyOverrides(config, ok)));
  EXPECT_TRUE(config.train.recompute);
  EXPECT_EQ(config.train.batch, 7);
  EXPECT_EQ(config.precision.fp8MinDim, 2000000);
  EXPECT_EQ(config.precision.recipe, Recipe::Bf16);
  EXPECT_FALSE(bool(parseModelConfig(MODEL(GOOD) "precision:\n  fp8_min_dim: 2000000\n", "m.yaml").takeError()));
  ConfigOverrides batch;
  batch.batch = 0;
  EXPECT_EQ(errorOf(applyOverrides(config, batch)), "error: --batch must be between 1 and 65536, got 0");
  ConfigOverrides lr;
  lr.lr = 11;
  EXPECT_EQ(errorOf(applyOverrides(config, lr)), "error: --lr must be between 1e-12 and 10, got 11");
  ConfigOverrides recipe;
  recipe.recipe = "fp4";
  EXPECT_EQ(errorOf(applyOverrides(config, recipe)), "error: --precision must be auto | fp32 | bf16 | fp8, got 'fp4'");
  EXPECT_EQ(config.train.batch, 7); // a rejected override changes nothing
}

} // namespace

TEST(ModelConfig, RecomputeTakesLayersOrAutoWithABudget) {
  // recompute_layers: the first N layers (recompute on); auto with memory_budget; both read back.
  ModelConfig layers = unwrap(parseModelConfig(MODEL(GOOD) "train:\n  recompute_layers: 3\n", "m.yaml"));
  EXPECT_TRUE(layers.train.recompute);
  EXPECT_EQ(layers.train.recomputeLayers, 3);
  EXPECT_TRUE(layers.train.recomputes(2));
  EXPECT_FALSE(layers.train.recomputes(3));
  EXPECT_FALSE(layers.train.recomputes(std::nullopt)); // the head: only with every layer
  ModelConfig again = unwrap(parseModelConfig(formatModelConfig(layers), "again.yaml"));
  EXPECT_EQ(again.train.recomputeLayers, 3);
  ModelConfig autoBudget =
      unwrap(parseModelConfig(MODEL(GOOD) "train:\n  recompute: auto\n  memory_budget: 70.5\n", "m.yaml"));
  EXPECT_TRUE(autoBudget.train.recompute && autoBudget.train.recomputeAuto);
  EXPECT_EQ(autoBudget.train.memoryBudgetGiB, 70.5);
  again = unwrap(parseModelConfig(formatModelConfig(autoBudget), "again.yaml"));
  EXPECT_TRUE(again.train.recomputeAuto);
  EXPECT_EQ(again.train.memoryBudgetGiB, 70.5);
  ModelConfig all = unwrap(parseModelConfig(MODEL(GOOD) "train:\n  recompute: true\n", "m.yaml"));
  EXPECT_TRUE(all.train.recomputes(std::nullopt));
  // The flags: --recompute-layers chooses, --memory-budget makes it auto.
  ConfigOverrides flags;
  flags.memoryBudgetGiB = 12;
  ASSERT_FALSE(bool(applyOverrides(layers, flags)));
  EXPECT_TRUE(layers.train.recomputeAuto);
  ConfigOverrides bad;
  bad.recomputeLayers = 2000;
  EXPECT_EQ(errorOf(applyOverrides(layers, bad)), "error: --recompute-layers must be between 0 and 1024, got 2000");
  bad.recomputeLayers = 2; // GOOD has one layer: 2 would mean all of them without a word
  EXPECT_EQ(errorOf(applyOverrides(layers, bad)),
            "error: --recompute-layers must be at most the model's layers (1), got 2");
  bad.recomputeLayers = 1;
  EXPECT_FALSE(bool(applyOverrides(layers, bad)));
}

TEST(ModelConfig, ASmallVocabularyWithoutDataReadsBack) {
  // Found by scripts/fuzz.sh: vocab 5 and no data section took the default max_step 8, which
  // the description written into checkpoints then refused (max_step must be below vocab).
  ModelConfig config = unwrap(parseModelConfig("name: v\nmodel:\n  vocab: 5\n  seq_len: 8\n  d_model: 16\n"
                                               "  heads: 2\n  layers: 1\n  ffn: 32\n",
                                               "v.yaml"));
  EXPECT_EQ(config.data.maxStep, 4);
  std::string text = formatModelConfig(config);
  ModelConfig back = unwrap(parseModelConfig(text, "again.yaml"));
  EXPECT_EQ(formatModelConfig(back), text);
}
