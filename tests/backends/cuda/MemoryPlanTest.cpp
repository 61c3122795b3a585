// The GPU memory plan: values alive at the same time never share bytes, aliases share their
// source's, and reuse makes the arena much smaller than one buffer per value.
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "ir/Gemv.h"
#include "ir/Attributes.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

void checkPlan(const char *model, const char *recipe) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  auto graph = unwrap(buildGPT(c, c.train.batch));
  ASSERT_TRUE(graph);
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision.recipe = *parseRecipe(recipe);
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true, *parseRecipe(recipe)), options));
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
    if (program.inPlace.count(v) || program.layout.grads.count(v)) { // outside the arena
      EXPECT_FALSE(plan.offsets.count(v)) << v->name();
      continue;
    }
    ASSERT_TRUE(plan.offsets.count(v)) << v->name();
    int64_t begin = plan.offsets.lookup(v), end = begin + storedBytesOf(program, v);
    EXPECT_LE(end, plan.arenaBytes);
    EXPECT_EQ(begin % 256, 0);
    spans.emplace_back(begin, end, l.first, l.second);
  }
  for (auto &[v, r] : root)
    if (!program.inPlace.count(r) && !program.layout.grads.count(r)) {
      EXPECT_EQ(plan.offsets.lookup(v), plan.offsets.lookup(r)) << v->name();
    }
  // BF16 copies: from the producer to the last BF16 GEMM reading the value (or a reshape).
  for (auto &[v, offset] : plan.shadowOffsets) {
    ASSERT_TRUE(program.bf16Shadowed.count(v)) << v->name();
    size_t first = 0, last = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      for (unsigned r = 0; r < ops[i]->numResults(); ++r)
        if (ops[i]->result(r) == v)
          first = last = i;
      if (program.lowering[i].kind == OpLowering::Gemm)
        for (unsigned k = 0; k < 2; ++k)
          if (reshapeRoot(ops[i]->operand(k)) == v)
            last = std::max(last, i);
    }
    EXPECT_GT(last, first) << v->name();
    EXPECT_LE(offset + v->type().numElements() * 2, plan.arenaBytes);
    spans.emplace_back(offset, offset + v->type().numElements() * 2, first, last);
  }
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
    std::vector<int64_t> bytes = opLocalBytes(*ops[i], program, i);
    ASSERT_EQ(bytes.size(), plan.opLocalOffsets[i].size());
    for (size_t k = 0; k < bytes.size(); ++k) {
      int64_t begin = plan.opLocalOffsets[i][k], end = begin + bytes[k];
      EXPECT_LE(end, plan.arenaBytes);
      for (auto &[b, e, first, last] : spans)
        ASSERT_FALSE(first <= i && i <= last && begin < e && b < end) << "scratch of op " << i;
    }
  }
  // Reuse halves the arena at least (the attention's scores and probabilities, the largest
  // short-lived values, are not in it since attention is fused: it was a third before).
  EXPECT_LT(plan.arenaBytes * 2, plan.withoutReuseBytes);
}

TEST(MemoryPlan, TinyTrainingProgram) { checkPlan("models/tiny.yaml", "fp32"); }
TEST(MemoryPlan, TinyFp8TrainingProgram) { checkPlan("models/tiny.yaml", "fp8"); }
TEST(MemoryPlan, SeedTrainingProgram) { checkPlan("models/seed.yaml", "fp32"); }
TEST(MemoryPlan, SeedBf16TrainingProgram) { checkPlan("models/seed.yaml", "bf16"); }

/// The training program of `model` under `recipe` as the GPU compiles and lowers it.
std::pair<std::unique_ptr<Graph>, CudaProgram> gpuTrainingProgram(const char *model, const char *recipe,
                                                                   std::vector<std::string> disabled = {},
                                                                   bool recompute = false,
                                                                   bool fp8Weights = false) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  if (recompute)
    c.train.recompute = true;
  c.precision.fp8Weights = fp8Weights;
  auto graph = unwrap(buildGPT(c, c.train.batch));
  PipelineOptions options;
  options.disabled = std::move(disabled);
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision;
  options.passOptions.precision.recipe = *parseRecipe(recipe);
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true, *parseRecipe(recipe)), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  CudaProgram program = unwrap(lowerToCuda(*graph));
  return {std::move(graph), std::move(program)};
}

TEST(MemoryPlan, OptimizerAndScalingStateUpdatedInPlace) {
  // Every AdamW result (parameter, moments) and every fp8_update result goes straight into the
  // state it is assigned to: no copy at the end of the step, no arena bytes.
  auto [graph, program] = gpuTrainingProgram("models/tiny.yaml", "fp8");
  MemoryPlan plan = planMemory(*graph, program);
  int assigns = 0;
  for (const Op *op : graph->ops()) {
    if (op->kind() != OpKind::Assign)
      continue;
    ++assigns;
    OpKind producer = op->operand(1)->def()->kind();
    ASSERT_TRUE(producer == OpKind::AdamW || producer == OpKind::Fp8Update) << op->operand(1)->name();
    EXPECT_EQ(program.inPlace.lookup(op->operand(1)), op->operand(0)) << op->operand(1)->name();
  }
  EXPECT_EQ(assigns, 183); // 29 parameters x 3, and 24 FP8 tensors x 4
  EXPECT_EQ(int(program.inPlace.size()), assigns);
}

