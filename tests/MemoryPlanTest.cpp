// The GPU memory plan: values alive at the same time never share bytes, aliases share their
// source's, and reuse makes the arena much smaller than one buffer per value.
#include "compiler/MemoryPlan.h"
#include "models/GPTBuilder.h"
#include "passes/Pass.h"
#include "tests/TestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

void checkPlan(const char *model, const char *recipe) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  auto graph = unwrap(buildGPT(c, c.train.batch));
  ASSERT_TRUE(graph);
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision.recipe = recipe;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true), options));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  CudaProgram program = unwrap(lowerToCuda(*graph));
  MemoryPlan plan = planMemory(*graph, program);
  // Lifetimes recomputed here: from the defining op to the last op reading the value or any
  // reshape of it; outputs and assigned values to the end.
  std::vector<Op *> ops = graph->ops();
  std::map<const Value *, const Value *> root;
  std::map<const Value *, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (Value *v : ops[i]->operands())
      if (root.count(v))
        life[root[v]].second = std::max(life[root[v]].second, i);
    if (ops[i]->kind() == OpKind::Assign && root.count(ops[i]->operand(1)))
      life[root[ops[i]->operand(1)]].second = ops.size();
    if (isLeaf(ops[i]->kind()) && ops[i]->kind() != OpKind::Constant)
      continue;
    for (unsigned r = 0; r < ops[i]->numResults(); ++r) {
      Value *v = ops[i]->result(r);
      if (ops[i]->kind() == OpKind::Reshape) {
        if (root.count(ops[i]->operand(0)))
          root[v] = root[ops[i]->operand(0)];
        continue;
      }
      root[v] = v;
      life[v] = {i, i};
    }
  }
  for (Value *out : graph->outputs())
    if (root.count(out))
      life[root[out]].second = ops.size();
  std::vector<std::tuple<int64_t, int64_t, size_t, size_t>> spans; // begin, end, first, last
  for (auto &[v, l] : life) {
    ASSERT_TRUE(plan.offsets.count(v)) << v->name();
    int64_t begin = plan.offsets.lookup(v), end = begin + v->type().numElements() * 4;
    EXPECT_LE(end, plan.arenaBytes);
    EXPECT_EQ(begin % 256, 0);
    spans.emplace_back(begin, end, l.first, l.second);
  }
  for (auto &[v, r] : root)
    EXPECT_EQ(plan.offsets.lookup(v), plan.offsets.lookup(r)) << v->name();
  for (size_t a = 0; a < spans.size(); ++a)
    for (size_t b = a + 1; b < spans.size(); ++b) {
      auto [b0, e0, f0, l0] = spans[a];
      auto [b1, e1, f1, l1] = spans[b];
      bool together = f0 <= l1 && f1 <= l0, shared = b0 < e1 && b1 < e0;
      ASSERT_FALSE(together && shared) << "two live values share memory";
    }
  // An op's scratch (and BF16 operand copies) never overlaps a value alive while it runs.
  ASSERT_EQ(plan.opLocalOffsets.size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<int64_t> bytes = opLocalBytes(*ops[i], program.lowering[i]);
    ASSERT_EQ(bytes.size(), plan.opLocalOffsets[i].size());
    for (size_t k = 0; k < bytes.size(); ++k) {
      int64_t begin = plan.opLocalOffsets[i][k], end = begin + bytes[k];
      EXPECT_LE(end, plan.arenaBytes);
      for (auto &[b, e, first, last] : spans)
        ASSERT_FALSE(first <= i && i <= last && begin < e && b < end) << "scratch of op " << i;
    }
  }
  EXPECT_LT(plan.arenaBytes * 3, plan.withoutReuseBytes);
}

TEST(MemoryPlan, TinyTrainingProgram) { checkPlan("models/tiny.yaml", "fp32"); }
TEST(MemoryPlan, SeedTrainingProgram) { checkPlan("models/seed.yaml", "fp32"); }
TEST(MemoryPlan, SeedBf16TrainingProgram) { checkPlan("models/seed.yaml", "bf16"); }

} // namespace
