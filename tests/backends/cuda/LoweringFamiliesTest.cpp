// The GPU lowering's table of families (backends/cuda/lowering/Families.cpp): every op of
// ir/Ops.def has a way onto the GPU, the family's emitter where kernels lower it, and the ops
// the GPU pipeline expands never reach the lowering. (An op added to the table without a case
// in Families.cpp already fails the build: its switch has no default, under -Werror=switch.)
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Families.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

#include <map>
#include <set>

using namespace tgc;
using namespace tgc::test;

namespace {

const std::vector<OpKind> &allKinds() {
  static const std::vector<OpKind> kinds = {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) OpKind::Enum,
#include "ir/Ops.def"
  };
  return kinds;
}

TEST(GpuLowering, EveryOpOfTheTableHasAWayOntoTheGpu) {
  int families = 0;
  for (OpKind kind : allKinds()) {
    GpuLoweringInfo info = gpuLoweringOf(kind);
    SCOPED_TRACE(opInfo(kind).name.str());
    ASSERT_NE(info.where, nullptr) << "no entry in Families.cpp";
    if (info.how == GpuLowering::Family) {
      EXPECT_NE(info.emit, nullptr) << "a family without an emitter";
      ++families;
    }
    if (info.how == GpuLowering::Leaf || info.how == GpuLowering::Alias || info.how == GpuLowering::Assign ||
        info.how == GpuLowering::Collective || info.how == GpuLowering::Expanded || info.how == GpuLowering::NotYet) {
      EXPECT_EQ(info.emit, nullptr) << "kernels for an op the executor binds, aliases or never sees";
    }
  }
  EXPECT_GT(families, 40); // most ops are kernel families' (46 today)
}

/// The programs the GPU runs: the tiny and odd models' training programs and decode steps
/// (at their batch and at batch 1, whose products normalise their row) under each recipe,
/// after gpuPipeline's passes.
std::vector<std::unique_ptr<Graph>> gpuPrograms() {
  std::vector<std::unique_ptr<Graph>> programs;
  for (const char *model : {"models/tiny.yaml", "tests/models/odd.yaml"})
    for (const char *recipe : {"fp32", "bf16", "fp8"})
      for (int program = 0; program < 3; ++program) {
        GPTOutput output = program == 0 ? GPTOutput::Loss : GPTOutput::Decode;
        ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
        c.precision.recipe = *parseRecipe(recipe);
        c.precision.fp8MinDim = 0;
        bool training = output == GPTOutput::Loss;
        auto graph = unwrap(buildGPT(c, program == 2 ? 1 : c.train.batch, output));
        PipelineOptions options;
        options.passOptions.train = c.train;
        options.passOptions.precision = c.precision;
        auto pipeline = unwrap(PassPipeline::create(gpuPipeline(training, c.precision.recipe), options));
        EXPECT_FALSE(bool(pipeline.run(*graph)));
        programs.push_back(std::move(graph));
      }
  return programs;
}

TEST(GpuLowering, TheGpuPipelineLeavesOnlyOpsTheLoweringTakes) {
  std::set<std::string> families;
  for (auto &graph : gpuPrograms()) {
    SCOPED_TRACE(graph->name());
    for (const Op *op : graph->ops()) {
      GpuLoweringInfo info = gpuLoweringOf(op->kind());
      EXPECT_NE(info.how, GpuLowering::Expanded) << op->name().str() << " reaches the lowering";
      if (info.how == GpuLowering::Family)
        families.insert(info.where);
    }
    auto program = lowerToCuda(*graph);
    EXPECT_TRUE(bool(program)) << (program ? "" : llvm::toString(program.takeError()));
  }
  // Every family's emitter runs on some program here.
  EXPECT_EQ(families.size(), 11u);
}

