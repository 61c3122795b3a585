// cuDNN's run-time loader (backends/cuda/libraries/Cudnn.h) and the lowering of the attention ops cuDNN
// runs, without a GPU: what the loader finds and says, and which launches, BF16 values and
// buffers the lowering gives cuDNN's attention. (cuDNN's results against the CPU: GpuKernelsTest.cpp.)
#include "ir/Attributes.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/Pipeline.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

#include <algorithm>
#include <cstdlib>

#include <gtest/gtest.h>

using namespace tgc;
using namespace tgc::test;

namespace {

TEST(Cudnn, AbsentLibrariesAreOneErrorNamingEachPlaceTried) {
  std::string error = llvm::toString(
      loadCudnnFrom({"/nonexistent/libcudnn.so.9", "/lib/x86_64-linux-gnu/libm.so.6"}).takeError());
  EXPECT_NE(error.find("error: cuDNN (libcudnn.so.9) was not found"), std::string::npos) << error;
  EXPECT_NE(error.find("TGC_CUDNN_LIBRARY"), std::string::npos) << error;
  EXPECT_NE(error.find("/nonexistent/libcudnn.so.9 ("), std::string::npos) << error;
  if (llvm::sys::fs::exists("/lib/x86_64-linux-gnu/libm.so.6")) {
    EXPECT_NE(error.find("libm.so.6 (not cuDNN 9: no cudnnGetVersion)"), std::string::npos) << error;
  }
  EXPECT_NE(llvm::toString(loadCudnnFrom({}).takeError()).find("nothing"), std::string::npos);
}

TEST(Cudnn, TheSearchStartsWithTheUsersPathAloneThenTheToolkitThenTheSystem) {
  setenv("TGC_CUDNN_LIBRARY", "/given/libcudnn.so.9", 1);
  EXPECT_EQ(cudnnCandidates(), std::vector<std::string>{"/given/libcudnn.so.9"});
  unsetenv("TGC_CUDNN_LIBRARY");
  std::vector<std::string> candidates = cudnnCandidates();
  auto at = [&](const std::string &path) { return std::find(candidates.begin(), candidates.end(), path); };
  ASSERT_NE(at("libcudnn.so.9"), candidates.end());
  EXPECT_LT(at("/usr/local/cuda/lib64/libcudnn.so.9"), at("libcudnn.so.9"));
  for (auto it = at("libcudnn.so.9") + 1; it != candidates.end(); ++it)
    EXPECT_NE(it->find("nvidia/cudnn/lib/libcudnn.so.9"), std::string::npos) << *it;
}

// Where the machine has cuDNN 9 (the CUDA toolkit's copy on the development machines), it
// loads and reports its version; elsewhere the test says what was tried.
TEST(Cudnn, LoadsWhereTheMachineHasIt) {
  auto api = loadCudnnFrom(cudnnCandidates());
  if (!api)
    GTEST_SKIP() << llvm::toString(api.takeError());
  EXPECT_GE(api->version, 90000u) << api->path;
  EXPECT_LT(api->version, 100000u) << api->path;
  EXPECT_TRUE(api->createDescriptor && api->setAttribute && api->finalize && api->execute);
  EXPECT_STREQ(api->errorString(0), "CUDNN_STATUS_SUCCESS");
}

/// The tiny model's training program as the GPU compiles it, in BF16 or (every linear layer
/// but the head) FP8.
std::unique_ptr<Graph> tinyTraining(Recipe recipe, const char *model = "models/tiny.yaml") {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  auto graph = unwrap(buildGPT(c, 4, GPTOutput::Loss));
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision;
  options.passOptions.precision.recipe = recipe;
  options.passOptions.precision.fp8MinDim = 16;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(true, recipe), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}
std::unique_ptr<Graph> tinyBf16Training() { return tinyTraining(Recipe::Bf16); }

TEST(CudnnLowering, TheAttentionOpsCudnnRunsKeepOnlyTheirConversionsAndReadWriteBf16) {
  auto graph = tinyBf16Training();
  ASSERT_TRUE(graph);
  // Without bf16Rounding the GEMMs write fp32: q, k, v and dout go to head-major BF16 first.
  LoweringOptions options;
  options.bf16Rounding = false;
  std::vector<const Op *> attention;
  for (const Op *op : graph->ops())
    if (auto shape = cudnnAttentionShape(*graph, *op, options)) {
      EXPECT_FALSE(shape->qkvRows || shape->doutRows);
      options.cudnnAttention[op] = 4096; // bytes of workspace
      attention.push_back(op);
    }
  ASSERT_EQ(attention.size(), 4u); // two layers, forward and gradient
  LoweringOptions tgcOptions;
  tgcOptions.bf16Rounding = false;
  CudaProgram tgcKernels = unwrap(lowerToCuda(*graph, tgcOptions));
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  EXPECT_TRUE(program.qkvRows.empty() && program.doutRows.empty());
  std::vector<Op *> ops = graph->ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op *op = ops[i];
    const OpLowering &l = program.lowering[i];
    if (!options.cudnnAttention.count(op)) {
      EXPECT_FALSE(l.cudnnAttention);
      continue;
    }
    SCOPED_TRACE(op->result()->name());
    bool backward = op->kind() == OpKind::AttentionBackward;
    ASSERT_TRUE(l.cudnnAttention);
    // run()'s buffers and the workspace, each an entry of the launches' pointer list.
    ASSERT_EQ(l.libraryBuffers.size(), CudnnAttention::operandCount(*cudnnAttentionShape(*graph, *op)) + 1);
    EXPECT_EQ(l.scratchFloats.back(), 4096 / 4); // the workspace, last
    if (!backward) {
      // q, k and v to head-major BF16 (keep-attention-heads' result), then cuDNN writes out in
      // BF16: its readers (the projection's GEMM, cuDNN's gradient) read BF16.
      ASSERT_EQ(l.launches.size(), 1u);
      EXPECT_EQ(l.libraryAt, 1u);
      EXPECT_TRUE(program.bf16Stored.count(op->result(0)));
      EXPECT_FALSE(tgcKernels.bf16Stored.count(op->result(0)));
      EXPECT_EQ(l.libraryBuffers[1].offset - l.libraryBuffers[0].offset,
                l.libraryBuffers[2].offset - l.libraryBuffers[1].offset); // k after q, v after k
    } else {
      // dout to head-major BF16, then cuDNN writes dqkv in BF16: its readers (the GEMMs, the
      // bias gradient's column sums) read BF16.
      ASSERT_EQ(l.launches.size(), 1u);
      EXPECT_EQ(l.libraryAt, 1u);
      EXPECT_TRUE(program.bf16Stored.count(op->result(0)));
      int64_t D = op->result(0)->type().dim(2) / 3;
      EXPECT_EQ(l.libraryBuffers[7].offset, 2 * D); // dk: D BF16 elements into dqkv's rows
      EXPECT_EQ(l.libraryBuffers[8].offset, 4 * D); // dv
      EXPECT_EQ(l.libraryBuffers[6].pointer, l.libraryBuffers[8].pointer);
    }
  }
  EXPECT_NE(program.source.find("columnSumPartials<") , std::string::npos);
  EXPECT_NE(program.source.find("const unsigned short *x, float *out, float *scratch"), std::string::npos)
      << "the qkv bias gradient reads dqkv in BF16";
  EXPECT_EQ(program.source.find("attentionForwardBf16<"), std::string::npos);
  EXPECT_NE(tgcKernels.source.find("attentionForwardBf16<"), std::string::npos);
  EXPECT_NE(program.source.find("toHeadsBf16<"), std::string::npos);
}

