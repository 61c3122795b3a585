// The memory plan by class (MemoryClasses.h): the classes add up to the plan's bytes, the peak
// is the op where the most is alive, and each class holds what its name says.
#include "backends/cpu/Interpreter.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryClasses.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/StepLeaves.h"
#include "tests/TestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

struct Planned {
  std::unique_ptr<Graph> graph;
  CudaProgram program;
  MemoryPlan plan;
};

/// `c`'s training program on the GPU's pipeline, lowered and planned (with `dataParallel`: one
/// rank's program).
Planned planModel(const ModelConfig &c, std::vector<std::string> disabled = {},
                  DataParallelOptions dataParallel = {}) {
  Planned p;
  p.graph = unwrap(buildGPT(c, c.train.batch / dataParallel.ranks));
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision;
  options.passOptions.dataParallel = dataParallel;
  options.disabled = disabled;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true, c.precision.recipe, c.precision.fp8Scaling), options));
  EXPECT_FALSE(bool(pipeline.run(*p.graph)));
  p.program = unwrap(lowerToCuda(*p.graph));
  p.plan = planMemory(*p.graph, p.program);
  return p;
}

/// The tiny model's training program on the GPU's pipeline, lowered and planned.
Planned planTiny(Recipe recipe, bool recompute = false, std::vector<std::string> disabled = {}) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = recipe;
  c.train.recompute = recompute;
  return planModel(c, disabled);
}

int64_t bytesOf(const std::vector<MemoryClass> &classes, llvm::StringRef name) {
  for (const MemoryClass &c : classes)
    if (c.name == name)
      return c.bytes;
  return 0;
}

TEST(MemoryClasses, TheClassesAddUpToThePlanAndThePeakIsTheFullestOp) {
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp8}) {
    Planned p = planTiny(recipe, /*recompute=*/true);
    MemoryBreakdown b = memoryBreakdown(*p.graph, p.program, p.plan);
    int64_t persistent = 0, arena = 0;
    for (const MemoryClass &c : b.persistent)
      persistent += c.bytes;
    for (const MemoryClass &c : b.arena)
      arena += c.bytes;
    EXPECT_EQ(persistent, p.plan.persistentBytes);
    EXPECT_EQ(bytesOf(b.persistent, "master weights (fp32)"), p.program.layout.paramBytes);
    EXPECT_EQ(arena, b.peakLiveBytes);
    EXPECT_LE(b.peakLiveBytes, p.plan.arenaBytes);
    // No op has more alive than the peak's.
    for (int64_t op = 0; op < int64_t(p.graph->numOps()); ++op) {
      int64_t live = 0;
      for (const MemoryPlan::Span &s : p.plan.spans)
        live += s.first <= op && op <= s.last ? s.bytes : 0;
      EXPECT_LE(live, b.peakLiveBytes) << op;
    }
    EXPECT_GT(bytesOf(b.arena, "activations kept for the backward"), 0);
    EXPECT_EQ(bytesOf(b.arena, "FP8 weights") + bytesOf(b.arena, "FP8 weight transposes") > 0, false)
        << "at the peak (the loss) no weight's FP8 copy waits: the backward makes its transpose again";
  }
}

TEST(MemoryClasses, WithoutRequantizingTheWeightTransposesWaitAtThePeak) {
  // Without --recompute (the default) the forward's transposes wait for the backward.
  Planned kept = planTiny(Recipe::Fp8), again = planTiny(Recipe::Fp8, /*recompute=*/true);
  MemoryBreakdown k = memoryBreakdown(*kept.graph, kept.program, kept.plan);
  MemoryBreakdown a = memoryBreakdown(*again.graph, again.program, again.plan);
  EXPECT_GT(bytesOf(k.arena, "FP8 weight transposes"), 0);
  EXPECT_GT(bytesOf(k.arena, "FP8 activation and gradient transposes"),
            bytesOf(a.arena, "FP8 activation and gradient transposes"));
  EXPECT_LT(again.plan.arenaBytes, kept.plan.arenaBytes);
}

/// The losses of `steps` steps of `graph` on the CPU interpreter, from parameters drawn with
/// `seed` and one batch, the prologue run first (the FP8 weights kept between steps).
std::vector<float> interpretedLosses(const Graph &graph, uint64_t seed, int steps) {
  std::map<std::string, Tensor> leaves = randomStepLeaves(graph, seed);
  Interpreter interpreter(graph);
  std::vector<float> losses;
  if (auto err = interpreter.bindAll(leaves)) {
    ADD_FAILURE() << llvm::toString(std::move(err));
    return losses;
  }
  if (auto err = interpreter.runPrologue())
    ADD_FAILURE() << llvm::toString(std::move(err));
  for (int i = 0; i < steps; ++i) {
    if (auto err = interpreter.bind("step", Tensor{graph.lookup("step")->type(), {}, {i + 1}}))
      ADD_FAILURE() << llvm::toString(std::move(err));
    losses.push_back(unwrap(interpreter.run())[0].data[0]);
  }
  return losses;
}