TEST(MemoryPlan, ALeafWrittenInPlaceComesBeforeItsWriter) {
  // The executor places leaves and values in program order, and a value written into its leaf
  // takes the leaf's buffer: the leaf must come first. Block scaling's block_scale_max state
  // (written by fp8_update's fifth result) and fp8-weights' kept FP8 bytes (written by the
  // quantize after AdamW) are the leaves added after the builder's.
  const char *models[] = {
      "model: {vocab: 128, seq_len: 32, d_model: 128, heads: 2, layers: 1, ffn: 256}\ntrain: {batch: 4}\n"
      "precision: {recipe: fp8, fp8_scaling: block, fp8_format: e4m3, keep_bf16: []}\n",
      "model: {vocab: 128, seq_len: 32, d_model: 128, heads: 2, layers: 1, ffn: 256}\ntrain: {batch: 4}\n"
      "precision: {recipe: fp8, fp8_weights: true, keep_bf16: []}\n"};
  for (const char *text : models) {
    SCOPED_TRACE(text);
    ModelConfig c = unwrap(parseModelConfig(text, "m.yaml"));
    auto graph = unwrap(buildGPT(c, c.train.batch));
    PipelineOptions options;
    options.passOptions.train = c.train;
    options.passOptions.precision = c.precision;
    auto pipeline = unwrap(PassPipeline::create(gpuPipeline(true, Recipe::Fp8, c.precision.fp8Scaling), options));
    ASSERT_FALSE(bool(pipeline.run(*graph)));
    CudaProgram program = unwrap(lowerToCuda(*graph));
    std::map<const Op *, size_t> index;
    for (const Op *op : graph->ops())
      index.emplace(op, index.size());
    int checked = 0;
    for (const auto &[value, leaf] : program.inPlace) {
      EXPECT_LT(index.at(leaf->def()), index.at(value->def())) << value->name() << " into " << leaf->name();
      ++checked;
    }
    EXPECT_GT(checked, 50);
  }
}

/// Offsets of the tensors of one buffer: each starts at a multiple of 256 bytes, inside the
/// buffer, and no two overlap.
void expectDisjoint(const llvm::DenseMap<const Value *, int64_t> &offsets, int64_t bufferBytes) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (auto &[v, offset] : offsets) {
    EXPECT_EQ(offset % 256, 0) << v->name();
    EXPECT_LE(offset + deviceBytesOf(v->type()), bufferBytes) << v->name();
    spans.emplace_back(offset, offset + deviceBytesOf(v->type()));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    EXPECT_LE(spans[i - 1].second, spans[i].first);
}

void checkLayout(const char *model, const char *recipe) {
  SCOPED_TRACE(std::string(model) + " " + recipe);
  auto [graph, program] = gpuTrainingProgram(model, recipe);
  const ParameterLayout &layout = program.layout;
  std::vector<Op *> ops = graph->ops();
  int params = 0, states = 0, adamws = 0;
  for (const Op *op : ops) {
    params += op->kind() == OpKind::Param;
    states += op->kind() == OpKind::State;
    adamws += op->kind() == OpKind::AdamW;
  }
  EXPECT_EQ(int(layout.params.size()), params);
  EXPECT_EQ(int(layout.state.size()), states);
  EXPECT_EQ(int(layout.updates.size()), adamws); // every parameter of a GPT is the usual kind
  expectDisjoint(layout.params, layout.paramBytes);
  for (auto &[v, offset] : layout.params) // the BF16 copy's tensors at multiples of 256 bytes
    EXPECT_EQ(offset % 512, 0) << v->name();
  expectDisjoint(layout.grads, layout.gradBytes);
  expectDisjoint(layout.state, layout.stateBytes);
  // Gradients and moments at their parameter's offset (second moments after all the first);
  // decayed parameters first.
  for (const Op *update : layout.updates) {
    int64_t offset = layout.params.lookup(update->operand(0));
    EXPECT_EQ(layout.grads.lookup(update->operand(1)), offset);
    EXPECT_EQ(layout.state.lookup(update->operand(2)), offset);
    EXPECT_EQ(layout.state.lookup(update->operand(3)), layout.updatedBytes + offset);
    bool decayed = update->attrs().getFloat("weight_decay").value_or(0) != 0;
    EXPECT_EQ(offset < layout.decayedBytes, decayed) << update->operand(0)->name();
    EXPECT_LT(offset, layout.updatedBytes);
  }
  EXPECT_GT(layout.decayedBytes, 0);
  EXPECT_EQ(layout.gradBytes, layout.updatedBytes);
  // One launch runs every AdamW op and two the gradient norm; the ops they replace run nothing.
  int adamwLaunches = 0, normLaunches = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &l = program.lowering[i];
    if (ops[i]->kind() == OpKind::AdamW || ops[i]->kind() == OpKind::SumSquares) {
      EXPECT_TRUE(l.kind == OpLowering::Grouped || !l.arguments.empty()) << ops[i]->result()->name();
    }
    if (l.label == "adamw (all parameters)")
      adamwLaunches += int(l.launches.size());
    if (l.label == "grad norm (all gradients)")
      normLaunches += int(l.launches.size());
  }
  EXPECT_EQ(adamwLaunches, 1);
  EXPECT_EQ(normLaunches, 2);
  // The delayed-scaling updates: every one run by a grouped launch of a block an update.
  int updates = 0, updateBlocks = 0, updateLaunches = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &l = program.lowering[i];
    if (ops[i]->kind() == OpKind::Fp8Update) {
      ++updates;
      EXPECT_TRUE(l.kind == OpLowering::Grouped || !l.arguments.empty()) << ops[i]->result()->name();
    }
    if (l.label == "fp8_update (grouped)") {
      ASSERT_EQ(l.launches.size(), 1u);
      EXPECT_EQ(l.arguments.size(), size_t(9 * l.launches[0].blocks));
      updateBlocks += int(l.launches[0].blocks);
      ++updateLaunches;
    }
  }
  EXPECT_EQ(updateBlocks, updates);
  EXPECT_EQ(updateLaunches, (updates + 47) / 48);
  // Without grouping, the same layout and one kernel per op.
  LoweringOptions perOp;
  perOp.groupOptimizer = false;
  perOp.groupFp8Updates = false;
  CudaProgram ungrouped = unwrap(lowerToCuda(*graph, perOp));
  EXPECT_EQ(ungrouped.layout.params, layout.params);
  for (const OpLowering &l : ungrouped.lowering)
    EXPECT_NE(l.kind, OpLowering::Grouped);
}

