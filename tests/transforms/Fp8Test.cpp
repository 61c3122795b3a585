// FP8 delayed scaling: TE's scale update, the quantize kernel, and the tiny model trained with
// the fp8 recipe on the CPU (emulated) against its fp32 run.
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "ir/Attributes.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "driver/Program.h"
#include "app/Checkpoint.h"
#include "backends/cpu/Fp8Scaling.h"
#include "app/Generate.h"
#include "backends/cpu/Interpreter.h"
#include "app/Trainer.h"
#include "tests/StepLeaves.h"
#include "tests/TestUtil.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <tuple>

using namespace tgc;
using namespace tgc::test;

namespace {

ScalingState stateWith(std::vector<float> history, float scale = 1.0f) {
  ScalingState s;
  s.scale = scale;
  s.scaleInv = 1.0f / scale;
  s.amaxHistory = std::move(history);
  return s;
}

TEST(Fp8Scaling, FirstStepQuantizesWithScaleOne) {
  ScalingState fresh;
  EXPECT_EQ(fresh.scale, 1.0f);
  EXPECT_EQ(fresh.scaleInv, 1.0f);
}

TEST(Fp8Scaling, ScaleIsMaxOverAmaxWithMargin) {
  ScalingState s = stateWith({2.0f, 0, 0, 0});
  updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.scale, 448.0f / 2.0f);
  EXPECT_EQ(s.scaleInv, 1.0f / 224.0f);
  ScalingState m = stateWith({2.0f, 0, 0, 0});
  updateScaling(m, Fp8Format::E5M2, 3, AmaxAlgo::Max);
  EXPECT_EQ(m.scale, 57344.0f / 2.0f / 8.0f);
}

TEST(Fp8Scaling, ZeroInfAndNaNAmaxKeepTheOldScale) {
  for (float bad : {0.0f, INFINITY, NAN}) {
    ScalingState s = stateWith({bad, 0, 0}, 7.0f);
    updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::MostRecent);
    EXPECT_EQ(s.scale, 7.0f) << bad;
    EXPECT_EQ(s.scaleInv, 1.0f / 7.0f) << bad;
  }
  // A NaN anywhere in the window poisons the max: the old scale stays.
  ScalingState s = stateWith({1.0f, NAN, 3.0f}, 5.0f);
  updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.scale, 5.0f);
}

TEST(Fp8Scaling, TinyAmaxGivesFltMaxNotInf) {
  ScalingState s = stateWith({1e-45f});
  updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.scale, FLT_MAX);
  EXPECT_EQ(s.scaleInv, 1.0f / FLT_MAX);
}

TEST(Fp8Scaling, MaxUsesTheWholeWindowMostRecentTheCurrentSlot) {
  ScalingState a = stateWith({1.0f, 4.0f, 2.0f, 8.0f});
  updateScaling(a, Fp8Format::E4M3, 0, AmaxAlgo::Max);
  EXPECT_EQ(a.scale, 448.0f / 8.0f);
  ScalingState b = stateWith({1.0f, 4.0f, 2.0f, 8.0f});
  updateScaling(b, Fp8Format::E4M3, 0, AmaxAlgo::MostRecent);
  EXPECT_EQ(b.scale, 448.0f);
}

TEST(Fp8Scaling, RollMovesTheCurrentAmaxToTheEndAndClearsSlotZero) {
  // TE: new[i] = old[i+1], new[L-1] = old[0], then new[0] = 0 (old[1] is dropped).
  ScalingState s = stateWith({5.0f, 1.0f, 2.0f, 3.0f});
  updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::Max);
  EXPECT_EQ(s.amaxHistory, (std::vector<float>{0.0f, 2.0f, 3.0f, 5.0f}));
}

TEST(Fp8Scaling, HistoryLengthsOneSixteenAnd1024) {
  for (size_t length : {size_t(1), size_t(16), size_t(1024)}) {
    SCOPED_TRACE(length);
    ScalingState s = stateWith(std::vector<float>(length, 0.0f));
    // A spike at step 1, then small amaxes: with max, the spike sets the scale as long as it
    // is in the window (length - 1 further steps, slot 0 being cleared at each roll).
    std::vector<float> amaxes{100.0f};
    amaxes.resize(length + 2, 1.0f);
    for (size_t step = 0; step < amaxes.size(); ++step) {
      s.amaxHistory[0] = amaxes[step];
      updateScaling(s, Fp8Format::E4M3, 0, AmaxAlgo::Max);
      bool spikeInWindow = step < length;
      EXPECT_EQ(s.scale, 448.0f / (spikeInWindow ? 100.0f : 1.0f)) << "step " << step;
    }
  }
}

