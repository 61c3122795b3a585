// recompute: auto's choice (driver/RecomputeBudget.h): the fewest leading layers whose plan
// fits, found by a binary search over plans that shrink as layers are added; and the plans of
// a real program (tiny on the GPU pipeline) shrinking as recompute_layers grows.
#include "driver/RecomputeBudget.h"

#include "tests/TestUtil.h"
#include "models/ModelConfig.h"

#include <gtest/gtest.h>

namespace tgc {
namespace {
using namespace test;

/// Plans of `layers` layers, each layer recomputed saving `perLayer` bytes from `none`, the head
/// `head` more; records what was asked.
struct FakePlans {
  int64_t layers, none, perLayer, head;
  std::vector<int64_t> asked;
  llvm::Expected<int64_t> operator()(int64_t k) {
    asked.push_back(k);
    return k < 0 ? none - layers * perLayer - head : none - k * perLayer;
  }
};

TEST(RecomputeBudget, ChoosesTheFewestLeadingLayersThatFit) {
  // Ten layers: k recomputed take 1000 - 10 k bytes, all of them and the head 880.
  for (int64_t budget : {1000, 999, 990, 951, 950, 901, 900, 880}) {
    SCOPED_TRACE(budget);
    FakePlans plans{10, 1000, 10, 20, {}};
    auto choice = chooseRecomputeLayers(10, budget, std::ref(plans));
    ASSERT_TRUE(bool(choice)) << llvm::toString(choice.takeError());
    // The fewest k with 1000 - 10 k <= budget; past 10 layers, every one and the head (-1).
    int64_t want = (1000 - budget + 9) / 10;
    if (want > 10)
      want = -1;
    EXPECT_EQ(choice->layers, want);
    EXPECT_LE(choice->bytes, budget);
    EXPECT_EQ(choice->bytes, plans.none - (want < 0 ? 120 : want * 10));
    EXPECT_LE(plans.asked.size(), 2u + 4u); // none, all, then a binary search over 10
    EXPECT_EQ(choice->tried.size(), plans.asked.size());
  }
  FakePlans over{10, 1000, 10, 20, {}};
  auto refused = chooseRecomputeLayers(10, 879, std::ref(over));
  ASSERT_FALSE(bool(refused));
  std::string message = llvm::toString(refused.takeError());
  EXPECT_NE(message.find("with every layer recomputed"), std::string::npos) << message;
  EXPECT_EQ(over.asked, (std::vector<int64_t>{0, -1}));
}

TEST(RecomputeBudget, TinysPlanShrinksAsLayersRecompute) {
  // tiny in FP8 on the GPU pipeline: none, the first layer, both, both and the head.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  Device gpu{Device::Cuda, 90, 0};
  std::vector<int64_t> bytes;
  for (int64_t layers : {0, 1, 2, -1}) {
    ModelConfig trial = c;
    trial.train.recompute = layers != 0;
    trial.train.recomputeLayers = layers;
    bytes.push_back(unwrap(gpuTrainingPlanBytes(trial, c.train.batch, gpu, 1, /*cudnnAttention=*/false)));
  }
  EXPECT_GT(bytes[0], bytes[1]);
  EXPECT_GT(bytes[1], bytes[2]);
  EXPECT_GE(bytes[2], bytes[3]);
  // Auto with a budget between the first two: the first layer alone; the config says so. (The
  // plans above have tgc's attention: so must auto's, on a machine whose GPU finds cuDNN too.)
  c.train.recompute = c.train.recomputeAuto = true;
  c.train.memoryBudgetGiB = double(bytes[1] + bytes[0]) / 2 / double(1 << 30);
  std::string note;
  setenv("TGC_CUDNN", "0", 1);
  auto chosen = resolveRecompute(c, c.train.batch, gpu, 1, &note);
  unsetenv("TGC_CUDNN");
  ModelConfig resolved = unwrap(std::move(chosen));
  EXPECT_TRUE(resolved.train.recompute);
  EXPECT_FALSE(resolved.train.recomputeAuto);
  EXPECT_EQ(resolved.train.recomputeLayers, 1);
  EXPECT_NE(note.find("the first 1 of 2 layers"), std::string::npos) << note;
  // On the CPU nothing is chosen.
  EXPECT_TRUE(unwrap(resolveRecompute(c, c.train.batch, Device::cpu(), 1)).train.recomputeAuto);
}

} // namespace
} // namespace tgc