TEST(MemoryPlan, Fp8WeightsCastsMakeTheirAdamWUpdateAndLeadTheLayout) {
  // fp8-weights under --recompute: each weight's cast after AdamW makes the update it casts
  // (AdamWCast.cpp). The AdamW op runs nothing; the cast's launch takes AdamW's operands and
  // results, then its own, and zeroes the clip scale in the prologue (AdamW's skip); those
  // weights lead the layout, and the grouped AdamW covers the others from castBytes on. The
  // LR and clip scale the casts read live until the last of them.
  auto [graph, program] = gpuTrainingProgram("models/tiny.yaml", "fp8", {}, true, true);
  const ParameterLayout &layout = program.layout;
  std::vector<Op *> ops = graph->ops();
  size_t weightCasts = 0, lastCast = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op *op = ops[i];
    if (op->kind() != OpKind::Quantize || !op->operand(0)->def() || op->operand(0)->def()->kind() != OpKind::AdamW)
      continue;
    ++weightCasts, lastCast = i;
    const Op *adamw = op->operand(0)->def();
    ASSERT_EQ(program.adamwInCast.lookup(adamw), op) << op->result()->name();
    const OpLowering &l = program.lowering[i];
    ASSERT_EQ(l.arguments.size(), 15u);
    for (unsigned k = 0; k < 7; ++k)
      EXPECT_EQ(l.arguments[k], adamw->operand(k));
    EXPECT_EQ(l.arguments[12], op->result(0));
    EXPECT_EQ(l.zeroInPrologue, adamw->operand(5));
    EXPECT_EQ(l.persistentFloats, std::vector<int64_t>{6});
    ASSERT_EQ(l.launches.size(), 1u);
    EXPECT_EQ(l.launches[0].blocks, (op->operand(0)->type().numElements() + 4095) / 4096);
    EXPECT_LT(layout.params.lookup(adamw->operand(0)), layout.castBytes);
  }
  EXPECT_EQ(weightCasts, 8u); // two layers' qkv, proj, fc1, fc2 (the head in BF16)
  EXPECT_EQ(program.adamwInCast.size(), weightCasts);
  bool flat = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &l = program.lowering[i];
    if (ops[i]->kind() == OpKind::AdamW && program.adamwInCast.count(ops[i])) {
      EXPECT_EQ(l.kind, OpLowering::Grouped) << ops[i]->result()->name();
    }
    if (l.label == "adamw (all parameters)") {
      flat = true;
      EXPECT_EQ(layout.params.lookup(l.arguments[0]), layout.castBytes);
    }
  }
  EXPECT_TRUE(flat);
  for (const Op *update : layout.updates) {
    if (!program.adamwInCast.count(update)) {
      EXPECT_GE(layout.params.lookup(update->operand(0)), layout.castBytes) << update->operand(0)->name();
    }
  }
  const Op *someAdamW = program.adamwInCast.begin()->first;
  MemoryPlan plan = planMemory(*graph, program);
  for (unsigned k : {4u, 5u}) { // lr, clip
    auto span = llvm::find_if(plan.spans, [&](const MemoryPlan::Span &s) {
      return s.value == someAdamW->operand(k) && !s.shadow;
    });
    ASSERT_NE(span, plan.spans.end()) << someAdamW->operand(k)->name();
    EXPECT_GE(span->last, int64_t(lastCast)) << someAdamW->operand(k)->name();
  }
  // With the transposes kept (cast-transposes) or without the grouped optimizer: no such cast.
  auto kept = gpuTrainingProgram("models/tiny.yaml", "fp8", {}, false, true);
  EXPECT_TRUE(kept.second.adamwInCast.empty());
  EXPECT_EQ(kept.second.layout.castBytes, 0);
  LoweringOptions perOp;
  perOp.groupOptimizer = false;
  CudaProgram apart = unwrap(lowerToCuda(*graph, perOp));
  EXPECT_TRUE(apart.adamwInCast.empty());
  EXPECT_EQ(apart.layout.castBytes, 0);
}