TEST(Quantize, RoundsScaledValuesRecordsAmaxAndCountsSaturation) {
  auto g = unwrap(parseGraph("graph @q\n%x = input() : f32[5]\n%s = input() : f32[]\n"
                             "%si = input() : f32[]\n"
                             "%q, %amax, %sat = quantize(%x, %s, %si) {format=\"e4m3\"} : "
                             "f8e4m3[5], f32[], f32[]\nreturn %q, %amax, %sat\n",
                             "q.ir"));
  ASSERT_TRUE(g);
  Interpreter interp(*g);
  ASSERT_FALSE(bool(interp.bind("x", Tensor{TensorType(DType::F32, {5}), {1.0f, -0.3f, 100.0f, 0.0f, -2.6f}, {}})));
  ASSERT_FALSE(bool(interp.bind("s", Tensor{TensorType(DType::F32, {}), {8.0f}, {}})));
  ASSERT_FALSE(bool(interp.bind("si", Tensor{TensorType(DType::F32, {}), {0.125f}, {}})));
  auto out = unwrap(interp.run());
  ASSERT_EQ(out.size(), 3u);
  // x * 8 in E4M3: 8, -2.4 -> -2.5, 800 -> 448 (saturated), 0, -20.8 -> -20; then / 8.
  EXPECT_EQ(out[0].data, (std::vector<float>{1.0f, -0.3125f, 56.0f, 0.0f, -2.5f}));
  EXPECT_EQ(out[1].data[0], 100.0f);
  EXPECT_EQ(out[2].data[0], 1.0f);
}

TEST(Quantize, CurrentScalingTakesTheScaleOfTheTensorsOwnAmax) {
  // {scaling="current", margin=M}: scale = (448 / amax) / 2^M from this tensor, whatever the
  // state's scale says (here 1e6: under delayed scaling everything would saturate); nothing
  // saturates, the largest value lands on 448 / 2^M exactly; an all-zero tensor takes scale 1.
  for (int margin : {0, 1}) {
    SCOPED_TRACE(margin);
    auto g = unwrap(parseGraph(fmt::format("graph @q\n%x = input() : f32[4]\n%s = input() : f32[]\n"
                                           "%si = input() : f32[]\n"
                                           "%q, %amax, %sat = quantize(%x, %s, %si) {{format=\"e4m3\", margin={}, "
                                           "scaling=\"current\"}} : f8e4m3[4], f32[], f32[]\nreturn %q, %amax, %sat\n",
                                           margin),
                               "q.ir"));
    ASSERT_TRUE(g);
    for (bool zeros : {false, true}) {
      std::vector<float> x = zeros ? std::vector<float>(4, 0.0f) : std::vector<float>{3.5f, -0.01f, -7.0f, 0.3f};
      Interpreter interp(*g);
      ASSERT_FALSE(bool(interp.bind("x", Tensor{TensorType(DType::F32, {4}), x, {}})));
      ASSERT_FALSE(bool(interp.bind("s", Tensor{TensorType(DType::F32, {}), {1e6f}, {}})));
      ASSERT_FALSE(bool(interp.bind("si", Tensor{TensorType(DType::F32, {}), {1e-6f}, {}})));
      auto out = unwrap(interp.run());
      ASSERT_EQ(out.size(), 3u);
      EXPECT_EQ(out[2].data[0], 0.0f); // no saturation
      if (zeros) {
        EXPECT_EQ(out[1].data[0], 0.0f);
        EXPECT_EQ(out[0].data, x);
        continue;
      }
      EXPECT_EQ(out[1].data[0], 7.0f);
      float scale = (448.0f / 7.0f) / float(1 << margin);
      EXPECT_EQ(scale, currentScale(7.0f, Fp8Format::E4M3, margin));
      // -7 * scale = -448 / 2^margin, an E4M3 value: it comes back exactly.
      EXPECT_EQ(out[0].data[2], -7.0f);
      for (size_t i = 0; i < x.size(); ++i) // each within E4M3's half-ulp (2^-4 relative) of x
        EXPECT_NEAR(out[0].data[i], x[i], std::fabs(x[i]) * 0.0625f + 1e-6f) << i;
    }
  }
}