TEST(CudnnLowering, TheLlamaBlocksAttentionGivesCudnnKeyValueHeadsAfterRotatingThem) {
  // llama-tiny (head dimension 16, two KV heads for four query heads, RoPE): cuDNN's forward
  // reads q of four heads then k and v of two from the head-major copy the rotating conversion
  // wrote and keeps for the gradient; the gradient writes dq, dk and dv into the rows of dqkv,
  // (4 + 2 * 2) * 16 wide, which go back through the inverse rotation.
  auto graph = tinyTraining(Recipe::Bf16, "models/llama-tiny.yaml");
  ASSERT_TRUE(graph);
  LoweringOptions options;
  int forwards = 0;
  for (const Op *op : graph->ops())
    if (auto shape = cudnnAttentionShape(*graph, *op, options)) {
      forwards += op->kind() == OpKind::Attention;
      EXPECT_FALSE(shape->qkvRows); // q and k are rotated first
      EXPECT_EQ(shape->KV, 2);
      options.cudnnAttention[op] = 4096;
    }
  EXPECT_EQ(forwards, 2);
  ASSERT_EQ(options.cudnnAttention.size(), 4u); // two layers' forwards and gradients
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  const int64_t B = 4, T = 32, D = 64, Dh = 16, KV = 2, qBytes = B * T * D * 2, kvBytes = B * T * KV * Dh * 2;
  std::vector<Op *> ops = graph->ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!options.cudnnAttention.count(ops[i]))
      continue;
    const OpLowering &l = program.lowering[i];
    SCOPED_TRACE(ops[i]->result()->name());
    bool forward = ops[i]->kind() == OpKind::Attention;
    ASSERT_EQ(l.libraryBuffers.size(), (forward ? 5u : 10u) + 1);
    EXPECT_EQ(l.libraryBuffers[1].offset, qBytes);           // k after q's four heads
    EXPECT_EQ(l.libraryBuffers[2].offset, qBytes + kvBytes); // v after k's two
    if (forward) {
      EXPECT_EQ(l.libraryAt, 1u); // after the rotating conversion
      continue;
    }
    // q, k and v from the forward's rotated head-major copy (keep-attention-heads): the inverse
    // rotation of dq and dk is the gradient's one launch.
    EXPECT_TRUE(isHeadMajor(ops[i]->attrs()));
    EXPECT_EQ(l.launches.size(), 1u);
    EXPECT_EQ(l.libraryAt, 0u);
    EXPECT_EQ(l.libraryBuffers[7].offset, 2 * D);             // dk: D BF16 elements into a row
    EXPECT_EQ(l.libraryBuffers[8].offset, 2 * (D + KV * Dh)); // dv after dk's two heads
  }
  EXPECT_NE(program.source.find("toHeadsBf16<4, 32, 3, 4, 16, 2, true>"), std::string::npos);
  EXPECT_EQ(program.source.find("attentionForwardBf16<"), std::string::npos);
  EXPECT_EQ(program.source.find("attentionKeyValueGradBf16<"), std::string::npos);
  EXPECT_NE(program.source.find("ropeRows<4, 32, 4, 2, 16, true>"), std::string::npos); // dq, dk turned back
}