TEST(MemoryPlan, ParametersGradientsAndMomentsContiguousAtTheSameOffsets) {
  checkLayout("models/tiny.yaml", "fp32");
  checkLayout("models/tiny.yaml", "fp8");
  checkLayout("models/seed.yaml", "bf16");
}

TEST(MemoryPlan, BF16GemmOperandsAreWrittenInBf16ByTheirProducers) {
  // Under bf16, the normed residual stream (in the forward, kept for the backward's GEMMs), q,
  // k, v and the attention's context are read by BF16 GEMMs only: they are stored in BF16, no
  // GEMM converts them, and the arena shrinks. Values anything else reads (the probabilities,
  // which the softmax gradient reads too; gradients whose bias sums read them) stay fp32. With
  // attention unfused, where q, k, v and the probabilities are values of their own.
  auto [graph, program] = gpuTrainingProgram("models/seed.yaml", "bf16", {"fuse-attention"});
  std::vector<Op *> ops = graph->ops();
  int stored = 0;
  for (const Value *v : program.bf16Stored) {
    if (v->def()->kind() == OpKind::Reshape)
      continue;
    ++stored;
    std::vector<const Value *> pending{v};
    while (!pending.empty()) {
      const Value *w = pending.back();
      pending.pop_back();
      EXPECT_FALSE(llvm::is_contained(graph->outputs(), w)) << w->name();
      for (const Op *user : w->users()) {
        if (user->kind() == OpKind::Reshape) {
          EXPECT_TRUE(program.bf16Stored.count(user->result())) << user->result()->name();
          pending.push_back(user->result());
          continue;
        }
        // A BF16 epilogue's h goes to its gradient's epilogue, the gradient to the bias's sums too.
        const Op *root = reshapeRoot(w)->def();
        // The logits go to the loss. A product only a norm reads goes to it (the residual norm's
        // y, the norm gradient's dy).
        bool norm = user->kind() == OpKind::ResidualNorm || user->kind() == OpKind::LayerNormBackward ||
                    user->kind() == OpKind::RMSNormBackward;
        if (program.bf16Rounding.count(root) &&
            ((user->kind() == OpKind::MatMulDGelu && user->operand(2) == w && program.bf16Rounding.count(user)) ||
             (user->kind() == OpKind::ReduceTo && root->kind() == OpKind::MatMulDGelu) ||
             (user->kind() == OpKind::CrossEntropy && root->kind() == OpKind::MatMul) ||
             (norm && (root->kind() == OpKind::MatMul || root->kind() == OpKind::MatMulBias))))
          continue;
        EXPECT_EQ(user->attrs().getString("gemm_dtype"), "bf16") << w->name() << " read by " << user->name().str();
        EXPECT_TRUE(user->operand(0) == w || user->operand(1) == w) << w->name();
      }
    }
  }
  // 8 of each of the 4 layers (the GELU activation fc2 reads too, and fc1's h the GELU
  // epilogues read), the final norm, and 13 gradients of the backward (whose GEMMs read the
  // forward's norms and activations: nothing recomputed): 9, and the 4 GELU gradients the DGELU
  // epilogues write (fuse-dgelu); the logits, which the loss reads in BF16; the 17 products
  // only a norm reads (each layer's projection and fc2, which the residual norms add, and the
  // dgrad products of qkv and fc1, and the head's, which the norms' gradients read).
  EXPECT_EQ(stored, 64);
  EXPECT_EQ(program.bf16Rounding.size(), 26u);
  EXPECT_TRUE(program.bf16Stored.count(graph->lookup("logits")));
  for (const char *name : {"h0.attn.qkv.out.norm", "h0.mlp.fc2.out.norm", "h0.mlp.fc2.out.act", "h0.mlp.fc1.out", "h0.res1.grad.dh", "h0.attn.q.bhtd", "h0.attn.k.bhtd", "h0.attn.v.bhtd", "h3.attn.context.bthd", "h3.attn.context.flat"})
    EXPECT_TRUE(program.bf16Stored.count(graph->lookup(name))) << name;
  // The probabilities, which the softmax gradient reads too, keep fp32 and get a BF16 copy;
  // so do gradients whose bias sum reads them.
  EXPECT_FALSE(program.bf16Stored.count(graph->lookup("h0.attn.probs")));
  EXPECT_TRUE(program.bf16Shadowed.count(graph->lookup("h0.attn.probs")));
  for (const Value *v : program.bf16Shadowed) {
    int gemms = 0, others = 0;
    for (const Op *user : v->users())
      ++(user->attrs().getString("gemm_dtype") == "bf16" && (user->operand(0) == v || user->operand(1) == v)
             ? gemms
             : others);
    if (v->def()->kind() != OpKind::Reshape && !llvm::any_of(v->users(), [](const Op *u) { return u->kind() == OpKind::Reshape; })) {
      EXPECT_GT(gemms, 0) << v->name();
      EXPECT_GT(others, 0) << v->name();
    }
  }
  EXPECT_GE(program.bf16Shadowed.size(), 4u * 5); // per layer: probs and four gradients
  for (size_t i = 0; i < ops.size(); ++i) // no GEMM converts such an operand
    if (program.lowering[i].kind == OpLowering::Gemm && isBf16Gemm(*ops[i]))
      for (unsigned k = 0; k < 2; ++k)
        if (program.bf16Stored.count(ops[i]->operand(k)) || program.bf16Shadowed.count(ops[i]->operand(k))) {
          EXPECT_EQ(opLocalBytes(*ops[i], program, i)[program.lowering[i].scratchFloats.size() + k], 0);
        }
  LoweringOptions converting;
  converting.storeBf16 = false;
  CudaProgram fp32Stored = unwrap(lowerToCuda(*graph, converting));
  EXPECT_TRUE(fp32Stored.bf16Stored.empty());
  EXPECT_TRUE(fp32Stored.bf16Shadowed.empty());
  EXPECT_LT(planMemory(*graph, program).arenaBytes, planMemory(*graph, fp32Stored).arenaBytes);
  // Under fp32 nothing is.
  auto [plain, plainProgram] = gpuTrainingProgram("models/seed.yaml", "fp32");
  EXPECT_TRUE(plainProgram.bf16Stored.empty());
  EXPECT_TRUE(plainProgram.bf16Shadowed.empty());
  // With attention fused, its output (the context the projection reads) gets a BF16 copy from
  // the attention kernel (the gradient reads the fp32 value for sum(dout * out)), and so does
  // the packed q | k | v gradient (its bias sum reads it in fp32).
  auto [fused, fusedProgram] = gpuTrainingProgram("models/seed.yaml", "bf16");
  for (int layer = 0; layer < 4; ++layer) {
    const Value *context = fused->lookup(fmt::format("h{}.attn.context.flat", layer));
    ASSERT_TRUE(context);
    EXPECT_EQ(context->def()->kind(), OpKind::Attention);
    EXPECT_TRUE(fusedProgram.bf16Shadowed.count(context)) << context->name();
  }
  int shadowedGradients = 0, shadowedContexts = 0;
  for (const Value *v : fusedProgram.bf16Shadowed) {
    shadowedGradients += v->def()->kind() == OpKind::AttentionBackward;
    shadowedContexts += v->def()->kind() == OpKind::Attention;
  }
  EXPECT_EQ(shadowedGradients, 4);
  EXPECT_EQ(shadowedContexts, 4);
}