TEST(Quantize, ScalingAttributesAreChecked) {
  auto parse = [](const std::string &attrs) {
    return parseGraph("graph @q\n%x = input() : f32[4]\n%s = input() : f32[]\n%si = input() : f32[]\n"
                      "%q, %amax, %sat = quantize(%x, %s, %si) {format=\"e4m3\"" +
                          attrs + "} : f8e4m3[4], f32[], f32[]\nreturn %q\n",
                      "q.ir");
  };
  EXPECT_TRUE(bool(parse(", margin=0, scaling=\"current\"")));
  for (const char *bad : {", scaling=\"later\", margin=0", ", scaling=\"current\"", ", margin=1",
                          ", margin=65, scaling=\"current\""}) {
    auto g = parse(bad);
    EXPECT_FALSE(bool(g)) << bad;
    if (!g)
      llvm::consumeError(g.takeError());
  }
}

TEST(GpuPolicy, AutoPicksByComputeCapabilityAndRefusesWhatTheGpuCannotRun) {
  EXPECT_EQ(gpuRecipeFor(90), Recipe::Fp8); // H100, H200
  EXPECT_EQ(gpuRecipeFor(89), Recipe::Fp8); // Ada
  EXPECT_EQ(gpuRecipeFor(86), Recipe::Bf16);
  EXPECT_EQ(gpuRecipeFor(80), Recipe::Bf16); // A100
  EXPECT_EQ(gpuRecipeFor(75), Recipe::Fp32);
  EXPECT_FALSE(bool(checkGpuRecipe(Recipe::Fp8, 90)));
  EXPECT_FALSE(bool(checkGpuRecipe(Recipe::Bf16, 80)));
  EXPECT_FALSE(bool(checkGpuRecipe(Recipe::Fp32, 70)));
  EXPECT_EQ(errorOf(checkGpuRecipe(Recipe::Fp8, 80)),
            "error: the fp8 recipe needs a GPU of compute capability 8.9 or later; this one is 8.0 "
            "(--precision fp32, or --device cpu to emulate it)");
  EXPECT_NE(errorOf(checkGpuRecipe(Recipe::Bf16, 75)).find("compute capability 8.0 or later; this one is 7.5"),
            std::string::npos);
}