TEST(CudnnLowering, Fp8AttentionGivesCudnnTheQuantizedRowsTheStatesScalesAndAmaxes) {
  // fp8_attention and its gradient (tiny, fp8_attention): cuDNN reads q, k and v in the rows of
  // the quantized qkv (D bytes apart), dout in its quantized rows, the descales and scales from
  // the ops' state operands, and writes the amaxes into the ops' results; out's and dqkv's scales
  // are 1s a launch writes first.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.precision.fp8Attention = true;
  auto graph = unwrap(buildGPT(c, 4, GPTOutput::Loss));
  ASSERT_TRUE(graph);
  PipelineOptions pipelineOptions;
  pipelineOptions.passOptions.train = c.train;
  pipelineOptions.passOptions.precision = c.precision;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(true, Recipe::Fp8), pipelineOptions));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  LoweringOptions options;
  options.multiprocessors = 132; // as on a GPU: only the ops given to cuDNN below are its
  for (const Op *op : graph->ops())
    if (auto shape = cudnnAttentionShape(*graph, *op, options)) {
      EXPECT_TRUE(shape->fp8.enabled && shape->qkvRows);
      EXPECT_EQ(shape->doutRows, shape->backward);
      if (shape->backward) {
        EXPECT_EQ(shape->fp8.grad, CudnnType::E4M3); // cuDNN's FP8 gradient's, under hybrid too
      }
      options.cudnnAttention[op] = 4096;
    }
  ASSERT_EQ(options.cudnnAttention.size(), 4u);
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  const int64_t D = 64;
  std::vector<Op *> ops = graph->ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!options.cudnnAttention.count(ops[i]))
      continue;
    const Op &op = *ops[i];
    const OpLowering &l = program.lowering[i];
    SCOPED_TRACE(op.result()->name());
    bool forward = op.kind() == OpKind::Fp8Attention;
    ASSERT_EQ(l.libraryBuffers.size(), CudnnAttention::operandCount(*cudnnAttentionShape(*graph, op, options)) + 1);
    EXPECT_EQ(l.scratchFloats.back(), 4096 / 4); // the workspace, last
    unsigned q = forward ? 0 : 1;
    for (int k = 0; k < 3; ++k) { // q, k, v in the quantized rows, one byte an element
      EXPECT_EQ(l.libraryBuffers[size_t(k)].pointer, q);
      EXPECT_EQ(l.libraryBuffers[size_t(k)].offset, k * D);
    }
    unsigned results = op.numOperands();
    // out and dqkv stored in BF16 as cuDNN writes them: the quantizes, the bias gradient's
    // column sums and the gradient read them so (no widening, no rounding launch).
    EXPECT_TRUE(program.bf16Stored.count(op.result(0)));
    EXPECT_EQ(l.launches.size(), 1u); // the unit scales alone
    if (forward) {
      // descale q, k, v (q_scale_inv), S (s_scale_inv); scale S, O (a 1); amax S (the result), O.
      EXPECT_EQ(l.libraryAt, 1u);
      for (size_t k : {5, 6, 7})
        EXPECT_EQ(l.libraryBuffers[k].pointer, 1u);
      EXPECT_EQ(l.libraryBuffers[8].pointer, 3u);
      EXPECT_EQ(l.libraryBuffers[9].pointer, 2u);
      EXPECT_EQ(l.libraryBuffers[11].pointer, results + 2); // amax_s (out and lse stored without copies)
      continue;
    }
    EXPECT_EQ(l.libraryBuffers[4].pointer, 0u); // dout
    EXPECT_EQ(l.libraryBuffers[5].pointer, 3u); // lse
    EXPECT_EQ(l.libraryBuffers[7].offset, 2 * D); // dk: D BF16 elements into dqkv's rows
    EXPECT_EQ(l.libraryBuffers[8].offset, 4 * D);
    // Descales q, k, v, O (1), dout, S, dP; scales S, dP.
    std::vector<unsigned> want = {4, 4, 4, 0, 5, 7, 9, 6, 8};
    for (size_t k = 0; k < want.size(); ++k)
      if (k != 3) {
        EXPECT_EQ(l.libraryBuffers[9 + k].pointer, want[k]) << k;
      }
    EXPECT_EQ(l.libraryBuffers[21].pointer, results + 1); // amax_dp (dqkv stored without a copy)
  }
  EXPECT_NE(program.source.find("fill<1>(scratch0, 1.0f)"), std::string::npos);
  EXPECT_NE(program.source.find("fill<16>(scratch0, 1.0f)"), std::string::npos);
  EXPECT_EQ(program.source.find("attentionForwardBf16<"), std::string::npos);
  EXPECT_EQ(program.source.find("widenBf16<"), std::string::npos);
  // qkv and dout written in BF16 by their products for the quantizes alone reading them.
  for (const Op *op : graph->ops())
    if (op->kind() == OpKind::Fp8Attention || op->kind() == OpKind::Fp8AttentionBackward) {
      const Value *quantized = op->operand(0); // q, or dout's quantize
      const Op *quantize = quantized->def();
      ASSERT_TRUE(quantize && quantize->kind() == OpKind::Quantize);
      EXPECT_TRUE(program.bf16Stored.count(quantize->operand(0))) << quantize->operand(0)->name();
      EXPECT_TRUE(program.bf16Rounding.count(quantize->operand(0)->def()));
    }
}