TEST(MemoryPlan, Bf16GeluEpiloguesWriteFc1AndItsGradientInBf16) {
  // Under bf16, fc1 is cuBLASLt's GELU_AUX_BIAS epilogue and its GELU's gradient the DGELU
  // epilogue of fc2's dgrad product (fuse-dgelu), both writing BF16: the activation, h and the
  // gradient in BF16 (bf16Stored), each an op of bf16Rounding.
  auto [graph, program] = gpuTrainingProgram("models/seed.yaml", "bf16");
  int forward = 0, gradient = 0;
  for (const Op *op : graph->ops()) {
    if (op->kind() == OpKind::GeluBackward || op->kind() == OpKind::Gelu)
      ADD_FAILURE() << op->name().str() << ": the epilogues take the GELU and its gradient";
    if (op->kind() != OpKind::MatMulBiasGelu && op->kind() != OpKind::MatMulDGelu)
      continue;
    ++(op->kind() == OpKind::MatMulBiasGelu ? forward : gradient);
    EXPECT_TRUE(program.bf16Rounding.count(op)) << op->result()->name();
    for (unsigned r = 0; r < op->numResults(); ++r)
      EXPECT_TRUE(program.bf16Stored.count(op->result(r))) << op->result(r)->name();
  }
  EXPECT_EQ(forward, 4);
  EXPECT_EQ(gradient, 4);
  // With --recompute the gradient recomputes the activation from h with a GELU kernel: fc1 is
  // the BIAS epilogue and a GELU kernel, as without the epilogues.
  auto [recomputed, recomputedProgram] = gpuTrainingProgram("models/seed.yaml", "bf16", {}, /*recompute=*/true);
  int normed = 0; // the logits' GEMM, and the 17 products only norms read
  for (const Op *op : recomputedProgram.bf16Rounding) {
    if (op->result()->name() == "logits")
      continue;
    ++normed;
    for (const Op *user : op->result()->users())
      EXPECT_TRUE(user->kind() == OpKind::ResidualNorm || user->kind() == OpKind::LayerNormBackward)
          << op->result()->name() << " read by " << user->name().str();
  }
  EXPECT_EQ(normed, 17);
  EXPECT_EQ(recomputedProgram.bf16Rounding.size(), 18u);
  EXPECT_FALSE(llvm::any_of(recomputed->ops(), [](const Op *op) { return op->kind() == OpKind::MatMulBiasGelu; }));
  // Under fp8 with FP8 layers (the tiny model's fp8_min_dim 16: all but the head), each FP8
  // product adds its bias in its epilogue (fuse-fp8-bias: the parameter's BF16 copy, so each is
  // in bf16Rounding), and fc1's writes h in BF16 for fc2's quantize, which applies the GELU
  // (fuse-gelu-quantize), and fc1's output gradient's quantize, which makes the GELU's gradient
  // of it and of fc2's dgrad, which writes that in BF16 (bf16Rounding too).
  auto [fp8, fp8Program] = gpuTrainingProgram("models/tiny.yaml", "fp8");
  int kept = 0, biased = 0;
  for (const Op *op : fp8->ops()) {
    if (op->kind() == OpKind::Add && op->operand(0)->def()->kind() == OpKind::MatMul)
      ADD_FAILURE() << op->result()->name() << ": a bias added after its product";
    if (op->kind() != OpKind::MatMulBias || !isFp8(op->operand(0)->type().dtype))
      continue;
    ++biased;
    EXPECT_TRUE(fp8Program.bf16Rounding.count(op)) << op->result()->name();
    auto quantizesGelu = [](const Op *user, const char *activation) {
      return user->kind() == OpKind::Quantize &&
             activationName(quantizeOptions(user->attrs()).activation) == std::string(activation);
    };
    bool gelu = llvm::any_of(op->result()->users(), [&](const Op *user) { return quantizesGelu(user, "gelu"); });
    if (!gelu)
      continue;
    ++kept;
    EXPECT_TRUE(fp8Program.bf16Stored.count(op->result())) << op->result()->name();
    for (const Op *user : op->result()->users()) {
      bool gradient = quantizesGelu(user, "gelu_backward");
      EXPECT_TRUE(quantizesGelu(user, "gelu") || gradient) << user->name().str();
      if (!gradient)
        continue;
      EXPECT_EQ(user->operand(3), op->result());
      const Value *dy = user->operand(0);
      EXPECT_TRUE(fp8Program.bf16Stored.count(dy)) << dy->name();
      EXPECT_TRUE(fp8Program.bf16Rounding.count(dy->def())) << dy->name();
    }
  }
  EXPECT_EQ(biased, 8); // qkv, proj, fc1, fc2 of the tiny model's two layers
  EXPECT_EQ(kept, 2);
  EXPECT_TRUE(fp8Program.bf16Stored.count(fp8->lookup("h0.mlp.fc1.out")));
  EXPECT_FALSE(llvm::any_of(fp8->ops(), [](const Op *op) { return op->kind() == OpKind::GeluBackward; }));
  EXPECT_NE(fp8Program.source.find("quantize(const unsigned short *x,"), std::string::npos) << "no quantize reads BF16";
  EXPECT_NE(fp8Program.source.find("(quantizeGelu(x), scale, q, qT, scaleInv"), std::string::npos)
      << "no quantize applies the GELU";
  EXPECT_NE(fp8Program.source.find("(quantizeGeluGradient(x, h), scale, q, qT, scaleInv"), std::string::npos)
      << "no quantize makes the GELU's gradient";
  // fp32 keeps the fp32 epilogue and the GELU gradient kernel.
  auto [plain, plainProgram] = gpuTrainingProgram("models/seed.yaml", "fp32");
  EXPECT_TRUE(plainProgram.bf16Rounding.empty());
  EXPECT_TRUE(llvm::any_of(plain->ops(), [](const Op *op) { return op->kind() == OpKind::GeluBackward; }));
}

