// Data-parallel training on two GPUs through NCCL against one GPU (DataParallelTest.cpp's
// twin). Skipped where there are fewer than two GPUs.
#include "tests/backends/cuda/GpuTestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

/// `steps` steps of `config` as `ranks` data-parallel ranks on GPUs 0 .. ranks - 1 through NCCL
/// (threads of this process), or on GPU 0 alone when `ranks` is 1.
std::vector<RankRun> trainOnGpus(const ModelConfig &config, int ranks, int64_t steps) {
  NcclUniqueId id{};
  if (ranks > 1) {
    const NcclApi *api = unwrap(loadNccl());
    EXPECT_EQ(api->getUniqueId(&id), 0);
  }
  std::vector<std::unique_ptr<NcclCommunicator>> communicators(ranks); // each rank's, kept past its trainer
  return trainRanks(config, ranks, steps, [&](int r) -> llvm::Expected<RankPlace> {
    if (ranks > 1) {
      auto made = NcclCommunicator::create(id, r, ranks, r);
      if (!made)
        return made.takeError();
      communicators[r] = std::move(*made);
    }
    auto device = detectCudaDevice(r);
    if (!device)
      return device.takeError();
    return RankPlace{*device, communicators[r].get()};
  });
}

/// Each input of `graph` drawn from a normal distribution (a fresh seed).
std::map<std::string, Tensor> normalInputs(const Graph &graph) {
  Rng rng(freshSeed());
  std::map<std::string, Tensor> inputs;
  for (const Op *op : graph.ops())
    if (op->kind() == OpKind::Input) {
      Tensor t = Tensor::zeros(op->result()->type());
      for (float &v : t.data)
        v = float(rng.normal());
      inputs[op->result()->name()] = std::move(t);
    }
  return inputs;
}

/// `graph` run on the CPU and on the GPU from `leaves`: `results` results, each the CPU's bits.
/// Returns the GPU's.
std::vector<Tensor> expectTheCpusBits(const Graph &graph, const std::map<std::string, Tensor> &leaves, size_t results) {
  std::vector<Tensor> want, got;
  runOnBoth(graph, leaves, want, got);
  EXPECT_EQ(got.size(), results);
  for (size_t r = 0; r < got.size() && r < want.size(); ++r)
    EXPECT_EQ(got[r].data, want[r].data) << "result " << r;
  return got;
}

/// `bf16Gradients`: the two GPUs' gradients cross in BF16 (grad_reduce: bf16); `shard`: the two
/// GPUs shard AdamW's state and the gradients (ZeRO-2); one GPU has nothing to reduce or shard.
/// `fp8Weights`: both keep the FP8 weights between steps (sharded: their codes gathered).
void expectTwoGpusFollowOne(Recipe recipe, double tolerance, bool bf16Gradients = false, bool shard = false,
                            bool fp8Weights = false) {
  if (auto gpu = detectCudaDevice(1); !gpu) {
    GTEST_SKIP() << "needs two GPUs: " << llvm::toString(gpu.takeError());
  }
  if (auto nccl = loadNccl(); !nccl) {
    GTEST_SKIP() << llvm::toString(nccl.takeError());
  }
  ModelConfig config = unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml")));
  config.precision.recipe = recipe;
  config.precision.fp8MinDim = 0; // under fp8, every linear layer
  config.train.steps = 50;
  config.precision.fp8Weights = fp8Weights;
  std::vector<RankRun> one = trainOnGpus(config, 1, 50);
  config.train.bf16GradientReduce = bf16Gradients;
  config.train.shardOptimizer = config.train.shardGradients = shard;
  std::vector<RankRun> two = trainOnGpus(config, 2, 50);
  ASSERT_EQ(one[0].error, "");
  ASSERT_EQ(two[0].error, "");
  ASSERT_EQ(two[1].error, "");
  ASSERT_EQ(two[0].losses.size(), 50u);
  EXPECT_EQ(two[0].losses, two[1].losses);
  double worst = 0;
  for (size_t i = 0; i < 50; ++i)
    worst = std::max(worst, std::abs(two[0].losses[i] / one[0].losses[i] - 1));
  std::printf("%s, 50 steps: loss on 2 GPUs vs 1 at most %.3g apart (relative); first %.6f vs %.6f, last %.6f vs "
              "%.6f\n",
              recipeName(recipe).str().c_str(), worst, two[0].losses[0], one[0].losses[0], two[0].losses.back(),
              one[0].losses.back());
  EXPECT_LT(worst, tolerance);
  EXPECT_LT(two[0].losses.back(), two[0].losses.front() - 0.5); // it trains
  // Every parameter, moment and FP8 scaling tensor: the same bits on both GPUs (sharded, each
  // rank's moments are its own shard).
  int fp8 = 0;
  for (const auto &[name, t] : two[0].state) {
    if (shard && (llvm::StringRef(name).ends_with(".adam_m") || llvm::StringRef(name).ends_with(".adam_v")))
      continue;
    EXPECT_EQ(t.data, two[1].state.at(name).data) << name << " differs between the ranks";
    fp8 += llvm::StringRef(name).ends_with(".scale");
  }
  if (recipe == Recipe::Fp8) {
    EXPECT_GT(fp8, 10);
  }
}

