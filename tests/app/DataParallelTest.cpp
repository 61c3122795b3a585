// Data-parallel training on the CPU reference: ranks as threads of one process (LocalGroup),
// each a Trainer of its share of the global batch, against one rank training the whole batch.
// The GPU runs the same program through NCCL (GpuDataParallelTest.cpp, two GPUs).
#include "app/Trainer.h"
#include "backends/Communicator.h"
#include "backends/cpu/Pipeline.h"
#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "tests/app/RankRuns.h"
#include "tests/TestUtil.h"
#include "transforms/Pass.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

ModelConfig parityConfig() { return unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml"))); }

/// `steps` steps of `config` on `ranks` ranks (threads), or on one rank without a communicator
/// when `ranks` is 1; `before` runs on each rank's trainer first.
std::vector<RankRun> train(const ModelConfig &config, int ranks, int64_t steps,
                           const std::function<llvm::Error(Trainer &)> &before = {}) {
  LocalGroup group(ranks);
  return trainRanks(
      config, ranks, steps,
      [&](int r) -> llvm::Expected<RankPlace> {
        return RankPlace{Device::cpu(), ranks > 1 ? &group.rank(r) : nullptr};
      },
      [&] { group.abort(); }, before);
}

/// The training program of rank `dataParallel.rank` of `config` for `batch` sequences.
std::unique_ptr<Graph> rankProgram(const ModelConfig &config, int64_t batch, const DataParallelOptions &dataParallel) {
  auto graph = unwrap(buildGPT(config, batch));
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.dataParallel = dataParallel;
  auto pipeline = unwrap(PassPipeline::create(trainingPipeline(), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// Rank `rank`'s training program of 4 ranks of the parity model under ZeRO-1, or ZeRO-2 with
/// `gradients`.
std::unique_ptr<Graph> shardedRankProgram(int rank, bool gradients) {
  DataParallelOptions dataParallel;
  dataParallel.ranks = 4;
  dataParallel.rank = rank;
  dataParallel.shardOptimizer = true;
  dataParallel.shardGradients = gradients;
  return rankProgram(parityConfig(), 4, dataParallel);
}

double maxRelativeDifference(const std::vector<double> &a, const std::vector<double> &b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(1e-12, std::abs(b[i])));
  return worst;
}

/// Checks that both ranks hold the same bits in every tensor, and returns the largest
/// difference of rank 0's against `single`'s, relative to each tensor's largest magnitude.
double compareStates(const RankRun &rank0, const RankRun &rank1, const RankRun &single) {
  double worst = 0;
  EXPECT_EQ(rank0.state.size(), single.state.size());
  for (const auto &[name, t] : rank0.state) {
    auto other = rank1.state.find(name);
    EXPECT_NE(other, rank1.state.end()) << name;
    if (other != rank1.state.end()) {
      EXPECT_EQ(t.data, other->second.data) << name << " differs between the ranks";
    }
    auto reference = single.state.find(name);
    if (reference == single.state.end() || reference->second.data.size() != t.data.size()) {
      ADD_FAILURE() << name << " is not in the one-rank run as it is in the ranks'";
      continue;
    }
    double scale = 1e-30;
    for (float v : reference->second.data)
      scale = std::max(scale, double(std::abs(v)));
    double here = 0;
    for (size_t i = 0; i < t.data.size(); ++i)
      here = std::max(here, std::abs(double(t.data[i]) - reference->second.data[i]) / scale);
    if (std::getenv("TGC_TEST_VERBOSE") && here > 1e-3)
      fmt::print("{}: {}\n", name, here);
    worst = std::max(worst, here);
  }
  return worst;
}

TEST(DataParallel, TwoRanksFollowOneRankInFp32) {
  ModelConfig config = parityConfig();
  std::vector<RankRun> single = train(config, 1, 20), ranks = train(config, 2, 20);
  ASSERT_EQ(single[0].error, "");
  ASSERT_EQ(ranks[0].error, "");
  ASSERT_EQ(ranks[1].error, "");
  ASSERT_EQ(ranks[0].losses.size(), 20u);
  // The loss of each step is the global batch's on both ranks, bit for bit, and what one rank
  // training the whole batch gets, but for the order of the sums.
  EXPECT_EQ(ranks[0].losses, ranks[1].losses);
  EXPECT_LT(maxRelativeDifference(ranks[0].losses, single[0].losses), 2e-5)
      << "first loss " << ranks[0].losses[0] << " vs " << single[0].losses[0] << ", last " << ranks[0].losses.back()
      << " vs " << single[0].losses.back();
  // The losses move (the test would pass on a model that does not train otherwise).
  EXPECT_LT(ranks[0].losses.back(), ranks[0].losses.front() - 0.5);
  EXPECT_LT(compareStates(ranks[0], ranks[1], single[0]), 1e-3);
}

TEST(DataParallel, FourRanksFollowOneRankInFp8WithTheSameScalingStateEverywhere) {
  ModelConfig config = parityConfig();
  config.precision.recipe = Recipe::Fp8;
  config.precision.fp8MinDim = 0; // every linear layer in FP8
  std::vector<RankRun> single = train(config, 1, 12), ranks = train(config, 4, 12);
  ASSERT_EQ(single[0].error, "");
  for (const RankRun &r : ranks)
    ASSERT_EQ(r.error, "");
  bool hasFp8State = false;
  for (const auto &[name, t] : ranks[0].state)
    hasFp8State |= llvm::StringRef(name).ends_with(".amax_history");
  ASSERT_TRUE(hasFp8State);
  for (int r = 1; r < 4; ++r) {
    EXPECT_EQ(ranks[r].losses, ranks[0].losses);
    compareStates(ranks[0], ranks[r], single[0]); // every tensor, FP8 state included, the same bits
  }
  // The first step's loss is the same. After it the runs part a little: a rank's gradients are
  // 4x one rank's (the mean over a quarter of the rows), and quantized with the first step's
  // scale of 1 the smallest of them fall below E5M2's subnormals less often (measured: 3e-5 at
  // step 2, at most 3e-4 over 12 steps with the head in BF16, 1.1e-3 with it in FP8, whose
  // dlogits at scale 1 are mostly below them; fp32 stays within 2e-5). Their amaxes are 4x too,
  // so from the second step the scales follow and the FP8 codes are the same.
  EXPECT_EQ(ranks[0].losses[0], single[0].losses[0]);
  EXPECT_LT(maxRelativeDifference(ranks[0].losses, single[0].losses), 2e-3);
  for (const auto &[name, t] : ranks[0].state)
    if (llvm::StringRef(name).ends_with(".amax_history") && llvm::StringRef(name).contains("fwd")) {
      // The forward's amaxes: the maximum over the ranks is the whole batch's maximum.
      const Tensor &reference = single[0].state.at(name);
      for (size_t i = 0; i < 12; ++i)
        EXPECT_NEAR(t.data[i], reference.data[i], 1e-3 * std::abs(reference.data[i]) + 1e-6) << name << " step " << i;
    }
}

TEST(DataParallel, TwoRanksWithFp8AttentionKeepTheSameScalingStateEverywhere) {
  // FP8 attention's S and dP amaxes (the ops' results, not a quantize's) are reduced over the
  // ranks with the others: every state the same bits on both ranks, the losses one rank's but
  // for the order of the sums and the FP8 codes that order moves.
  ModelConfig config = parityConfig();
  config.precision.recipe = Recipe::Fp8;
  config.precision.fp8Attention = true;
  std::vector<RankRun> single = train(config, 1, 8), ranks = train(config, 2, 8);
  ASSERT_EQ(single[0].error, "");
  ASSERT_EQ(ranks[0].error, "");
  ASSERT_EQ(ranks[1].error, "");
  ASSERT_TRUE(ranks[0].state.count("h0.attn.sdpa.fp8.dp.amax_history"));
  EXPECT_EQ(ranks[0].losses, ranks[1].losses);
  compareStates(ranks[0], ranks[1], single[0]);
  EXPECT_LT(maxRelativeDifference(ranks[0].losses, single[0].losses), 5e-3);
}

TEST(DataParallel, ABatchThatDoesNotSplitEvenlyIsAClearError) {
  ModelConfig config = parityConfig();
  std::vector<RankRun> runs = train(config, 3, 1);
  EXPECT_NE(runs[0].error.find("the batch of 16 sequences does not split evenly over 3 ranks"), std::string::npos)
      << runs[0].error;
}

TEST(DataParallel, ThePassReducesEveryGradientInBucketsAfterItsLastProducer) {
  DataParallelOptions dataParallel;
  dataParallel.ranks = 2;
  dataParallel.bucketBytes = 64 << 10; // several buckets on the tiny model
  auto graph = rankProgram(parityConfig(), 8, dataParallel);
  ASSERT_TRUE(graph);
  std::vector<Op *> ops = graph->ops();
  llvm::DenseMap<const Op *, size_t> at;
  for (size_t i = 0; i < ops.size(); ++i)
    at[ops[i]] = i;
  int buckets = 0;
  for (const Op *op : ops) {
    if (op->kind() == OpKind::AllReduce && op->attrs().getString("reduce") == "avg") {
      ++buckets;
      // Right after its last operand's producer (and the buckets that end there too).
      size_t last = 0;
      for (const Value *v : op->operands())
        last = std::max(last, at.lookup(v->def()));
      EXPECT_GT(at.lookup(op), last);
      for (size_t i = last + 1; i < at.lookup(op); ++i)
        EXPECT_EQ(ops[i]->kind(), OpKind::AllReduce) << "%" << op->result()->name() << " is not right after its gradients";
    }
    if (op->kind() == OpKind::AdamW) {
      EXPECT_EQ(op->operand(1)->def()->kind(), OpKind::AllReduce) << "%" << op->result()->name();
    }
  }
  EXPECT_GT(buckets, 2);
  const Value *loss = graph->outputs()[0];
  EXPECT_EQ(loss->name(), "loss");
  EXPECT_EQ(loss->def()->kind(), OpKind::AllReduce);
}

} // namespace

namespace {

/// Under shard: gradients (ZeRO-2) the ranks' gradients and AdamW moments are shards of 1 / ranks
/// of each parameter (padded with zeros to a multiple of ranks), gathered into a checkpoint like
/// an unsharded run's.
TEST(ShardedOptimizer, RanksFollowUnshardedDataParallelismIn3Recipes) {
  for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16, Recipe::Fp8}) {
    ModelConfig config = parityConfig();
    config.precision.recipe = recipe;
    config.precision.fp8MinDim = 0;
    SCOPED_TRACE(recipeName(recipe).str());
    std::vector<RankRun> plain = train(config, 2, 20);
    config.train.shardOptimizer = config.train.shardGradients = true;
    for (int ranks : recipe == Recipe::Fp32 ? std::vector<int>{2, 4} : std::vector<int>{4}) {
      SCOPED_TRACE(fmt::format("{} ranks", ranks));
      std::vector<RankRun> sharded = train(config, ranks, 20);
      for (const RankRun &r : sharded)
        ASSERT_EQ(r.error, "");
      ASSERT_EQ(plain[0].error, "");
      for (int r = 1; r < ranks; ++r) {
        EXPECT_EQ(sharded[r].losses, sharded[0].losses);
        compareStates(sharded[0], sharded[r], plain[0]); // every tensor the same bits on each rank
      }
      // The same arithmetic but the order of the gradients' sums and the norm's: fp32's rounding.
      EXPECT_LT(maxRelativeDifference(sharded[0].losses, plain[0].losses), recipe == Recipe::Fp32 ? 2e-5 : 2e-3);
      EXPECT_LT(sharded[0].losses.back(), sharded[0].losses.front() - 0.5);
      // In fp32 every tensor within 1e-3 of its largest. (Under BF16 and FP8 the last bits of the
      // norm move roundings of the products, and the keys' bias, whose true gradient is zero,
      // is AdamW's normalised noise: 30% of its largest apart, the moments 0.4%.)
      if (recipe == Recipe::Fp32) {
        EXPECT_LT(compareStates(sharded[0], sharded[1], plain[0]), 1e-3);
      }
    }
  }
}

TEST(ShardedOptimizer, ZeroOneGivesZeroTwosBits) {
  // shard: optimizer (ZeRO-1: whole gradients all-reduced, each rank updating its part of them)
  // and shard: gradients (ZeRO-2: the gradients reduce-scattered) sum the same values in the same
  // rank order: the same losses and tensors, bit for bit, on 2 ranks over 20 steps.
  ModelConfig config = parityConfig();
  config.train.shardOptimizer = true;
  std::vector<RankRun> one = train(config, 2, 20);
  config.train.shardGradients = true;
  std::vector<RankRun> two = train(config, 2, 20);
  ASSERT_EQ(one[0].error, "");
  ASSERT_EQ(two[0].error, "");
  EXPECT_EQ(one[0].losses, two[0].losses);
  EXPECT_EQ(one[1].losses, two[1].losses);
  EXPECT_LT(one[0].losses.back(), one[0].losses.front() - 0.5);
  EXPECT_EQ(compareStates(one[0], one[1], two[0]), 0.0);
}

TEST(ShardedOptimizer, ZeroOneAllReducesAndUpdatesItsPartOfEachGradient) {
  auto graph = shardedRankProgram(1, /*gradients=*/false);
  ASSERT_TRUE(graph);
  int updates = 0;
  for (const Op *op : graph->ops()) {
    EXPECT_NE(op->kind(), OpKind::ReduceScatter);
    if (op->kind() != OpKind::AdamW)
      continue;
    ++updates;
    // The gradient: rank 1's quarter of the whole all-reduced gradient.
    const Op *shard = op->operand(1)->def();
    ASSERT_EQ(shard->kind(), OpKind::Shard);
    EXPECT_EQ(shard->attrs().getInt("rank"), 1);
    EXPECT_EQ(shard->operand(0)->def()->kind(), OpKind::AllReduce);
    EXPECT_EQ(op->operand(1)->type(), op->operand(0)->type());
  }
  EXPECT_GT(updates, 10);
  EXPECT_EQ(graph->lookup("grad_norm.sumsq")->def()->kind(), OpKind::AllReduce);
}

TEST(ShardedOptimizer, ThePassesShardTheMomentsAndGatherTheParameters) {
  auto graph = shardedRankProgram(3, /*gradients=*/true);
  ASSERT_TRUE(graph);
  int scatters = 0, gathers = 0, updates = 0;
  for (const Op *op : graph->ops()) {
    scatters += op->kind() == OpKind::ReduceScatter;
    gathers += op->kind() == OpKind::AllGather;
    if (op->kind() == OpKind::AllReduce && op->attrs().getString("reduce") == "avg") {
      EXPECT_EQ(op->numOperands(), 1u); // the gradients are reduce-scattered, the loss averaged alone
      EXPECT_EQ(op->result()->name(), "loss");
    }
    if (op->kind() != OpKind::AdamW)
      continue;
    ++updates;
    // Each update reads the rank's shard of its parameter, a gradient shard and moments of the
    // shard's size: a quarter of the parameter, rounded up.
    const Op *shard = op->operand(0)->def();
    ASSERT_EQ(shard->kind(), OpKind::Shard);
    EXPECT_EQ(shard->attrs().getInt("rank"), 3);
    int64_t n = (shard->operand(0)->type().numElements() + 3) / 4;
    for (unsigned i : {0u, 1u, 2u, 3u})
      EXPECT_EQ(op->operand(i)->type(), TensorType(DType::F32, {n})) << "%" << op->result()->name() << " operand " << i;
    EXPECT_EQ(op->operand(1)->def()->kind(), OpKind::ReduceScatter);
  }
  EXPECT_GT(scatters, 0);
  EXPECT_EQ(gathers, 1);
  EXPECT_GT(updates, 10);
  EXPECT_EQ(graph->lookup("grad_norm.sumsq")->def()->kind(), OpKind::AllReduce);
}

TEST(ShardedOptimizer, ACheckpointResumesOnAnotherRankCount) {
  // 10 steps sharded (ZeRO-1) on 2 ranks, saved (the moments gathered), resumed sharded on 4 and
  // on 1 rank unsharded for 5 more: the same losses as 15 steps on 2 ranks, but for rounding.
  ModelConfig config = parityConfig();
  config.train.shardOptimizer = true;
  std::vector<RankRun> straight = train(config, 2, 15), first = train(config, 2, 10);
  ASSERT_EQ(straight[0].error, "");
  ASSERT_EQ(first[0].error, "");
  for (const auto &[name, t] : first[0].state)
    if (llvm::StringRef(name).ends_with(".adam_m")) {
      EXPECT_EQ(t.type, first[0].state.at(program::parameterOfMoment(name).str()).type) << name << " is gathered whole";
    }
  Checkpoint saved;
  saved.tensors = first[0].state;
  for (int ranks : {4, 1}) {
    SCOPED_TRACE(fmt::format("resumed on {}", ranks));
    ModelConfig resumed = config;
    resumed.train.shardOptimizer = ranks > 1;
    std::vector<RankRun> runs = train(resumed, ranks, 5, [&](Trainer &trainer) {
      Checkpoint c = saved;
      c.meta = checkpointMetadata(trainer.config(), 10, trainer.data().describe(), "");
      return trainer.resume(c, "saved");
    });
    ASSERT_EQ(runs[0].error, "");
    std::vector<double> tail(straight[0].losses.begin() + 10, straight[0].losses.end());
    EXPECT_LT(maxRelativeDifference(runs[0].losses, tail), 2e-5);
  }
}

TEST(ShardedOptimizer, Fp8WeightsGatherTheirCodesWithTheFp32GathersBits) {
  // FP8 weights between steps under ZeRO-2: each rank quantizes its updated shard and the codes
  // are gathered (a byte a parameter, not 4); the master weight stays a shard. Per-tensor
  // quantization is elementwise at the scale every rank shares, and the amaxes' maximum and the
  // counts' sum are the whole's: the same losses and tensors, bit for bit, as the fp32 gather
  // with the weights quantized in the forward.
  ModelConfig config = parityConfig();
  config.precision.recipe = Recipe::Fp8;
  config.precision.fp8MinDim = 0;
  config.train.shardOptimizer = config.train.shardGradients = true;
  std::vector<RankRun> fp32 = train(config, 4, 16);
  config.precision.fp8Weights = true;
  std::vector<RankRun> fp8 = train(config, 4, 16);
  ASSERT_EQ(fp32[0].error, "");
  for (const RankRun &r : fp8) {
    ASSERT_EQ(r.error, "");
    EXPECT_EQ(r.losses, fp32[0].losses);
  }
  EXPECT_LT(fp8[0].losses.back(), fp8[0].losses.front() - 0.5);
  // The checkpoint holds the whole weights (gathered from the shards), as the fp32 gather's.
  EXPECT_EQ(fp8[0].state.at("h0.mlp.fc1.weight").type, fp32[0].state.at("h0.mlp.fc1.weight").type);
  EXPECT_EQ(compareStates(fp8[0], fp8[3], fp32[0]), 0.0);
  // ZeRO-1 (the gradients all-reduced whole, each rank updating its part): the same bits too.
  config.train.shardGradients = false;
  std::vector<RankRun> zeroOne = train(config, 4, 16);
  ASSERT_EQ(zeroOne[0].error, "");
  EXPECT_EQ(zeroOne[2].losses, fp32[0].losses);
  EXPECT_EQ(compareStates(zeroOne[0], zeroOne[2], fp32[0]), 0.0);
  config.train.shardGradients = true;

  // Saved at step 10 and resumed: the shards cut from the whole weights, their codes made again
  // by the prologue (gathered over the ranks there too): on 4 ranks the same bits as straight on,
  // on 2 the same run but for the order of the sums.
  std::vector<RankRun> first = train(config, 4, 10);
  ASSERT_EQ(first[0].error, "");
  for (int ranks : {4, 2}) {
    SCOPED_TRACE(fmt::format("resumed on {}", ranks));
    std::vector<RankRun> runs = train(config, ranks, 6, [&](Trainer &trainer) {
      Checkpoint c;
      c.tensors = first[0].state;
      c.meta = checkpointMetadata(trainer.config(), 10, trainer.data().describe(), "");
      return trainer.resume(c, "saved");
    });
    ASSERT_EQ(runs[0].error, "");
    std::vector<double> tail(fp8[0].losses.begin() + 10, fp8[0].losses.end());
    if (ranks == 4)
      EXPECT_EQ(runs[0].losses, tail);
    else
      EXPECT_LT(maxRelativeDifference(runs[0].losses, tail), 2e-3);
  }
}

TEST(ShardedOptimizer, Fp8WeightsAreShardsWhoseCodesOneAllGatherRebuilds) {
  ModelConfig config = parityConfig();
  config.precision.recipe = Recipe::Fp8;
  config.precision.fp8MinDim = 0;
  config.precision.fp8Weights = true;
  DataParallelOptions dataParallel;
  dataParallel.ranks = 4;
  dataParallel.rank = 2;
  dataParallel.shardOptimizer = dataParallel.shardGradients = true;
  auto graph = unwrap(buildGPT(config, 4));
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.precision = config.precision;
  options.passOptions.dataParallel = dataParallel;
  auto pipeline = unwrap(PassPipeline::create(cpuPipeline(true, config.precision), options));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  int fp8Gathers = 0, fp32Gathered = 0, shards = 0, wholeParams = 0;
  for (const Op *op : graph->ops()) {
    if (op->kind() == OpKind::AllGather && isFp8(op->operand(0)->type().dtype)) {
      ++fp8Gathers;
      EXPECT_EQ(op->numOperands(), 4u * unsigned(config.layers) + 1); // qkv, proj, fc1, fc2; the head
    } else if (op->kind() == OpKind::AllGather) {
      for (const Value *v : op->operands()) // the updates of whole parameters alone
        EXPECT_FALSE(v->def()->operand(0)->def()->attrs().has("whole")) << v->name();
      fp32Gathered += int(op->numOperands());
    }
    if (op->kind() != OpKind::Param)
      continue;
    if (!op->attrs().has("whole")) {
      ++wholeParams;
      continue;
    }
    // rank 2's quarter of each linear weight: its shard, which AdamW reads and updates as it is.
    ++shards;
    auto whole = *op->attrs().getInts("whole");
    EXPECT_EQ(op->attrs().getInt("rank"), 2);
    EXPECT_EQ(op->result()->type(), TensorType(DType::F32, {(whole[0] * whole[1] + 3) / 4}));
    for (const Op *user : op->result()->users())
      EXPECT_TRUE(user->kind() == OpKind::AdamW ||
                  (user->kind() == OpKind::Assign && user->operand(1)->def()->kind() == OpKind::AdamW))
          << user->name().str();
  }
  EXPECT_EQ(fp8Gathers, 1);
  EXPECT_EQ(shards, 4 * config.layers + 1);
  EXPECT_EQ(fp32Gathered, wholeParams); // the embeddings, norms and biases
}

} // namespace