TEST(MemoryClasses, Fp8WeightsUnderRecomputeKeepNoTransposesAndTrainTheSameBits) {
  // fp8_weights with --recompute: the state keeps each weight's FP8 bytes, not their transpose;
  // the backward makes q_t before its first reader: under per-tensor scaling a transpose of the
  // state's bytes, under block scaling a quantize of the master weight at the state's scale
  // whose kernel writes q_t alone. Half the FP8 bytes between steps, and the same steps.
  for (Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Block}) {
    SCOPED_TRACE(fp8ScalingName(scaling).str());
    ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
    c.dModel = 128, c.ffn = 256, c.heads = 2, c.vocab = 128, c.train.batch = 4; // (whole blocks)
    c.precision.keepBf16.clear();
    c.precision.recipe = Recipe::Fp8;
    c.precision.fp8Scaling = scaling;
    c.precision.fp8Format = scaling == Fp8Scaling::Block ? Fp8Formats::E4M3 : Fp8Formats::Hybrid;
    c.precision.fp8Weights = true;
    Planned kept = planModel(c);
    c.train.recompute = true;
    Planned again = planModel(c);
    MemoryBreakdown k = memoryBreakdown(*kept.graph, kept.program, kept.plan);
    MemoryBreakdown a = memoryBreakdown(*again.graph, again.program, again.plan);
    int64_t fp8Bytes = bytesOf(k.persistent, "FP8 weights between steps");
    EXPECT_GT(fp8Bytes, 0);
    EXPECT_EQ(bytesOf(k.persistent, "FP8 weight transposes between steps"), fp8Bytes); // (the same bytes)
    EXPECT_EQ(bytesOf(a.persistent, "FP8 weights between steps"), fp8Bytes);
    EXPECT_EQ(bytesOf(a.persistent, "FP8 weight transposes between steps"), 0);
    std::vector<Op *> ops = again.graph->ops();
    size_t loss = size_t(llvm::find(ops, again.graph->outputs()[0]->def()) - ops.begin());
    int transposes = 0, copies = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op *source = ops[i]->numOperands() ? ops[i]->operand(0)->def() : nullptr;
      if (ops[i]->kind() == OpKind::Transpose && source->kind() == OpKind::State) {
        ++transposes; // the state's bytes, in the backward
        EXPECT_GT(i, loss) << ops[i]->result()->name();
      }
      if (ops[i]->kind() == OpKind::Quantize && source->kind() == OpKind::Param) {
        ++copies; // only the backward's copies read a master weight in the step
        EXPECT_GT(i, loss) << ops[i]->result()->name();
        EXPECT_TRUE(again.program.transposeOnly.count(ops[i])) << ops[i]->result()->name();
      }
    }
    int weights = 4 * c.layers + 1; // each layer's four, the head's
    EXPECT_EQ(transposes, scaling == Fp8Scaling::Block ? 0 : weights);
    EXPECT_EQ(copies, scaling == Fp8Scaling::Block ? weights : 0);
    EXPECT_TRUE(kept.program.transposeOnly.empty());
    uint64_t seed = freshSeed();
    EXPECT_EQ(interpretedLosses(*again.graph, seed, 3), interpretedLosses(*kept.graph, seed, 3));
  }
}

TEST(MemoryClasses, TheBf16WeightCopyHoldsWhatIsReadInBf16) {
  // BF16: every linear weight is a BF16 GEMM's operand, so AdamW writes the whole copy. FP8:
  // only the biases the FP8 epilogues add are read in BF16: the copy is theirs alone, made at
  // the step's start, and AdamW writes none.
  Planned bf16 = planTiny(Recipe::Bf16), fp8 = planTiny(Recipe::Fp8);
  EXPECT_TRUE(bf16.program.optimizerWritesWeightCopy);
  EXPECT_EQ(bf16.program.weightCopyBegin, 0);
  EXPECT_EQ(bf16.program.weightCopyEnd, bf16.program.layout.paramBytes);
  EXPECT_FALSE(fp8.program.optimizerWritesWeightCopy);
  int64_t copied = fp8.program.weightCopyEnd - fp8.program.weightCopyBegin;
  EXPECT_GT(copied, 0);
  EXPECT_LT(copied, fp8.program.layout.paramBytes / 4);
  for (const Op *op : fp8.graph->ops())
    if (addsBf16Bias(fp8.program, *op)) {
      int64_t offset = fp8.program.layout.params.lookup(op->operand(2));
      EXPECT_GE(offset, fp8.program.weightCopyBegin) << op->result()->name();
      EXPECT_LT(offset, fp8.program.weightCopyEnd) << op->result()->name();
    }
}