/// `graph` (built from `c`) through `passes`, with c's training and precision settings.
std::unique_ptr<Graph> runPasses(std::unique_ptr<Graph> graph, const ModelConfig &c,
                                 const std::vector<std::string> &passes) {
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision;
  auto pipeline = unwrap(PassPipeline::create(passes, options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// The tiny fp8 training program, with `extra` passes before the final dce (and train.recompute
/// as `recompute` says).
std::unique_ptr<Graph> tinyFp8Program(std::vector<std::string> extra, bool fp8Head = false, bool recompute = false) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.train.recompute = recompute;
  if (fp8Head)
    c.precision.keepBf16.clear();
  auto graph = unwrap(buildGPT(c, 4));
  if (!graph)
    return nullptr;
  std::vector<std::string> passes = trainingPipeline();
  passes.insert(passes.end() - 1, extra.begin(), extra.end());
  return runPasses(std::move(graph), c, passes);
}

/// One training step of `plain` and `other` on the same random parameters and batch: the same
/// bits in every output, parameter, AdamW moment and FP8 scaling state.
void expectTheSameStep(const Graph &plain, const Graph &other) {
  std::map<std::string, Tensor> leaves = randomStepLeaves(plain, freshSeed());
  Interpreter a(plain), b(other);
  ASSERT_FALSE(bool(a.bindAll(leaves)));
  ASSERT_FALSE(bool(b.bindAll(leaves)));
  auto outA = unwrap(a.run()), outB = unwrap(b.run());
  ASSERT_EQ(outA.size(), outB.size());
  for (size_t i = 0; i < outA.size(); ++i)
    EXPECT_EQ(outA[i].data, outB[i].data) << plain.outputs()[i]->name();
  int leavesCompared = 0;
  for (const Op *op : plain.ops())
    if (op->kind() == OpKind::Param || op->kind() == OpKind::State) {
      std::string name = op->result()->name();
      EXPECT_EQ(unwrap(a.read(name)).data, unwrap(b.read(name)).data) << name;
      ++leavesCompared;
    }
  EXPECT_GT(leavesCompared, 100);
}

TEST(FuseGeluQuantize, Fc2QuantizesTheGeluOfItsPreActivationAndNoBitChanges) {
  // fc2's input from the GELU of fc1's pre-activation; fc1's output gradient from the GELU's
  // gradient (with fc1's bias gradient, which fuse-gelu-bias-grad put on gelu_backward).
  auto plain = tinyFp8Program({"legalize-fp8-gemm", "fuse-gelu-bias-grad"});
  auto fused = tinyFp8Program({"legalize-fp8-gemm", "fuse-gelu-bias-grad", "fuse-gelu-quantize"});
  ASSERT_TRUE(plain && fused);
  int geluQuantizes = 0, gradientQuantizes = 0, gelus = 0;
  for (const Op *op : fused->ops()) {
    gelus += op->kind() == OpKind::Gelu || op->kind() == OpKind::GeluBackward;
    QuantizeOptions options = quantizeOptions(op->attrs());
    if (op->kind() != OpKind::Quantize || options.activation == QuantizeActivation::None)
      continue;
    bool gradient = options.activation == QuantizeActivation::GeluBackward;
    ++(gradient ? gradientQuantizes : geluQuantizes);
    EXPECT_NE(op->result()->name().find(gradient ? "fc1.fp8.grad_output.q" : "fc2.fp8.input.q"), std::string::npos)
        << op->result()->name();
    if (gradient) {
      EXPECT_TRUE(options.biasGrad);
      ASSERT_EQ(op->numResults(), 5u);
      EXPECT_NE(op->result(4)->name().find("fc1.bias.grad"), std::string::npos) << op->result(4)->name();
    }
  }
  EXPECT_EQ(geluQuantizes, 2); // one per layer
  EXPECT_EQ(gradientQuantizes, 2);
  EXPECT_EQ(gelus, 0);
  expectTheSameStep(*plain, *fused);
}

TEST(FuseQuantizeBiasGrad, TheQkvBiasGradientComesFromItsCastTransposeAndNoBitChanges) {
  // The qkv projection's bias gradient, summed from the attention's gradient that the qkv
  // GEMMs' cast-transpose reads: one pass over it instead of two, the same sums on the CPU. Here
  // (no fuse-norm-bias-grad before it, as the GPU pipeline has) the proj's and fc2's too.
  std::vector<std::string> before = {"legalize-fp8-gemm", "fuse-gelu-bias-grad", "fuse-gelu-quantize"};
  auto plain = tinyFp8Program(before);
  before.push_back("fuse-quantize-bias-grad");
  auto fused = tinyFp8Program(before);
  ASSERT_TRUE(plain && fused);
  int summing = 0, reduces = 0;
  for (const Op *op : fused->ops()) {
    reduces += op->kind() == OpKind::ReduceTo && op->result()->name().find("bias.grad") != std::string::npos;
    QuantizeOptions options = quantizeOptions(op->attrs());
    if (op->kind() != OpKind::Quantize || !options.biasGrad || options.activation != QuantizeActivation::None)
      continue;
    ++summing;
    EXPECT_TRUE(options.transpose);
    ASSERT_EQ(op->numResults(), 5u);
    const std::string &site = op->result()->name(), &sum = op->result(4)->name();
    EXPECT_EQ(sum, site.substr(0, site.find(".fp8.grad_output.q")) + ".bias.grad") << site;
  }
  EXPECT_EQ(summing, 6); // qkv, proj and fc2, each layer (fc1's: its GELU gradient's quantize)
  EXPECT_EQ(reduces, 0);
  expectTheSameStep(*plain, *fused);
}

TEST(FuseCrossEntropyQuantize, AnFp8HeadsGradientIsMadeByTheQuantizeOfTheLogitsAndNoBitChanges) {
  // The LM head in FP8: the loss and its dlogits come from the quantize that reads the logits
  // (no cross_entropy op left, no dlogits in fp32), the same loss, FP8 bytes and scaling state
  // on the CPU as the loss, then the cast-transpose of its gradient.
  std::vector<std::string> before = {"legalize-fp8-gemm", "fuse-cross-entropy-grad"};
  auto plain = tinyFp8Program(before, /*fp8Head=*/true);
  before.push_back("fuse-cross-entropy-quantize");
  auto fused = tinyFp8Program(before, /*fp8Head=*/true);
  ASSERT_TRUE(plain && fused);
  int fusedQuantizes = 0, losses = 0;
  for (const Op *op : fused->ops()) {
    losses += op->kind() == OpKind::CrossEntropy || op->kind() == OpKind::CrossEntropyBackward;
    if (op->kind() != OpKind::Quantize ||
        quantizeOptions(op->attrs()).activation != QuantizeActivation::CrossEntropyBackward)
      continue;
    ++fusedQuantizes;
    EXPECT_EQ(op->result()->name(), "lm_head.fp8.grad_output.q");
    EXPECT_EQ(op->operand(0)->name(), "logits");
    ASSERT_EQ(op->numResults(), 5u);
    EXPECT_EQ(op->result(4), fused->outputs()[0]); // the loss the step returns
  }
  EXPECT_EQ(fusedQuantizes, 1);
  EXPECT_EQ(losses, 0);
  expectTheSameStep(*plain, *fused);
  // With the head in BF16 (keep_bf16's default) nothing matches.
  auto bf16Head = tinyFp8Program({"legalize-fp8-gemm", "fuse-cross-entropy-grad", "fuse-cross-entropy-quantize"});
  ASSERT_TRUE(bf16Head);
  int kept = 0;
  for (const Op *op : bf16Head->ops())
    kept += op->kind() == OpKind::CrossEntropy;
  EXPECT_EQ(kept, 1);
}

TEST(RequantizeTransposes, TheBackwardMakesTheTransposesOfKeptInputsAgainAndNoBitChanges) {
  // A forward cast-transpose whose input the backward keeps anyway (the weights, the attention's
  // output, fc1's output under fc2's GELU quantize) writes q alone; the backward quantizes that
  // input again for q_t, with the same scale: the same bytes, and q_t not held across the forward.
  std::vector<std::string> before = {"expand-layernorm-fused", "legalize-fp8-gemm", "fuse-gelu-bias-grad",
                                     "fuse-gelu-quantize"};
  auto plain = tinyFp8Program(before, false, /*recompute=*/true);
  before.push_back("requantize-transposes");
  auto split = tinyFp8Program(before, false, /*recompute=*/true);
  // Without --recompute the pass changes nothing.
  auto kept = tinyFp8Program(before);
  ASSERT_TRUE(plain && split && kept);
  for (const Op *op : kept->ops())
    EXPECT_EQ(op->numResults() && op->result()->name().find(".again") != std::string::npos, false)
        << op->result()->name();
  std::vector<Op *> ops = split->ops();
  size_t loss = size_t(llvm::find(ops, split->outputs()[0]->def()) - ops.begin());
  int again = 0, forwardTransposes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]->kind() != OpKind::Quantize)
      continue;
    const std::string &name = ops[i]->result()->name();
    bool transposes = quantizeOptions(ops[i]->attrs()).transpose;
    if (name.find(".again") != std::string::npos) {
      ++again;
      EXPECT_GT(i, loss) << name;
      EXPECT_TRUE(transposes) << name;
      EXPECT_EQ(ops[i]->result()->users().size(), 0u) << name; // its q and amax go unread
      EXPECT_EQ(ops[i]->result(1)->users().size(), 0u) << name;
    } else if (i < loss && transposes) {
      ++forwardTransposes; // the norms' outputs, which nothing keeps for the backward
      EXPECT_TRUE(name.find("qkv.fp8.input") != std::string::npos || name.find("fc1.fp8.input") != std::string::npos)
          << name;
    }
  }
  EXPECT_EQ(again, 2 * 6); // a layer: four weights, proj's and fc2's inputs
  EXPECT_EQ(forwardTransposes, 2 * 2);
  expectTheSameStep(*plain, *split);
  // On the GPU the arena holds less (the transposes live from the backward's quantize on).
  CudaProgram a = unwrap(lowerToCuda(*plain)), b = unwrap(lowerToCuda(*split));
  EXPECT_LT(planMemory(*split, b).arenaBytes, planMemory(*plain, a).arenaBytes);
  // A second run finds nothing to split.
  PipelineOptions options;
  options.passOptions.train.recompute = true;
  auto again2 = unwrap(PassPipeline::create({"requantize-transposes"}, options));
  size_t count = split->numOps();
  EXPECT_FALSE(bool(again2.run(*split)));
  EXPECT_EQ(split->numOps(), count);
}