namespace {

TEST(Bf16GradientReduce, RanksFollowFp32ReductionWithinBf16sRounding) {
  // grad_reduce: bf16: every gradient crosses the ranks rounded to BF16 and comes back rounded:
  // the ranks still agree bit for bit, the losses move (the option does something) and stay
  // within BF16's rounding of the fp32 reduction's over 20 steps, sharded or not.
  ModelConfig config = parityConfig();
  std::vector<RankRun> fp32 = train(config, 2, 20);
  config.train.bf16GradientReduce = true;
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "sharded" : "unsharded");
    config.train.shardOptimizer = config.train.shardGradients = shard;
    std::vector<RankRun> bf16 = train(config, 2, 20);
    ASSERT_EQ(bf16[0].error, "");
    ASSERT_EQ(bf16[1].error, "");
    EXPECT_EQ(bf16[0].losses, bf16[1].losses);
    compareStates(bf16[0], bf16[1], fp32[0]); // the same bits on both ranks
    EXPECT_NE(bf16[0].losses, fp32[0].losses);
    EXPECT_EQ(bf16[0].losses[0], fp32[0].losses[0]); // (the first loss is before any update)
    EXPECT_LT(maxRelativeDifference(bf16[0].losses, fp32[0].losses), 5e-3);
  }
}

} // namespace