TEST(GpuDataParallel, TwoGpusFollowOneGpuInBf16For50Steps) { expectTwoGpusFollowOne(Recipe::Bf16, 5e-3); }
TEST(GpuDataParallel, TwoGpusFollowOneGpuInFp8For50StepsWithTheSameScales) {
  expectTwoGpusFollowOne(Recipe::Fp8, 2e-2);
}
TEST(GpuDataParallel, TwoGpusReducingGradientsInBf16FollowOneGpu) {
  // NCCL's BF16 all-reduce through the staging buffer (runtime/Collectives.cpp), within the
  // bound the CPU ranks meet against fp32 reduction (Bf16GradientReduce in DataParallelTest).
  expectTwoGpusFollowOne(Recipe::Bf16, 5e-3, true);
}

TEST(GpuDataParallel, TwoGpusShardingTheOptimizerFollowOneGpu) {
  // ZeRO-2 through NCCL's reduce-scatter and all-gather (runtime/Collectives.cpp), the shards
  // taken by the layout family's kernel; the sharded state's rows of DataParallelTest's CPU
  // twin (ShardedOptimizer) hold within the unsharded BF16 bound.
  expectTwoGpusFollowOne(Recipe::Bf16, 5e-3, false, true);
}

TEST(GpuDataParallel, TwoGpusShardingFp8WeightsGatherTheirCodes) {
  // ZeRO-2 with the FP8 weights kept between steps: each GPU quantizes its updated shard and
  // NCCL gathers the codes as bytes (ShardedFp8Weights.h), the prologue's gather included.
  expectTwoGpusFollowOne(Recipe::Fp8, 2e-2, false, true, true);
}

TEST(GpuDataParallel, OneGpuRunsZerosOpsAsTheCpu) {
  // reduce_scatter and all_gather over one rank (the whole operand flattened; the one part),
  // in fp32 and with BF16 on the wire, and shard's part of a parameter, rank 1 of 2 (zeros past
  // the end): the CPU's bits.
  SKIP_WITHOUT_GPU();
  auto graph = unwrap(parseGraph(
      "graph @g\n%x = input() : f32[5,3]\n%p = input() : f32[7]\n"
      "%r = reduce_scatter(%x) {rank=0, ranks=1, reduce=\"avg\"} : f32[15]\n"
      "%b = reduce_scatter(%x) {dtype=\"bf16\", rank=0, ranks=1, reduce=\"avg\"} : f32[15]\n"
      "%s = shard(%p) {rank=1, ranks=2} : f32[4]\n%t = shard(%p) {rank=0, ranks=1} : f32[7]\n"
      "%g = all_gather(%t) {ranks=1} : f32[7]\nreturn %r, %b, %s, %g\n",
      "zero.ir"));
  ASSERT_TRUE(graph);
  std::map<std::string, Tensor> leaves = normalInputs(*graph);
  std::vector<Tensor> got = expectTheCpusBits(*graph, leaves, 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].data, leaves["x"].data);
  EXPECT_EQ(got[2].data, (std::vector<float>{leaves["p"].data[4], leaves["p"].data[5], leaves["p"].data[6], 0.0f}));
  EXPECT_EQ(got[3].data, leaves["p"].data);
}