TEST(CudnnLowering, CudnnReadsQkvAndDoutWhereTheirGemmsWriteThemInBf16) {
  // With bf16Rounding (the default), the qkv GEMM writes BF16 rows (its bias from the
  // parameters' BF16 copy) and cuDNN's forward and gradient read q, k and v there, D elements
  // apart; the copy keep-attention-heads made is qkv's memory. The projection's dgrad writes dout
  // in BF16 rows, which the gradient reads. No conversion is left.
  auto graph = tinyBf16Training();
  ASSERT_TRUE(graph);
  LoweringOptions options;
  for (const Op *op : graph->ops())
    if (auto shape = cudnnAttentionShape(*graph, *op, options)) {
      EXPECT_TRUE(shape->qkvRows);
      EXPECT_EQ(shape->doutRows, op->kind() == OpKind::AttentionBackward);
      EXPECT_NE(shape->key().find("qkv rows"), std::string::npos);
      options.cudnnAttention[op] = 4096;
    }
  ASSERT_EQ(options.cudnnAttention.size(), 4u);
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  EXPECT_EQ(program.qkvRows.size(), 2u);
  EXPECT_EQ(program.doutRows.size(), 2u);
  MemoryPlan plan = planMemory(*graph, program);
  std::vector<Op *> ops = graph->ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op *op = ops[i];
    const OpLowering &l = program.lowering[i];
    if (!options.cudnnAttention.count(op))
      continue;
    SCOPED_TRACE(op->result()->name());
    int64_t D = op->kind() == OpKind::Attention ? op->operand(0)->type().dim(2) / 3 : op->result()->type().dim(2) / 3;
    EXPECT_TRUE(l.launches.empty()); // out is stored in BF16 too
    EXPECT_EQ(l.libraryAt, 0u);
    unsigned qkv = op->kind() == OpKind::Attention ? 0 : 1; // the operand q, k and v are in
    for (int part = 0; part < 3; ++part) {
      EXPECT_EQ(l.libraryBuffers[part].pointer, qkv);
      EXPECT_EQ(l.libraryBuffers[part].offset, part * 2 * D);
    }
    if (op->kind() == OpKind::Attention) {
      const Value *packed = op->operand(0), *heads = op->result(2);
      EXPECT_EQ(program.qkvRows.lookup(heads), packed);
      EXPECT_TRUE(program.bf16Stored.count(packed));
      EXPECT_TRUE(program.bf16Rounding.count(packed->def())); // the bias from its BF16 copy
      EXPECT_EQ(packed->def()->kind(), OpKind::MatMulBias);
      ASSERT_TRUE(plan.offsets.count(heads));
      EXPECT_EQ(plan.offsets.lookup(heads), plan.offsets.lookup(packed));
    } else {
      const Value *dout = op->operand(0);
      EXPECT_EQ(l.libraryBuffers[4].pointer, 0u); // dout, as its GEMM wrote it
      EXPECT_EQ(l.libraryBuffers[4].offset, 0);
      EXPECT_TRUE(program.bf16Stored.count(dout));
      EXPECT_TRUE(program.bf16Rounding.count(dout->def()));
    }
  }
  EXPECT_EQ(program.source.find("toHeadsBf16<"), std::string::npos);
}