TEST(MemoryPlan, AdamWUngroupedWhenOneUpdateIsNotInPlace) {
  // %late reads the old %m1, so %m1.new is not written in place: that update keeps its own
  // kernel, its parameter is not laid out with a gradient, and so neither AdamW op is grouped.
  auto graph = unwrap(parseGraph(R"(graph @g
%p0 = param() {init="normal", std=1.0} : f32[8]
%p1 = param() {init="normal", std=1.0} : f32[8]
%x = input() : f32[8]
%g0 = gelu(%x) : f32[8]
%g1 = silu(%x) : f32[8]
%m0 = state() {init="zeros"} : f32[8]
%v0 = state() {init="zeros"} : f32[8]
%m1 = state() {init="zeros"} : f32[8]
%v1 = state() {init="zeros"} : f32[8]
%lr = input() : f32[]
%clip = input() : f32[]
%step = input() : i32[]
%p0.new, %m0.new, %v0.new = adamw(%p0, %g0, %m0, %v0, %lr, %clip, %step) {beta1=0.9, beta2=0.95, eps=1e-08, weight_decay=0.1} : f32[8], f32[8], f32[8]
%p1.new, %m1.new, %v1.new = adamw(%p1, %g1, %m1, %v1, %lr, %clip, %step) {beta1=0.9, beta2=0.95, eps=1e-08, weight_decay=0.0} : f32[8], f32[8], f32[8]
%late = add(%m1, %x) : f32[8]
assign(%p0, %p0.new)
assign(%m0, %m0.new)
assign(%v0, %v0.new)
assign(%p1, %p1.new)
assign(%m1, %m1.new)
assign(%v1, %v1.new)
return %late
)", "t.ir"));
  ASSERT_TRUE(graph);
  CudaProgram program = unwrap(lowerToCuda(*graph));
  const ParameterLayout &layout = program.layout;
  ASSERT_EQ(layout.updates.size(), 1u);
  EXPECT_EQ(layout.updates[0]->result()->name(), "p0.new");
  EXPECT_EQ(layout.params.lookup(graph->lookup("p0")), 0); // the updated one first
  EXPECT_EQ(layout.params.lookup(graph->lookup("p1")), 512);
  EXPECT_TRUE(layout.grads.count(graph->lookup("g0")));
  EXPECT_FALSE(layout.grads.count(graph->lookup("g1")));
  std::vector<Op *> ops = graph->ops();
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i]->kind() == OpKind::AdamW) {
      EXPECT_EQ(program.lowering[i].kind, OpLowering::Kernels);
      EXPECT_TRUE(program.lowering[i].arguments.empty());
    }
  EXPECT_EQ(program.source.find("adamw_flat"), std::string::npos);
}