TEST(GpuDataParallel, OneGpuGathersFp8CodesThatAGemmReadsAsTheCpu) {
  // A shard's FP8 codes all-gathered (one rank: the one part, as bytes), viewed in the weight's
  // shape and read by an FP8 GEMM, which finds their scale through the gather
  // (ShardedFp8Weights.h): the gathered codes and the amax the CPU's bits, the product within
  // the accumulation error of FP8 products (1e-4 of the largest; GpuTrainTest) of the CPU's.
  SKIP_WITHOUT_GPU();
  auto graph = unwrap(parseGraph(
      "graph @g\n%x = input() : f32[16,32]\n%w = input() : f32[1536]\n%s = input() : f32[]\n%si = input() : f32[]\n"
      "%qw, %wa, %wc = quantize(%w, %s, %si) {format=\"e4m3\"} : f8e4m3[1536], f32[], f32[]\n"
      "%g = all_gather(%qw) {ranks=1} : f8e4m3[1536]\n"
      "%f = slice(%g) {axis=0, size=1536, start=0} : f8e4m3[1536]\n"
      "%wq = reshape(%f) {shape=[48,32]} : f8e4m3[48,32]\n"
      "%qx, %xa, %xc = quantize(%x, %s, %si) {format=\"e4m3\"} : f8e4m3[16,32], f32[], f32[]\n"
      "%y = matmul(%qx, %wq) {transpose_b=true} : f32[16,48]\nreturn %y, %g, %wa\n",
      "fp8-gather.ir"));
  ASSERT_TRUE(graph);
  std::map<std::string, Tensor> leaves = normalInputs(*graph);
  leaves["s"].data = {16.0f};
  leaves["si"].data = {1.0f / 16};
  std::vector<Tensor> want, got;
  runOnBoth(*graph, leaves, want, got);
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  EXPECT_EQ(got[1].data, want[1].data);
  EXPECT_EQ(got[2].data, want[2].data);
  double scale = 0, worst = 0;
  for (size_t i = 0; i < want[0].data.size(); ++i) {
    scale = std::max(scale, double(std::abs(want[0].data[i])));
    worst = std::max(worst, double(std::abs(got[0].data[i] - want[0].data[i])));
  }
  EXPECT_GT(scale, 1.0);
  EXPECT_LE(worst, 1e-4 * scale); // an H100: 4e-4 at a scale of 14 (its FP8 products keep fewer bits)
}