TEST(LegalizeFp8Gemm, EveryFp8GemmIsTNAndNoBitChanges) {
  auto plain = tinyFp8Program({}), legal = tinyFp8Program({"legalize-fp8-gemm"});
  ASSERT_TRUE(plain && legal);
  int fp8Gemms = 0, notTN = 0, transposes = 0, castTransposes = 0;
  for (const Op *op : plain->ops())
    if (op->kind() == OpKind::MatMul && isFp8(op->operand(0)->type().dtype))
      notTN += matmulLayout(op->attrs()).transposeA || !matmulLayout(op->attrs()).transposeB;
  for (const Op *op : legal->ops()) {
    if (op->kind() == OpKind::Transpose && isFp8(op->operand(0)->type().dtype))
      ++transposes;
    if (op->kind() == OpKind::Quantize && quantizeOptions(op->attrs()).transpose) {
      ++castTransposes;
      ASSERT_EQ(op->numResults(), 4u);
      EXPECT_TRUE(op->result(3)->hasUses()) << op->result()->name();
    }
    if (op->kind() != OpKind::MatMul || !isFp8(op->operand(0)->type().dtype))
      continue;
    ++fp8Gemms;
    // The IR text names the transposed operand alone: transpose_b=true, no transpose_a.
    EXPECT_FALSE(op->attrs().has(kTransposeA)) << op->result()->name();
    EXPECT_EQ(op->attrs().getBool(kTransposeB), true) << op->result()->name();
  }
  // 8 FP8 linear layers: forward, dgrad and wgrad each; dgrad and wgrad were not TN, and need
  // W^T, and X^T and dY^T: three transposed operands per layer, each made by its quantize (the
  // tiny model's sides are multiples of 16), no transpose op left.
  EXPECT_EQ(fp8Gemms, 24);
  EXPECT_EQ(notTN, 16);
  EXPECT_EQ(castTransposes, 24);
  EXPECT_EQ(transposes, 0);
  expectTheSameStep(*plain, *legal);
}