TEST(GpuLowering, AnOpTheGpuPipelineExpandsIsAnErrorNamingIt) {
  auto graph = unwrap(parseGraph(R"(graph @g
%x = input() : f32[4,16]
%gamma = param() {init="ones"} : f32[16]
%beta = param() {init="zeros"} : f32[16]
%w = param() {init="normal", std=0.02} : f32[8,16]
%y = layer_norm_linear(%x, %gamma, %beta, %w) {bias=false, eps=1e-05, norm="layer_norm"} : f32[4,8]
return %y
)", "test.ir"));
  auto program = lowerToCuda(*graph);
  ASSERT_FALSE(bool(program));
  EXPECT_NE(llvm::toString(program.takeError()).find("%y = layer_norm_linear has no GPU lowering yet"),
            std::string::npos);
}

} // namespace

/// ZeRO's training program for the GPU: rank 1 of 2 of the tiny parity model, the gradients
/// reduced in fp32 or BF16.
struct ShardedProgram {
  std::unique_ptr<Graph> graph;
  CudaProgram program;
};
ShardedProgram shardedProgram(bool bf16Gradients) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml")));
  ShardedProgram p;
  p.graph = unwrap(buildGPT(c, c.train.batch / 2, GPTOutput::Loss));
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = resolveRecipeForCpu(c.precision);
  options.passOptions.dataParallel.ranks = 2;
  options.passOptions.dataParallel.rank = 1;
  options.passOptions.dataParallel.shardOptimizer = options.passOptions.dataParallel.shardGradients = true;
  options.passOptions.dataParallel.bf16Gradients = bf16Gradients;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(true, options.passOptions.precision.recipe), options));
  if (auto err = pipeline.run(*p.graph))
    ADD_FAILURE() << llvm::toString(std::move(err));
  p.program = unwrap(lowerToCuda(*p.graph));
  return p;
}

TEST(GpuLowering, AShardedTrainingStepRunsItsCollectivesThroughNcclAndGathersInPlace) {
  // ZeRO's program (rank 1 of 2, the gradients in fp32 and in BF16): the gradients'
  // reduce_scatter and the parameters' all_gather are collectives (runtime/Collectives.cpp),
  // and the AdamW updates of shards lie outside the parameter layout. The all_gather writes each
  // parameter's parts into its own slot, the slice back to its size a view (no copy, no
  // gathered copy in the arena).
  for (bool bf16Gradients : {false, true}) {
    SCOPED_TRACE(bf16Gradients ? "bf16 gradients" : "fp32 gradients");
    auto [graph, program] = shardedProgram(bf16Gradients);
    std::vector<Op *> ops = graph->ops();
    int scatters = 0, gathers = 0, shards = 0, views = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op &op = *ops[i];
      if (op.kind() == OpKind::ReduceScatter || op.kind() == OpKind::AllGather) {
        (op.kind() == OpKind::ReduceScatter ? scatters : gathers)++;
        EXPECT_EQ(program.lowering[i].kind, OpLowering::Collective) << op.result()->name();
      } else if (op.kind() == OpKind::Shard) {
        ++shards;
      } else if (op.kind() == OpKind::AdamW) {
        EXPECT_FALSE(llvm::is_contained(program.layout.updates, &op)) << op.result()->name();
      } else if (op.kind() == OpKind::Slice && op.operand(0)->def()->kind() == OpKind::AllGather) {
        ++views;
        EXPECT_TRUE(prefixOfGathered(op)) << op.result()->name();
        EXPECT_EQ(program.lowering[i].kind, OpLowering::Alias) << op.result()->name();
      }
      if (op.kind() != OpKind::AllGather)
        continue;
      // Each parameter gathered into its own slot, which holds the ranks' parts: no copy.
      for (unsigned r = 0; r < op.numResults(); ++r) {
        const Value *gathered = op.result(r);
        const Value *param = program.inPlace.lookup(gathered);
        ASSERT_TRUE(param && param->def()->kind() == OpKind::Param) << gathered->name();
        int64_t slot = program.layout.paramBytes - program.layout.params.lookup(param);
        for (auto [other, offset] : program.layout.params)
          if (offset > program.layout.params.lookup(param))
            slot = std::min(slot, offset - program.layout.params.lookup(param));
        EXPECT_GE(slot, gathered->type().numElements() * 4) << gathered->name();
      }
    }
    EXPECT_GE(scatters, 1);
    EXPECT_GE(gathers, 1);
    EXPECT_EQ(shards, 5 + 12 * 2); // two embeddings, the final norm's two, the head; 12 a layer (2 layers)
    EXPECT_EQ(views, shards); // each parameter's gathered parts cut back to its size as a view
  }
}