TEST(CudnnLowering, APrefillsQkvGemmWritesBf16RowsThatCudnnAndTheCacheWritesRead) {
  // A prefill's attention keeps no heads: qkv, read by it and by the BF16 kv_write alone, is
  // written in BF16 by its GEMM (the bias from the BF16 copy), cuDNN reads q, k and v in its rows
  // (no head-major copy), and the cache write reads those rows as BF16. Without cuDNN the
  // attention's kernels read fp32 qkv as before.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 4, GPTOutput::Prefill, 32)); // 128 rows: cuBLASLt's products
  PipelineOptions pipelineOptions;
  pipelineOptions.passOptions.precision.recipe = Recipe::Bf16;
  // (Every layer's attention output read by its projection: the last layer's whole, not its
  // last rows alone, whose gather reads fp32.)
  pipelineOptions.disabled = {"prune-last-rows"};
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/false, Recipe::Bf16), pipelineOptions));
  ASSERT_FALSE(bool(pipeline.run(*graph)));
  CudaProgram without = unwrap(lowerToCuda(*graph));
  LoweringOptions options;
  for (const Op *op : graph->ops())
    if (auto shape = cudnnAttentionShape(*graph, *op, options)) {
      EXPECT_TRUE(shape->qkvRows);
      options.cudnnAttention[op] = 4096;
    }
  ASSERT_EQ(options.cudnnAttention.size(), size_t(c.layers));
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  EXPECT_TRUE(program.qkvRows.empty()); // no heads to alias
  std::vector<Op *> ops = graph->ops();
  int writes = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op *op = ops[i];
    if (op->kind() == OpKind::KvWrite) {
      ++writes;
      EXPECT_TRUE(program.bf16Stored.count(op->operand(2))) << op->result()->name();
      EXPECT_FALSE(without.bf16Stored.count(op->operand(2))) << op->result()->name();
    }
    if (!options.cudnnAttention.count(op))
      continue;
    SCOPED_TRACE(op->result()->name());
    const Value *qkv = op->operand(0);
    EXPECT_TRUE(program.bf16Stored.count(qkv));
    EXPECT_TRUE(program.bf16Rounding.count(qkv->def()));
    const OpLowering &l = program.lowering[i];
    EXPECT_TRUE(l.launches.empty());
    int64_t D = qkv->type().dim(2) / 3;
    for (int part = 0; part < 3; ++part) {
      EXPECT_EQ(l.libraryBuffers[part].pointer, 0u);
      EXPECT_EQ(l.libraryBuffers[part].offset, part * 2 * D);
    }
  }
  EXPECT_EQ(writes, c.layers);
  EXPECT_EQ(program.source.find("toHeadsBf16<"), std::string::npos);
  EXPECT_NE(program.source.find("const unsigned short *qkv"), std::string::npos);
  EXPECT_EQ(without.source.find("const unsigned short *qkv"), std::string::npos);
}