/// Mean of the last ten losses of a full tiny run under `recipe`, and the trained checkpoint.
std::pair<double, Checkpoint> trainTiny(const std::string &recipe) {
  ModelConfig config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  config.precision.recipe = *parseRecipe(recipe);
  auto trainer = unwrap(Trainer::create(config));
  if (!trainer)
    return {NAN, {}};
  double mean = 0;
  for (int64_t i = 0; i < config.train.steps; ++i) {
    auto r = trainer->step();
    if (!r) {
      ADD_FAILURE() << llvm::toString(r.takeError());
      return {NAN, {}};
    }
    if (i >= config.train.steps - 10)
      mean += r->loss / 10;
  }
  return {mean, unwrap(trainer->checkpoint())};
}

TEST(Fp8Training, CurrentAndMixedScalingFollowFp32AndTheStateStillRecordsTheAmaxes) {
  // The first steps, where delayed scaling quantizes with scale 1 and then with the amax of a
  // step before: under current scaling each quantize takes its own, under mixed the weights' and
  // gradients' quantizes do (the losses within 1% of fp32's, step by step); the history still
  // fills, and nothing saturates but, at most, the amax element itself where amax * (448 /
  // amax) rounds an ulp past 448 (and under mixed the activations' delayed scales).
  ModelConfig config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  config.train.steps = 12;
  config.precision.fp8MinDim = 0;
  auto train = [&](Recipe recipe, Fp8Scaling scaling, std::vector<double> &losses) {
    ModelConfig c = config;
    c.precision.recipe = recipe;
    c.precision.fp8Scaling = scaling;
    auto trainer = unwrap(Trainer::create(c));
    for (int64_t i = 0; trainer && i < c.train.steps; ++i) {
      auto r = trainer->step();
      EXPECT_TRUE(bool(r)) << llvm::toString(r.takeError());
      losses.push_back(r ? r->loss : NAN);
    }
    return trainer;
  };
  std::vector<double> fp32Losses;
  ASSERT_TRUE(train(Recipe::Fp32, Fp8Scaling::Delayed, fp32Losses));
  for (Fp8Scaling scaling : {Fp8Scaling::Current, Fp8Scaling::Mixed}) {
    SCOPED_TRACE(fp8ScalingName(scaling).str());
    std::vector<double> losses;
    auto fp8 = train(Recipe::Fp8, scaling, losses);
    ASSERT_TRUE(fp8);
    for (size_t i = 0; i < fp32Losses.size(); ++i)
      EXPECT_NEAR(losses[i], fp32Losses[i], 0.01 * fp32Losses[i]) << "step " << i + 1;
    Checkpoint checkpoint = unwrap(fp8->checkpoint());
    auto summary = summarizeFp8State(checkpoint.tensors, config.precision);
    ASSERT_EQ(summary.size(), 24u);
    for (const Fp8TensorSummary &s : summary) {
      if (scaling == Fp8Scaling::Current || s.role != "input") {
        EXPECT_LE(s.saturations, double(config.train.steps)) << s.site << " " << s.role;
      }
      ASSERT_FALSE(s.newestAmax.empty());
      EXPECT_GT(s.newestAmax[0], 0.0f) << s.site << " " << s.role;
    }
  }
}