TEST(GpuLowering, AShardedStepTakesItsShardsUpdatesAndNormInALaunchEach) {
  // ZeRO's shards lie apart in the arena: the shard ops, the AdamW updates and the gradient
  // norm's sums each run as one launch (where the last of them ran; the norm's where its last
  // add ran) over an address table (OpLowering::addresses: each shard's parameter and shard;
  // each update's shard, gradient, moments and new shard; each gradient shard), with the
  // per-op arithmetic; the plan keeps every value a table names until its launch.
  auto [graph, program] = shardedProgram(false);
  std::vector<Op *> ops = graph->ops();
  MemoryPlan plan = planMemory(*graph, program);
  llvm::DenseMap<const Value *, const MemoryPlan::Span *> spans;
  for (const MemoryPlan::Span &span : plan.spans)
    if (span.value && !span.shadow)
      spans[span.value] = &span;
  std::map<std::string, size_t> groups; // label -> op index
  std::vector<const Op *> shards, updates;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &l = program.lowering[i];
    if (ops[i]->kind() == OpKind::Shard)
      shards.push_back(ops[i]);
    if (ops[i]->kind() == OpKind::AdamW)
      updates.push_back(ops[i]);
    if (ops[i]->kind() == OpKind::Shard || ops[i]->kind() == OpKind::AdamW) {
      EXPECT_EQ(l.kind, l.label.empty() ? OpLowering::Grouped : OpLowering::Kernels) << ops[i]->result()->name();
    }
    if (l.label.empty())
      continue;
    groups[l.label] = i;
    for (const Value *v : l.addresses)
      if (const MemoryPlan::Span *span = spans.lookup(v)) {
        EXPECT_GE(span->last, int64_t(i)) << l.label << ": %" << v->name();
      }
  }
  ASSERT_EQ(groups.count("shards (all parameters)"), 1u);
  ASSERT_EQ(groups.count("adamw (all shards)"), 1u);
  ASSERT_EQ(groups.count("grad norm (all gradients)"), 1u);
  const OpLowering &shard = program.lowering[groups["shards (all parameters)"]];
  const OpLowering &adamw = program.lowering[groups["adamw (all shards)"]];
  EXPECT_EQ(ops[groups["shards (all parameters)"]], shards.back());
  EXPECT_EQ(ops[groups["adamw (all shards)"]], updates.back());
  ASSERT_EQ(shard.addresses.size(), 2 * shards.size());
  ASSERT_EQ(adamw.addresses.size(), 5 * updates.size());
  for (size_t k = 0; k < shards.size(); ++k) {
    EXPECT_EQ(shard.addresses[2 * k], shards[k]->operand(0));
    EXPECT_EQ(shard.addresses[2 * k + 1], shards[k]->result());
    int64_t part = shards[k]->result()->type().numElements();
    EXPECT_EQ(shard.constants[4 * k + 1], double(part));
    EXPECT_EQ(shard.constants[4 * k + 2], double(part)); // rank 1's first element
  }
  for (size_t k = 0; k < updates.size(); ++k) {
    EXPECT_EQ(adamw.addresses[5 * k], updates[k]->operand(0));
    EXPECT_EQ(adamw.addresses[5 * k + 1], updates[k]->operand(1));
    EXPECT_EQ(adamw.addresses[5 * k + 4], updates[k]->result(0));
    EXPECT_EQ(adamw.constants[4 * k + 2], updates[k]->attrs().getFloat("weight_decay").value_or(0) != 0 ? 1.0 : 0.0);
  }
  const OpLowering &norm = program.lowering[groups["grad norm (all gradients)"]];
  EXPECT_EQ(norm.addresses.size(), updates.size());
  for (const Value *g : norm.addresses)
    EXPECT_EQ(g->def()->kind(), OpKind::ReduceScatter) << g->name();
  for (const char *kernel : {"shardTensors<", "adamwTensors<", "gradNormPartials<"})
    EXPECT_NE(program.source.find(kernel), std::string::npos) << kernel;
  EXPECT_EQ(program.source.find("pad<"), std::string::npos); // no shard of its own
}