TEST(MemoryClasses, AShardedRankHoldsItsShareOfTheMomentsAndNoGradientBuffer) {
  // ZeRO over 2 and 4 ranks: each rank's persistent memory is the fp32 master weights and its
  // 1/N of AdamW's moments (each parameter's shard padded to whole parts: at most N - 1 floats
  // more, and the state's alignment), named so; no gradient buffer (the gradients are
  // intermediates reduce-scattered into shards) and no other state under BF16.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  Planned whole = planModel(c);
  MemoryBreakdown unsharded = memoryBreakdown(*whole.graph, whole.program, whole.plan);
  const int64_t moments = bytesOf(unsharded.persistent, "AdamW moments");
  ASSERT_GT(moments, 0);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE(fmt::format("{} ranks", ranks));
    DataParallelOptions dp;
    dp.ranks = ranks;
    dp.shardOptimizer = dp.shardGradients = true;
    Planned p = planModel(c, {}, dp);
    MemoryBreakdown b = memoryBreakdown(*p.graph, p.program, p.plan);
    int64_t share = bytesOf(b.persistent, fmt::format("AdamW moments (this rank's 1/{} shard)", ranks));
    EXPECT_EQ(adamwMoments(*p.graph, p.program).bytes, share);
    EXPECT_EQ(adamwMoments(*p.graph, p.program).ranks, ranks);
    int64_t tensors = int64_t(2 * p.program.layout.params.size());
    EXPECT_GE(share, moments / ranks - tensors * 512);
    EXPECT_LE(share, moments / ranks + tensors * 256);
    EXPECT_EQ(bytesOf(b.persistent, "AdamW moments"), 0);
    EXPECT_EQ(bytesOf(b.persistent, "gradients (fp32)"), 0);
    EXPECT_EQ(bytesOf(b.persistent, "other state (FP8 scaling, caches)"), 0);
    EXPECT_EQ(bytesOf(b.persistent, "master weights (fp32)"), bytesOf(unsharded.persistent, "master weights (fp32)"));
    int64_t persistent = 0;
    for (const MemoryClass &m : b.persistent)
      persistent += m.bytes;
    EXPECT_EQ(persistent, p.plan.persistentBytes);
  }
}

TEST(MemoryClasses, ABucketsGradientsGoOnceTheReduceScatterTwoOnIsLaunched) {
  // ZeRO in buckets of 64 KiB: the main stream joins each reduce_scatter before its results'
  // first reader and before the reduce_scatter two buckets on (collectiveJoins, which the
  // executor's Collectives follow), and the plan keeps each bucket's local gradients until then,
  // no longer: at most three buckets of them are alive at once.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  DataParallelOptions dp;
  dp.ranks = 2;
  dp.shardOptimizer = dp.shardGradients = true;
  dp.bucketBytes = 64 << 10;
  Planned p = planModel(c, {}, dp);
  std::vector<Op *> ops = p.graph->ops();
  std::vector<size_t> joins = collectiveJoins(ops, p.program), scatters;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i]->kind() == OpKind::ReduceScatter)
      scatters.push_back(i);
  ASSERT_GE(scatters.size(), 4u);
  llvm::DenseMap<const Value *, const MemoryPlan::Span *> spans;
  for (const MemoryPlan::Span &span : p.plan.spans)
    if (span.value && !span.shadow)
      spans[span.value] = &span;
  int checked = 0;
  for (size_t k = 0; k < scatters.size(); ++k) {
    const Op &scatter = *ops[scatters[k]];
    SCOPED_TRACE(scatter.result()->name());
    size_t first = ops.size();
    for (unsigned r = 0; r < scatter.numResults(); ++r)
      for (const Op *user : scatter.result(r)->users())
        first = std::min(first, size_t(llvm::find(ops, user) - ops.begin()));
    size_t want = k + 2 < scatters.size() ? std::min(first, scatters[k + 2]) : first;
    EXPECT_EQ(joins[scatters[k]], want);
    for (const Value *local : scatter.operands())
      if (const MemoryPlan::Span *span = spans.lookup(local)) {
        ++checked;
        EXPECT_EQ(span->last, int64_t(joins[scatters[k]])) << local->name();
      }
  }
  EXPECT_GT(checked, int(scatters.size()));
}

} // namespace