TEST(MemoryPlan, KvCacheWrittenInPlace) {
  // The decode step's cache write (the attention's, fuse-kv-write) goes straight into both
  // caches: one row a token, not a copy of the whole cache; its kernel writes only the new rows.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 2, GPTOutput::Decode));
  ASSERT_TRUE(graph);
  PipelineOptions options;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/false, Recipe::Fp32), options));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  CudaProgram program = unwrap(lowerToCuda(*graph));
  auto inPlace = inPlaceValues(*graph, program);
  int writes = 0;
  for (const Op *op : graph->ops()) {
    EXPECT_NE(op->kind(), OpKind::KvWrite);
    if (op->kind() == OpKind::DecodeAttention && writesCache(op->attrs())) {
      ++writes;
      EXPECT_EQ(inPlace.lookup(op->result(1)), op->operand(1)) << op->result()->name();
      EXPECT_EQ(inPlace.lookup(op->result(2)), op->operand(2)) << op->result()->name();
    }
  }
  EXPECT_EQ(writes, c.layers);
  EXPECT_EQ(program.source.find("kvCopy<"), std::string::npos);
  EXPECT_TRUE(program.bf16Stored.empty()); // fp32: the caches stay fp32
}

TEST(MemoryPlan, Bf16KvCachesTakeHalfTheState) {
  // Under bf16 the decode step's caches hold BF16 (the writes round, the attention reads BF16):
  // each cache and its write's result are stored in two bytes an element, and the state
  // region is half of fp32's. The prefill program's caches likewise, so the two can share them.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  for (GPTOutput output : {GPTOutput::Decode, GPTOutput::Prefill}) {
    auto graph = unwrap(buildGPT(c, 2, output, output == GPTOutput::Prefill ? 16 : 0));
    ASSERT_TRUE(graph);
    PipelineOptions options;
    options.passOptions.precision.recipe = Recipe::Bf16;
    auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/false, Recipe::Bf16), options));
    ASSERT_FALSE(bool(pipeline.run(*graph)));
    CudaProgram program = unwrap(lowerToCuda(*graph));
    int caches = 0;
    for (const Op *op : graph->ops())
      if (op->kind() == OpKind::State) {
        ++caches;
        EXPECT_TRUE(program.bf16Stored.count(op->result())) << op->result()->name();
      } else if (op->kind() == OpKind::KvWrite) {
        EXPECT_TRUE(program.bf16Stored.count(op->result(0)) && program.bf16Stored.count(op->result(1)));
      } else if (op->kind() == OpKind::DecodeAttention) {
        EXPECT_TRUE(program.bf16Stored.count(op->result(1)) && program.bf16Stored.count(op->result(2)));
      } else {
        continue;
      }
    EXPECT_EQ(caches, 2 * c.layers);
    EXPECT_EQ(program.layout.stateBytes, 2 * c.layers * (2 * c.seqLen * c.dModel * 2));
    bool decode = output == GPTOutput::Decode;
    EXPECT_EQ(program.source.find("decodeAttention<true") != std::string::npos, decode);
    EXPECT_NE(program.source.find("Bf16Out kOut, Bf16Out vOut"), std::string::npos);
  }
}