/// ZeRO's update of rank 1 of 2 written out for three parameters (one without weight decay),
/// on the GPU against the CPU's bits: the new shards, the norm and the clip. Under ZeRO-2
/// (`zeroOne` false) the gradients come as shards; under ZeRO-1 whole, their shards taken first.
void expectZeroUpdateAsTheCpu(bool zeroOne) {
  std::string ir = "graph @g\n%lr = input() : f32[]\n%step = input() : i32[]\n";
  const int64_t sizes[] = {7, 10, 33};
  std::string sums, updates, results;
  for (int k = 1; k <= 3; ++k) {
    int64_t n = sizes[k - 1], part = (n + 1) / 2;
    ir += zeroOne ? fmt::format("%p{0} = input() : f32[{1}]\n%w{0} = input() : f32[{1}]\n"
                                "%g{0} = shard(%w{0}) {{rank=1, ranks=2}} : f32[{2}]\n",
                                k, n, part)
                  : fmt::format("%p{0} = input() : f32[{1}]\n%g{0} = input() : f32[{2}]\n", k, n, part);
    sums += fmt::format("%q{0} = sum_squares(%g{0}) : f32[]\n", k);
    updates += fmt::format("%s{0} = shard(%p{0}) {{rank=1, ranks=2}} : f32[{1}]\n"
                           "%m{0} = state() {{init=\"zeros\"}} : f32[{1}]\n%v{0} = state() {{init=\"zeros\"}} : f32[{1}]\n"
                           "%n{0}, %n{0}.m, %n{0}.v = adamw(%s{0}, %g{0}, %m{0}, %v{0}, %lr, %clip, %step) "
                           "{{beta1=0.9, beta2=0.95, eps=1e-08, weight_decay={2}}} : f32[{1}], f32[{1}], f32[{1}]\n"
                           "assign(%m{0}, %n{0}.m)\nassign(%v{0}, %n{0}.v)\n",
                           k, part, k == 2 ? "0.0" : "0.1");
    results += fmt::format("%n{}, ", k);
  }
  ir += sums + "%a = add(%q1, %q2) : f32[]\n%local = add(%a, %q3) : f32[]\n"
               "%total = all_reduce(%local) {reduce=\"sum\"} : f32[]\n%clip = clip_scale(%total) {max_norm=1.0} : f32[]\n" +
        updates + "return " + results + "%total, %clip\n";
  auto graph = unwrap(parseGraph(ir, "zero-update.ir"));
  ASSERT_TRUE(graph);
  std::map<std::string, Tensor> leaves = normalInputs(*graph);
  leaves["lr"].data = {0.01f};
  leaves["step"] = Tensor{TensorType(DType::I32, {}), {}, {3}};
  Rng rng(freshSeed());
  for (const Op *op : graph->ops()) // the moments as earlier steps leave them: m any, v positive
    if (op->kind() == OpKind::State) {
      Tensor moment = Tensor::zeros(op->result()->type());
      bool second = op->result()->name()[0] == 'v';
      for (float &x : moment.data) {
        double r = rng.normal();
        x = second ? float(0.01 * r * r + 1e-4) : float(0.1 * r);
      }
      leaves[op->result()->name()] = std::move(moment);
    }
  std::vector<Tensor> got = expectTheCpusBits(*graph, leaves, 5);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_NE(got[0].data, std::vector<float>(4, 0.0f));
}


TEST(GpuDataParallel, OneGpuUpdatesZerosShardsInALaunchEachAsTheCpu) {
  // The shards, the gradient norm's sums (ended by the ranks' all_reduce) and AdamW each run as
  // one launch over the executor's address table (OptimizerGroups.cpp); ZeRO-1's gradient
  // shards as a launch of their own, before the norm reads them.
  SKIP_WITHOUT_GPU();
  for (bool zeroOne : {false, true}) {
    SCOPED_TRACE(zeroOne ? "ZeRO-1" : "ZeRO-2");
    expectZeroUpdateAsTheCpu(zeroOne);
  }
}

TEST(GpuDataParallel, OneGpuRoundsABf16AllReduceAsTheCpu) {
  // all_reduce {dtype = "bf16"} over one rank: each result is its operand rounded to BF16 (to
  // nearest, even), the CPU's bits, written in place and into a buffer of its own alike.
  SKIP_WITHOUT_GPU();
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[37,5]\n%y = input() : f32[3]\n"
                                 "%a, %b = all_reduce(%x, %y) {dtype=\"bf16\", reduce=\"avg\"} : f32[37,5], f32[3]\n"
                                 "%c = add(%a, %a) : f32[37,5]\nreturn %c, %b\n",
                                 "bf16.ir"));
  ASSERT_TRUE(graph);
  std::map<std::string, Tensor> leaves = normalInputs(*graph);
  std::vector<Tensor> got = expectTheCpusBits(*graph, leaves, 2);
  ASSERT_EQ(got.size(), 2u);
  int rounded = 0;
  for (size_t i = 0; i < leaves["x"].data.size(); ++i) {
    EXPECT_EQ(got[0].data[i], 2 * roundToBf16(leaves["x"].data[i]));
    rounded += got[0].data[i] != 2 * leaves["x"].data[i];
  }
  EXPECT_GT(rounded, 0);
}


} // namespace