TEST(Fp8Training, MixedScalingScalesWeightsAndGradientsByTheirOwnAmaxAndInputsByTheHistory) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.precision.fp8Scaling = Fp8Scaling::Mixed;
  c.precision.margin = 1;
  auto graph = runPasses(unwrap(buildGPT(c, 4)), c, trainingPipeline());
  ASSERT_TRUE(graph);
  std::map<std::string, int> current, delayed;
  for (const Op *op : graph->ops()) {
    if (op->kind() != OpKind::Quantize)
      continue;
    llvm::StringRef scale = op->operand(1)->name();
    ASSERT_TRUE(scale.consume_back(".scale")) << scale.str();
    std::string role = scale.rsplit('.').second.str();
    QuantizeOptions options = quantizeOptions(op->attrs());
    ++(options.currentScaling ? current : delayed)[role];
    EXPECT_EQ(options.currentScaling, role != "input") << scale.str();
    if (options.currentScaling) {
      EXPECT_EQ(options.margin, 1) << scale.str();
    }
  }
  // 8 linear layers; the head, kept in BF16 by tiny.yaml, has no quantize.
  EXPECT_EQ(delayed, (std::map<std::string, int>{{"input", 8}}));
  EXPECT_EQ(current, (std::map<std::string, int>{{"weight", 8}, {"grad_output", 8}}));
}

// The tiny model trained to the end in fp32 and in fp8 (the suite's two longest runs, in one
// test so that fp32 trains once): each learns the task (its last losses near the task's floor,
// greedy generation 99% right), and fp8's loss ends within 10% of fp32's.
TEST(Fp8Training, TinyModelLearnsTheTaskInFp32AndInFp8WithinTenPercentOfIt) {
  auto [fp32Loss, fp32Checkpoint] = trainTiny("fp32");
  auto [fp8Loss, checkpoint] = trainTiny("fp8");
  EXPECT_LT(fp8Loss, 1.1 * fp32Loss) << "fp32 " << fp32Loss;
  for (const auto &[recipe, trained, loss] :
       {std::tuple{"fp32", &fp32Checkpoint, fp32Loss}, std::tuple{"fp8", &checkpoint, fp8Loss}}) {
    ModelConfig config = unwrap(checkpointModel(*trained, recipe));
    EXPECT_LT(loss, 0.1 * std::log(double(config.vocab))) << recipe; // the mean of the last 10 steps
    auto generator = unwrap(Generator::create(config, trained->tensors, 64));
    ASSERT_TRUE(generator);
    EvalResult result = unwrap(evaluateArithmetic(*generator, config, 64, 8, 64));
    EXPECT_GE(result.tokenAccuracy(), 0.99) << recipe << ": " << result.correctTokens << " of " << result.tokens;
  }
  ModelConfig config = unwrap(checkpointModel(checkpoint, "fp8"));
  // The scaling state moved: scales away from 1, histories filled.
  auto summary = summarizeFp8State(checkpoint.tensors, config.precision);
  ASSERT_EQ(summary.size(), 24u); // 8 linear layers x (input, weight, grad_output); head in BF16
  for (const Fp8TensorSummary &s : summary) {
    EXPECT_NE(s.scale, 1.0f) << s.site << " " << s.role;
    EXPECT_EQ(s.scaleInv, 1.0f / s.scale);
    ASSERT_FALSE(s.newestAmax.empty());
    EXPECT_GT(s.newestAmax[0], 0.0f) << s.site << " " << s.role;
    EXPECT_EQ(s.format, s.role == "grad_output" ? "e5m2" : "e4m3");
  }
}

} // namespace