TEST(CudnnLowering, FP8QuantizesReadCudnnsOutAndDqkvInBf16) {
  // Under FP8 the projection's input quantize reads the attention's out and the qkv output
  // gradient's quantize reads dqkv: cuDNN writes both in BF16, which the quantizes read as they
  // are (the fp32 form would hold the same values), so neither is widened to fp32, nor out
  // rounded back for the gradient.
  auto graph = tinyTraining(Recipe::Fp8);
  ASSERT_TRUE(graph);
  LoweringOptions options;
  for (const Op *op : graph->ops())
    if (cudnnAttentionShape(*graph, *op, options))
      options.cudnnAttention[op] = 4096;
  ASSERT_EQ(options.cudnnAttention.size(), 4u);
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  int quantizes = 0;
  for (const Op *op : graph->ops()) {
    if (!options.cudnnAttention.count(op))
      continue;
    SCOPED_TRACE(op->result()->name());
    const Value *v = op->result(0); // out, or dqkv
    EXPECT_TRUE(program.bf16Stored.count(v));
    EXPECT_FALSE(program.bf16Shadowed.count(v));
    for (const Op *user : v->users())
      if (user->kind() == OpKind::Quantize) {
        ++quantizes;
        EXPECT_EQ(fp8FormatOf(user->attrs()), op->kind() == OpKind::Attention ? Fp8Format::E4M3 : Fp8Format::E5M2);
      }
  }
  EXPECT_EQ(quantizes, 4); // two layers: the projection's input, qkv's output gradient
  EXPECT_EQ(program.source.find("widenBf16<"), std::string::npos);
  EXPECT_EQ(program.source.find("roundToBf16("), std::string::npos);
  // Without cuDNN tgc's kernels write out and dqkv in fp32, which the quantizes read.
  LoweringOptions tgcOptions;
  CudaProgram tgcKernels = unwrap(lowerToCuda(*graph, tgcOptions));
  for (const auto &[op, workspace] : options.cudnnAttention)
    EXPECT_FALSE(tgcKernels.bf16Stored.count(op->result(0))) << op->result()->name();
}

} // namespace

TEST(CudnnLowering, EveryGemmOperandOfTheLlamaBlocksBf16StepIsBf16Already) {
  // With cuDNN's attention, every operand of a BF16 GEMM in llama-tiny's step is a parameter
  // (its BF16 copy) or a value its producer writes in BF16 (alone, or beside its fp32 form):
  // no GEMM converts an operand first (GemmRunner::run's conversions), as none does in
  // PyTorch's autocast step: SwiGLU and its gradient, the norms' gradients, the RoPE'd dqkv.
  auto graph = tinyTraining(Recipe::Bf16, "models/llama-tiny.yaml");
  ASSERT_TRUE(graph);
  LoweringOptions options;
  for (const Op *op : graph->ops())
    if (cudnnAttentionShape(*graph, *op, options))
      options.cudnnAttention[op] = 4096;
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  int gemms = 0;
  for (const Op *op : graph->ops()) {
    if (!isBf16Gemm(*op))
      continue;
    ++gemms;
    for (unsigned k = 0; k < 2; ++k) {
      const Value *v = op->operand(k);
      EXPECT_TRUE(isWeight(program, v) || program.bf16Stored.count(v) || program.bf16Shadowed.count(v))
          << op->result()->name() << " converts " << v->name() << " (from "
          << reshapeRoot(v)->def()->name().str() << ")";
    }
  }
  EXPECT_EQ(gemms, 2 * 4 * 3 + 3); // qkv, proj, fc1, fc2 each way; the head's three
  // fc1's h, SwiGLU's input, and fc2's dgrad, its gradient's dy, in BF16 as their GEMMs write
  // them (a rounding, as autocast's).
  for (const char *name : {"h0.mlp.fc1", "h1.mlp.fc1", "h0.res1.grad.fc2.dx", "h1.res1.grad.fc2.dx"}) {
    EXPECT_TRUE(program.bf16Stored.count(graph->lookup(name))) << name;
    EXPECT_TRUE(program.bf16Rounding.count(graph->lookup(name)->def())) << name;
  }
}
