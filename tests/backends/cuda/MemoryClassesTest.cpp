// The memory plan by class (MemoryClasses.h): the classes add up to the plan's bytes, the peak
// is the op where the most is alive, and each class holds what its name says.
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryClasses.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

struct Planned {
  std::unique_ptr<Graph> graph;
  CudaProgram program;
  MemoryPlan plan;
};

Planned planTiny(Recipe recipe, bool recompute = false, std::vector<std::string> disabled = {}) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  Planned p;
  p.graph = unwrap(buildGPT(c, c.train.batch));
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.train.recompute = recompute;
  options.passOptions.precision.recipe = recipe;
  options.disabled = disabled;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true, recipe), options));
  EXPECT_FALSE(bool(pipeline.run(*p.graph)));
  p.program = unwrap(lowerToCuda(*p.graph));
  p.plan = planMemory(*p.graph, p.program);
  return p;
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

} // namespace