/// llama-tiny's FP8 training program with every linear layer FP8 (F 96: fc1's N 192 and fc2's K
/// 96, and the 2 x 16 rows, multiples of 16), by the CPU's or the GPU's pipeline, without the
/// passes `skipped`.
std::unique_ptr<Graph> llamaFp8Program(bool gpu, const std::vector<std::string> &skipped) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/llama-tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.precision.fp8MinDim = 0;
  c.ffn = 96;
  c.seqLen = 16;
  auto graph = unwrap(buildGPT(c, 2));
  if (!graph)
    return nullptr;
  std::vector<std::string> passes;
  for (const std::string &p : gpu ? gpuPipeline(true, Recipe::Fp8) : trainingPipeline())
    if (!llvm::is_contained(skipped, p))
      passes.push_back(p);
  return runPasses(std::move(graph), c, passes);
}

TEST(FuseSwiglu, TheFp8MlpsSwigluIsOneOpEachWayAndNoBitChanges) {
  // The quantizes between an FP8 MLP's norm and GEMMs leave it unfused: fuse-swiglu makes its
  // SwiGLU one op, and autodiff its gradient one swiglu_backward, in place of the slices, silu,
  // mul and their gradients (the muls, silu_backward, the halves' concat), and on the GPU the
  // quantizes apply them: the same step, bit for bit (outputs, parameters, moments, scaling
  // state), by the CPU's and the GPU's passes.
  for (bool gpu : {false, true}) {
    SCOPED_TRACE(gpu ? "the GPU's pipeline" : "the CPU's pipeline");
    auto plain = llamaFp8Program(gpu, {"fuse-swiglu"}), fused = llamaFp8Program(gpu, {});
    ASSERT_TRUE(plain && fused);
    auto counts = countOps(*fused);
    EXPECT_EQ(countOps(*plain)["swiglu"], 0);
    EXPECT_GT(counts["quantize"], 8);
    // On the GPU fuse-gelu-quantize then has fc2's input quantize apply SwiGLU and fc1's output
    // gradient's apply its gradient.
    int activated[2] = {0, 0};
    for (const Op *op : fused->ops()) {
      activated[0] += quantizeOptions(op->attrs()).activation == QuantizeActivation::Swiglu;
      activated[1] += quantizeOptions(op->attrs()).activation == QuantizeActivation::SwigluBackward;
    }
    EXPECT_EQ(counts["swiglu"] + activated[0], 2);
    EXPECT_EQ(counts["swiglu_backward"] + activated[1], 2);
    EXPECT_EQ(activated[0] + activated[1], gpu ? 4 : 0);
    EXPECT_EQ(counts["silu"] + counts["silu_backward"] + counts["mul"] + counts["slice"] + counts["concat"], 0);
    expectTheSameStep(*plain, *fused);
  }
  // Under BF16 layer_norm_mlp takes the pattern first: nothing is left for fuse-swiglu.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/llama-tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  auto graph = unwrap(buildGPT(c, 2));
  auto pipeline = unwrap(PassPipeline::create({"fuse-layernorm-mlp", "fuse-swiglu"}, PipelineOptions{}));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  EXPECT_EQ(countOps(*graph)["swiglu"], 0);
  EXPECT_EQ(countOps(*graph)["layer_norm_mlp"], 2);
}

TEST(FuseSwiglu, TheQuantizesApplyingSwigluReadHAndDyInBf16OnTheGpu) {
  // fc1's FP8 product writes h in BF16 for the quantizes that apply SwiGLU and its gradient
  // (product-into-swiglu), fc2's FP8 dgrad writes dy in BF16 for the gradient's: they read two
  // bytes an element, and h is kept for the backward in half the memory.
  auto graph = llamaFp8Program(/*gpu=*/true, {});
  ASSERT_TRUE(graph);
  CudaProgram program = unwrap(lowerToCuda(*graph));
  int read = 0;
  for (const Op *op : graph->ops()) {
    QuantizeActivation a = quantizeOptions(op->attrs()).activation;
    if (a != QuantizeActivation::Swiglu && a != QuantizeActivation::SwigluBackward)
      continue;
    for (unsigned k : a == QuantizeActivation::Swiglu ? std::vector<unsigned>{0} : std::vector<unsigned>{0, 3}) {
      EXPECT_TRUE(program.bf16Stored.count(op->operand(k))) << op->result()->name() << " reads " << op->operand(k)->name();
      EXPECT_TRUE(program.bf16Rounding.count(op->operand(k)->def())) << op->operand(k)->name();
      ++read;
    }
  }
  EXPECT_EQ(read, 2 * (1 + 2));
}