TEST(GpuLowering, ShardsGroupedWithoutAnOptimizerIncludeTheirTemplates) {
  // Two shard ops and no AdamW (GpuDataParallel.OneGpuRunsZerosOpsAsTheCpu's program): their
  // grouped launch, led by a layout op, calls optimizer.cuh's shardTensors, which the source
  // must include although no op of the optimizer family is in it.
  auto graph = unwrap(parseGraph("graph @g\n%p = input() : f32[7]\n%s = shard(%p) {rank=1, ranks=2} : f32[4]\n"
                                 "%t = shard(%p) {rank=0, ranks=1} : f32[7]\nreturn %s, %t\n",
                                 "shards.ir"));
  ASSERT_TRUE(graph);
  CudaProgram program = unwrap(lowerToCuda(*graph));
  EXPECT_NE(program.source.find("shardTensors<2>"), std::string::npos);
  EXPECT_NE(program.source.find("#include \"optimizer.cuh\""), std::string::npos);
}

/// That each launch of `program` names a kernel of its source taking the parameters the executor
/// passes (ProgramRunner::launchPointers): the op's operands and results (or its `arguments`),
/// its scratch and persistent buffers, its constants and its address table. Returns the
/// launches checked.
int expectKernelsTakeWhatTheExecutorPasses(const Graph &graph, const CudaProgram &program) {
  int checked = 0;
  std::vector<Op *> ops = graph.ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &l = program.lowering[i];
    if (l.kind != OpLowering::Kernels)
      continue;
    size_t passed = (l.arguments.empty() ? ops[i]->numOperands() + ops[i]->numResults() : l.arguments.size()) +
                    l.scratchFloats.size() + l.persistentFloats.size() + !l.constants.empty() + !l.addresses.empty();
    for (const KernelLaunch &launch : l.launches) {
      // (`__global__ void [__launch_bounds__(...)] NAME(params)`.)
      size_t at = program.source.find(" " + launch.name + "(");
      size_t line = program.source.rfind('\n', at);
      EXPECT_TRUE(at != std::string::npos && llvm::StringRef(program.source).slice(line, at).contains("__global__ void"))
          << launch.name;
      if (at == std::string::npos)
        continue;
      size_t open = program.source.find('(', at), close = program.source.find(')', open);
      llvm::StringRef params = llvm::StringRef(program.source).slice(open + 1, close);
      EXPECT_EQ(size_t(params.count(',') + 1), passed) << launch.name << "(" << params.str() << ")";
      ++checked;
    }
  }
  return checked;
}

TEST(GpuLowering, EachKernelTakesTheParametersTheExecutorPasses) {
  // Every program of gpuPrograms(), a prompt's and ZeRO's (grouped launches over address tables).
  std::vector<std::unique_ptr<Graph>> programs = gpuPrograms();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  programs.push_back(unwrap(buildGPT(c, 4, GPTOutput::Prefill, 32)));
  PipelineOptions options;
  options.passOptions.precision = c.precision;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(false, c.precision.recipe), options));
  EXPECT_FALSE(bool(pipeline.run(*programs.back())));
  int checked = 0;
  for (const auto &graph : programs) {
    SCOPED_TRACE(graph->name());
    checked += expectKernelsTakeWhatTheExecutorPasses(*graph, unwrap(lowerToCuda(*graph)));
  }
  for (bool bf16Gradients : {false, true}) {
    ShardedProgram sharded = shardedProgram(bf16Gradients);
    checked += expectKernelsTakeWhatTheExecutorPasses(*sharded.graph, sharded.program);
  }
  EXPECT_GT(checked, 500);
}
