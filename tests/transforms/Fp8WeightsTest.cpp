// FP8-only weights between steps (fp8_weights, the fp8-weights pass) on the CPU reference: the
// program keeps each FP8 weight's bytes as state made after AdamW, trains to the same bits as
// the weights quantized in the forward under every scaling, and resumes bit for bit from a
// checkpoint that holds only the master weights.
#include "app/Checkpoint.h"
#include "app/Trainer.h"
#include "backends/Prologue.h"
#include "backends/cpu/Pipeline.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

using namespace tgc;
using namespace tgc::test;

namespace {

/// The tiny model with sides of 128 (every linear layer legal for each scaling, block too) in
/// FP8, every layer and the head.
ModelConfig fp8Model(Fp8Scaling scaling, bool fp8Weights) {
  ModelConfig config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  config.dModel = 128;
  config.ffn = 256;
  config.heads = 2;
  config.vocab = 128;
  config.train.batch = 4;
  config.precision.keepBf16.clear();
  config.precision.recipe = Recipe::Fp8;
  config.precision.fp8Scaling = scaling;
  config.precision.fp8Weights = fp8Weights;
  if (scaling == Fp8Scaling::Block)
    config.precision.fp8Format = Fp8Formats::E4M3;
  return config;
}

std::vector<double> train(Trainer &t, int steps) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i)
    losses.push_back(unwrap(t.step()).loss);
  return losses;
}

} // namespace

TEST(Fp8Weights, TheWeightsQuantizeAfterAdamWIntoStateTheForwardReads) {
  ModelConfig config = fp8Model(Fp8Scaling::Delayed, true);
  auto graph = unwrap(buildGPT(config, config.train.batch));
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.precision = config.precision;
  ASSERT_FALSE(bool(unwrap(PassPipeline::create(cpuPipeline(true, config.precision), options)).run(*graph)));
  std::vector<Op *> ops = graph->ops();
  size_t lastAdamW = 0, prologueLeaves = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]->kind() == OpKind::AdamW)
      lastAdamW = i;
    if (isPrologueLeaf(*ops[i])) // data, amax and count of each of the 4 x 2 + 1 weights
      ++prologueLeaves;
  }
  EXPECT_EQ(prologueLeaves, 3u * (4 * config.layers + 1));
  int weightQuantizes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op *op = ops[i];
    if (op->kind() != OpKind::Quantize)
      continue;
    // No quantize reads a master weight in the step; a weight's reads the updated weight and the
    // updated scale, after every AdamW.
    const Op *source = op->operand(0)->def();
    EXPECT_NE(source->kind(), OpKind::Param) << op->result()->name();
    if (source->kind() != OpKind::AdamW)
      continue;
    ++weightQuantizes;
    EXPECT_GT(i, lastAdamW) << op->result()->name();
    EXPECT_EQ(op->operand(1)->def()->kind(), OpKind::Fp8Update) << op->result()->name();
  }
  EXPECT_EQ(weightQuantizes, 4 * config.layers + 1);
  std::vector<PrologueOp> prologue = prologueOps(*graph);
  ASSERT_EQ(prologue.size(), size_t(weightQuantizes));
  for (const PrologueOp &p : prologue) {
    // The quantize reads the master weight and the scaling state between steps.
    EXPECT_EQ(p.operandLeaves[0]->def()->kind(), OpKind::Param);
    EXPECT_TRUE(llvm::StringRef(p.operandLeaves[1]->name()).ends_with(".weight.scale"));
    EXPECT_TRUE(llvm::StringRef(p.operandLeaves[2]->name()).ends_with(".weight.scale_inv"));
    for (const Value *leaf : p.resultLeaves)
      EXPECT_TRUE(leaf && isPrologueLeaf(*leaf->def()));
  }
}

TEST(Fp8Weights, TrainTheSameBitsAsWeightsQuantizedInTheForwardUnderEveryScaling) {
  for (Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Current, Fp8Scaling::Mixed, Fp8Scaling::Block}) {
    SCOPED_TRACE(fp8ScalingName(scaling).str());
    std::vector<double> losses[2];
    std::unique_ptr<Trainer> trainers[2];
    for (int kept = 0; kept < 2; ++kept) {
      trainers[kept] = unwrap(Trainer::create(fp8Model(scaling, kept)));
      ASSERT_TRUE(trainers[kept]);
      losses[kept] = train(*trainers[kept], 5);
    }
    EXPECT_EQ(losses[1], losses[0]);
    // The checkpoint holds the master weights and the scaling state, not the FP8 bytes.
    Checkpoint a = unwrap(trainers[0]->checkpoint()), b = unwrap(trainers[1]->checkpoint());
    EXPECT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto &[name, t] : a.tensors) {
      ASSERT_TRUE(b.tensors.count(name)) << name;
      EXPECT_EQ(t.data, b.tensors.at(name).data) << name;
    }
  }
}

TEST(Fp8Weights, AResumedRunRemakesTheFp8WeightsAndContinuesBitForBit) {
  ModelConfig config = fp8Model(Fp8Scaling::Delayed, true);
  auto straight = unwrap(Trainer::create(config));
  ASSERT_TRUE(straight);
  std::vector<double> all = train(*straight, 5);
  auto first = unwrap(Trainer::create(config));
  ASSERT_TRUE(first);
  train(*first, 3);
  llvm::SmallString<128> file;
  llvm::sys::fs::createUniquePath("tgc-test-%%%%%%-fp8-weights.safetensors", file, /*MakeAbsolute=*/true);
  std::string path = file.str().str();
  ASSERT_FALSE(bool(writeCheckpoint(path, unwrap(first->checkpoint()))));
  // Resumed with and without FP8 weights: the checkpoint is the same either way.
  for (bool fp8Weights : {true, false}) {
    config.precision.fp8Weights = fp8Weights;
    auto second = unwrap(Trainer::create(config));
    ASSERT_TRUE(second);
    ASSERT_FALSE(bool(second->resume(unwrap(readCheckpoint(path)), path)));
    EXPECT_EQ(train(*second, 2), std::vector<double>(all.begin() + 3, all.end())) << fp8Weights;
    if (fp8Weights) { // what the next step reads: the bytes the uninterrupted run holds
      EXPECT_EQ(unwrap(second->executor().read("h0.mlp.fc1.fp8.weight.data")).data,
                unwrap(straight->executor().read("h0.mlp.fc1.fp8.weight.data")).data);
    }
  }
  llvm::sys::fs::remove(path);
}
