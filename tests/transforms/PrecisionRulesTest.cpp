// Which linear layers the fp8 recipe puts in FP8 (transforms/precision/Precision.h): the rules
// that make a GEMM illegal in FP8, fp8_layers, and what auto's measurement leaves behind.
#include "app/PrecisionProbe.h"
#include "ir/Attributes.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "transforms/precision/Precision.h"
#include "tests/TestUtil.h"

#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

PrecisionConfig fp8Rules() {
  PrecisionConfig p;
  p.recipe = Recipe::Fp8;
  return p;
}

TEST(Fp8Rules, EveryLegalLayerUnlessARuleSaysOtherwise) {
  PrecisionConfig p = fp8Rules();
  EXPECT_TRUE(chooseGemmPrecision(p, "h0.attn.qkv", 4096, 512, 1536).fp8);
  EXPECT_EQ(chooseGemmPrecision(p, "h0.attn.qkv", 4096, 512, 1536).reason, "every legal linear layer (the fp8 recipe)");
  EXPECT_TRUE(chooseGemmPrecision(p, "lm_head", 4096, 512, 1024).fp8); // keep_bf16 is empty by default
  p.keepBf16 = {"lm_head"};
  GemmChoice head = chooseGemmPrecision(p, "lm_head", 4096, 512, 1024);
  EXPECT_FALSE(head.fp8);
  EXPECT_EQ(head.reason, "kept in BF16 by keep_bf16 'lm_head'");
  EXPECT_FALSE(chooseGemmPrecision(p, "h0.mlp.fc1", 4096, 520, 2048).fp8); // K = 520
  EXPECT_FALSE(chooseGemmPrecision(p, "h0.mlp.fc1", 4096, 512, 2056).fp8); // N = 2056
  // A training program's rows are the weight gradient's K; an inference program's are free.
  GemmChoice rows = chooseGemmPrecision(p, "h0.mlp.fc1", 4100, 512, 2048);
  EXPECT_FALSE(rows.fp8);
  EXPECT_EQ(rows.reason, "M=4100 is not a multiple of 16 (the FP8 weight gradient contracts over it)");
  p.forwardOnly = true;
  EXPECT_TRUE(chooseGemmPrecision(p, "h0.mlp.fc1", 5, 512, 2048).fp8);
  EXPECT_TRUE(chooseGemmPrecision(p, "h0.mlp.fc1", 1, 512, 2048).fp8);
  p.fp8MinDim = 1024;
  GemmChoice small = chooseGemmPrecision(p, "h0.attn.qkv", 4096, 512, 1536);
  EXPECT_FALSE(small.fp8);
  EXPECT_EQ(small.reason, "K=512 or N=1536 below fp8_min_dim 1024");
}

TEST(Fp8Rules, Fp8LayersNamesTheOnlyLayersFp8MayRunAndTheMeasurementIsTheReason) {
  PrecisionConfig p = fp8Rules();
  p.fp8Layers = std::vector<std::string>{"h*.mlp.fc1"};
  EXPECT_TRUE(chooseGemmPrecision(p, "h3.mlp.fc1", 4096, 512, 2048).fp8);
  EXPECT_EQ(chooseGemmPrecision(p, "h3.mlp.fc1", 4096, 512, 2048).reason, "fp8_layers 'h*.mlp.fc1'");
  EXPECT_FALSE(chooseGemmPrecision(p, "h3.mlp.fc2", 4096, 2048, 512).fp8);
  EXPECT_EQ(chooseGemmPrecision(p, "h3.mlp.fc2", 4096, 2048, 512).reason, "not named by fp8_layers");
  // The legality rules still come first: fp8_layers cannot put an illegal product in FP8.
  p.fp8Layers = std::vector<std::string>{"*"};
  EXPECT_FALSE(chooseGemmPrecision(p, "lm_head", 4096, 520, 1024).fp8); // K = 520
  p.keepBf16 = {"lm_head"};
  EXPECT_FALSE(chooseGemmPrecision(p, "lm_head", 4096, 512, 1024).fp8);
  p.keepBf16.clear();
  p.fp8Layers.emplace(); // none
  EXPECT_FALSE(chooseGemmPrecision(p, "h0.attn.qkv", 4096, 512, 1536).fp8);
  // auto's choice: fp8_layers from the measurement, which each layer of the kind gives as reason.
  p.fp8Layers = std::vector<std::string>{"h*.mlp.fc1"};
  p.measured = {GemmMeasurement{"h0.mlp.fc1", 4096, 512, 2048, 2.5, 2.25, false, true},
                GemmMeasurement{"h0.attn.qkv", 4096, 512, 1536, 2.125, 2.25, true, false}};
  EXPECT_TRUE(p.measured[0].fp8());
  EXPECT_FALSE(p.measured[1].fp8());
  EXPECT_EQ(chooseGemmPrecision(p, "h7.mlp.fc1", 4096, 512, 2048).reason,
            "measured: a probe step of 2.250 ms with every kind in FP8, 2.500 with this one in BF16");
  EXPECT_EQ(chooseGemmPrecision(p, "h7.attn.qkv", 4096, 512, 1536).reason,
            "measured (cached): a probe step of 2.250 ms with every kind in FP8, 2.125 with this one in BF16");
  EXPECT_EQ(describeMeasurement(p.measured[0]), "h*.mlp.fc1     (4096 x 512 x 2048): FP8 , probe step 2.250 ms with "
                                                "every kind in FP8, 2.500 with this one in BF16");
}

TEST(Fp8Rules, LayerPatternsNameEveryLayerOfAKind) {
  EXPECT_EQ(layerPattern("h0.attn.qkv"), "h*.attn.qkv");
  EXPECT_EQ(layerPattern("h12.mlp.fc2"), "h*.mlp.fc2");
  EXPECT_EQ(layerPattern("lm_head"), "lm_head");
  EXPECT_EQ(layerPattern("head"), "head");
  EXPECT_EQ(layerPattern("h.x"), "h.x");
  EXPECT_EQ(layerPattern("h3"), "h3");
}

/// How many quantize ops the tiny model's training program has under `precision`.
int quantizesOf(const PrecisionConfig &precision) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 4));
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = precision;
  auto pipeline = unwrap(PassPipeline::create(trainingPipeline(), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  int quantizes = 0;
  for (const Op *op : graph->ops())
    quantizes += op->kind() == OpKind::Quantize;
  return quantizes;
}

TEST(Fp8Rules, TheTrainingProgramQuantizesWhatTheRulesChoose) {
  // Three quantizes per FP8 layer (input, weight, output gradient): the tiny model's eight
  // block layers and its head under fp8, the blocks' alone with keep_bf16 [lm_head]; fc1's two
  // alone under fp8_layers [h*.mlp.fc1]; none under [].
  PrecisionConfig p = fp8Rules();
  EXPECT_EQ(quantizesOf(p), 3 * 9);
  p.keepBf16 = {"lm_head"};
  EXPECT_EQ(quantizesOf(p), 3 * 8);
  p.fp8Layers = std::vector<std::string>{"h*.mlp.fc1"};
  EXPECT_EQ(quantizesOf(p), 3 * 2);
  p.fp8Layers.emplace();
  EXPECT_EQ(quantizesOf(p), 0);
}

TEST(Fp8Rules, OnTheCpuAutoIsFp32AndNothingIsMeasured) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Auto;
  PrecisionConfig p = unwrap(choosePrecision(c, Device::cpu()));
  EXPECT_EQ(p.recipe, Recipe::Fp32);
  EXPECT_TRUE(p.measured.empty());
  EXPECT_FALSE(p.fp8Layers);
}

} // namespace