TEST(MemoryPlan, APromptsFc1WritesItsBf16GeluWithoutThePreActivation) {
  // A bf16 prompt of 8 x 16 rows (past the few-row products): each fc1 is a matmul_bias_gelu
  // whose h nothing reads (fuse-gelu-epilogue), run as GELU_BIAS (geluWithoutAux), its
  // activation stored in BF16 for fc2 and its bias the BF16 copy. A training step's fc1 keeps
  // h for the gradient: GELU_AUX_BIAS.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  for (bool training : {false, true}) {
    auto graph = unwrap(buildGPT(c, 8, training ? GPTOutput::Loss : GPTOutput::Prefill, training ? 0 : 16));
    ASSERT_TRUE(graph);
    PipelineOptions options;
    options.passOptions.precision.recipe = Recipe::Bf16;
    options.passOptions.train = c.train;
    auto pipeline = unwrap(PassPipeline::create(gpuPipeline(training, Recipe::Bf16), options));
    ASSERT_FALSE(bool(pipeline.run(*graph)));
    CudaProgram program = unwrap(lowerToCuda(*graph));
    int fc1 = 0;
    for (const Op *op : graph->ops()) {
      // (A prompt's last layer runs on one row a sequence, prune-last-rows: a few-row product.)
      if (op->kind() != OpKind::MatMulBiasGelu || fewRows(*op) != FewRows::None)
        continue;
      ++fc1;
      EXPECT_EQ(program.geluWithoutAux.count(op), training ? 0u : 1u) << op->result()->name();
      EXPECT_TRUE(program.bf16Stored.count(op->result(0))) << op->result()->name();
      EXPECT_TRUE(program.bf16Rounding.count(op)) << op->result()->name();
    }
    EXPECT_EQ(fc1, training ? c.layers : c.layers - 1);
    EXPECT_EQ(program.geluWithoutAux.size(), training ? 0u : size_t(c.layers)); // (the few-row one too)
  }
}

TEST(MemoryPlan, InPlaceOnlyWhereNothingReadsTheOldValueAfterwards) {
  // AdamW's parameter and second moment go in place; its first moment does not, because %late
  // reads the old %m after the update. %t reads %s through gelu, not an in-place kernel, so it
  // does not either; %u.new reads no %u and nothing reads %u after it, so it does. %both is
  // assigned to two leaves, so it stays a value of its own, copied to each.
  auto graph = unwrap(parseGraph(R"(graph @g
%p = param() {init="normal", std=1.0} : f32[8]
%g = input() : f32[8]
%m = state() {init="zeros"} : f32[8]
%v = state() {init="zeros"} : f32[8]
%lr = input() : f32[]
%clip = input() : f32[]
%step = input() : i32[]
%p.new, %m.new, %v.new = adamw(%p, %g, %m, %v, %lr, %clip, %step) {beta1=0.9, beta2=0.95, eps=1e-08, weight_decay=0.1} : f32[8], f32[8], f32[8]
%late = add(%m, %g) : f32[8]
%s = state() {init="zeros"} : f32[8]
%t = gelu(%s) : f32[8]
%u = state() {init="zeros"} : f32[8]
%u.new = gelu(%g) : f32[8]
%w1 = state() {init="zeros"} : f32[8]
%w2 = state() {init="zeros"} : f32[8]
%both = silu(%g) : f32[8]
assign(%p, %p.new)
assign(%m, %m.new)
assign(%v, %v.new)
assign(%s, %t)
assign(%u, %u.new)
assign(%w1, %both)
assign(%w2, %both)
return %late
)", "t.ir"));
  ASSERT_TRUE(graph);
  CudaProgram program = unwrap(lowerToCuda(*graph));
  auto inPlace = inPlaceValues(*graph, program);
  EXPECT_EQ(inPlace.lookup(graph->lookup("p.new")), graph->lookup("p"));
  EXPECT_EQ(inPlace.lookup(graph->lookup("v.new")), graph->lookup("v"));
  EXPECT_FALSE(inPlace.count(graph->lookup("m.new"))); // %late reads the old %m
  EXPECT_FALSE(inPlace.count(graph->lookup("t")));     // gelu is not an in-place kernel
  EXPECT_EQ(inPlace.lookup(graph->lookup("u.new")), graph->lookup("u"));
  EXPECT_FALSE(inPlace.count(graph->lookup("both"))); // one buffer cannot be two leaves
  EXPECT_EQ(inPlace.size(), 3u);
}

TEST(MemoryPlan, AnAllReduceOfAValueOnlyItReadsReducesItInPlace) {
  // ZeRO-1's whole gradients (and the loss, the norm's sum) are all-reduced in the arena: into
  // the operand's own bytes where nothing else reads it (%g, so %r's memory is %g's), into bytes
  // of their own where something does (%h, read by %y after the reduction).
  auto graph = unwrap(parseGraph(R"(graph @g
%x = input() : f32[64,32]
%g = mul(%x, %x) : f32[64,32]
%h = add(%x, %x) : f32[64,32]
%r, %s = all_reduce(%g, %h) {reduce="avg"} : f32[64,32], f32[64,32]
%y = add(%r, %h) : f32[64,32]
%z = add(%y, %s) : f32[64,32]
return %z
)", "t.ir"));
  ASSERT_TRUE(graph);
  CudaProgram program = unwrap(lowerToCuda(*graph));
  MemoryPlan plan = planMemory(*graph, program);
  auto offset = [&](const char *name) { return plan.offsets.lookup(graph->lookup(name)); };
  EXPECT_EQ(offset("r"), offset("g"));
  EXPECT_NE(offset("s"), offset("h"));
  EXPECT_NE(offset("r"), offset("h"));
  EXPECT_NE(offset("s"), offset("r"));
}

} // namespace
