// The GPU's kernels and GEMMs against the CPU interpreter: every op of the tiny model's training
// program and decode step on fresh random inputs (results poisoned with NaN first, so that an
// unwritten element fails), every kernel family at odd shapes, attention on tgc's kernels and
// cuDNN's, the BF16 stores that round, the cast-transpose. Skipped where there is no GPU.
#include "tests/backends/cuda/GpuTestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

class GpuKernels : public testing::TestWithParam<std::string> {};

TEST_P(GpuKernels, EveryOpOfTheTinyTrainingProgramMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  auto program = tinyGpuProgram(GetParam());
  ASSERT_TRUE(program);
  int checked = 0;
  expectEveryOpMatchesTheCpu(program.get(), checked);
  EXPECT_GT(checked, 100);
}

TEST_P(GpuKernels, EveryOpOfTheTinyDecodeStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  auto program = tinyGpuProgram(GetParam(), GPTOutput::Decode);
  ASSERT_TRUE(program);
  int checked = 0;
  expectEveryOpMatchesTheCpu(program.get(), checked);
  // Two layers: 6 ops each under bf16 and fp8 (the residual norm, then BF16 products of 4 rows;
  // fc1's with its GELU), 8 in fp32, and the embeddings, head and sample.
  EXPECT_GE(checked, 14);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuKernels, testing::Values("fp32", "bf16", "fp8"));

// ---- Each kernel header (backends/cuda/kernels/*.cuh) against the CPU at odd shapes ----

/// The programs whose ops the kernel-family tests take: the odd model (tests/models/odd.yaml)
/// and its RMSNorm/SwiGLU/no-bias variant, as the GPU compiles them under every recipe
/// (training and the decode step), with attention fused in fp32 (the thread-per-row kernels),
/// and unfused (softmax, log-softmax, NLL, the permutes and pads of plain attention); fp8 with
/// current scaling too.
std::vector<std::unique_ptr<Graph>> oddPrograms() {
  std::vector<std::unique_ptr<Graph>> programs;
  ModelConfig odd = unwrap(loadModelConfig(sourcePath("tests/models/odd.yaml")));
  ModelConfig variant = odd;
  variant.norm = NormKind::RMSNorm;
  variant.activation = ActivationKind::SwiGLU;
  variant.bias = false;
  variant.tieEmbeddings = false;
  auto compile = [&](const ModelConfig &c, GPTOutput output, Recipe recipe, std::vector<std::string> passes) {
    // A prefill of an odd prompt length (5 positions), a check of 3 draft tokens a sequence.
    int64_t length = output == GPTOutput::Prefill ? 5 : output == GPTOutput::Verify ? 3 : 0;
    auto graph = unwrap(buildGPT(c, c.train.batch, output, length));
    PipelineOptions options;
    options.passOptions.train = c.train;
    options.passOptions.precision = c.precision;
    options.passOptions.precision.recipe = recipe;
    auto pipeline = unwrap(PassPipeline::create(passes, options));
    EXPECT_FALSE(bool(pipeline.run(*graph)));
    programs.push_back(std::move(graph));
  };
  for (const ModelConfig *c : {&odd, &variant}) {
    for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16, Recipe::Fp8})
      compile(*c, GPTOutput::Loss, recipe, gpuPipeline(true, recipe));
    for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16}) {
      compile(*c, GPTOutput::Decode, recipe, gpuPipeline(false, recipe));
      compile(*c, GPTOutput::Prefill, recipe, gpuPipeline(false, recipe));
    }
    compile(*c, GPTOutput::Loss, Recipe::Fp32, {"fuse-attention", "autodiff", "dce"});
    compile(*c, GPTOutput::Loss, Recipe::Fp32, {"autodiff", "concat-pads", "adamw", "dce"});
  }
  // Llama's block: RoPE on q and k (head dimension 16, 16 positions), one KV head for five query
  // heads (MQA), and two for four (GQA, head dimension 20), in each recipe.
  ModelConfig llama = variant;
  llama.position = PositionKind::Rope;
  llama.ropeTheta = 10000;
  llama.kvHeads = 1;
  ModelConfig gqa = llama;
  gqa.heads = 4;
  gqa.kvHeads = 2;
  gqa.ffn = 302; // SwiGLU's F no multiple of four: a thread an element (the others take four)
  for (const ModelConfig *c : {&llama, &gqa})
    for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16, Recipe::Fp8})
      compile(*c, GPTOutput::Loss, recipe, gpuPipeline(true, recipe));
  // SwiGLU's F a multiple of 64 (320): fc1's FP8 output gradient from the cast-transpose that
  // takes a gate tile and its up tile together (48 rows: a partial tile), under both scalings.
  ModelConfig pairs = llama;
  pairs.ffn = 320;
  compile(pairs, GPTOutput::Loss, Recipe::Fp8, gpuPipeline(true, Recipe::Fp8));
  pairs.precision.fp8Scaling = Fp8Scaling::Current;
  pairs.precision.margin = 1;
  compile(pairs, GPTOutput::Loss, Recipe::Fp8, gpuPipeline(true, Recipe::Fp8));
  // Their decode steps and prompts, the cache ops rotating what they read (fuse-cache-rope),
  // and multi-head with Llama 3's RoPE scaling: its attention writes the caches and rotates the
  // key it writes; its draft check reads them streamed (decode_stream.cuh).
  ModelConfig mha = llama;
  mha.kvHeads = 0;
  mha.ropeScaling = RopeScaling{8.0, 1.0, 4.0, 8.0};
  for (const ModelConfig *c : {&llama, &gqa, &mha})
    for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16}) {
      compile(*c, GPTOutput::Decode, recipe, gpuPipeline(false, recipe));
      compile(*c, GPTOutput::Prefill, recipe, gpuPipeline(false, recipe));
    }
  for (Recipe recipe : {Recipe::Fp32, Recipe::Bf16})
    compile(mha, GPTOutput::Verify, recipe, gpuPipeline(false, recipe));
  // FP8 with current scaling (each quantize scales by its own amax, with a margin).
  ModelConfig current = odd;
  current.precision.fp8Scaling = Fp8Scaling::Current;
  current.precision.margin = 1;
  compile(current, GPTOutput::Loss, Recipe::Fp8, gpuPipeline(true, Recipe::Fp8));
  // Mixed: the inputs' delayed scales beside the weights' and gradients' current ones.
  ModelConfig mixed = current;
  mixed.precision.fp8Scaling = Fp8Scaling::Mixed;
  compile(mixed, GPTOutput::Loss, Recipe::Fp8, gpuPipeline(true, Recipe::Fp8));
  // Rows wider than the norm kernels hold in registers (d_model 1040 > 1024: their loops over
  // global memory), 13 heads of 80; the norms' backward with --recompute's programs too.
  ModelConfig wide = odd;
  wide.vocab = 1000;
  wide.dModel = 1040;
  wide.heads = 13;
  compile(wide, GPTOutput::Loss, Recipe::Bf16, gpuPipeline(true, Recipe::Bf16));
  // Its decode step at 3 sequences: the GEMVs normalise rows wider than a warp holds (the block
  // holds each in turn), as TinyLlama's (d_model 2048) do.
  ModelConfig wideDecode = wide;
  wideDecode.train.batch = 3;
  compile(wideDecode, GPTOutput::Decode, Recipe::Bf16, gpuPipeline(false, Recipe::Bf16));
  wide.train.recompute = true;
  compile(wide, GPTOutput::Loss, Recipe::Fp32, gpuPipeline(true, Recipe::Fp32));
  // Many rows: the norms' gradient takes chunks of 32 rows a block (1616 rows: the last chunk
  // 16), and the column sums many chunks; at 16400 rows chunks of 64 (the last 16).
  ModelConfig tall = odd;
  tall.vocab = 1000;
  tall.train.batch = 101;
  compile(tall, GPTOutput::Loss, Recipe::Bf16, gpuPipeline(true, Recipe::Bf16));
  compile(tall, GPTOutput::Loss, Recipe::Fp32, gpuPipeline(true, Recipe::Fp32));
  tall.train.batch = 1025;
  compile(tall, GPTOutput::Loss, Recipe::Bf16, gpuPipeline(true, Recipe::Bf16));
  return programs;
}

/// For each op of `programs` lowered to kernels, the kernel header its launches instantiate.
std::map<const Op *, std::string> kernelHeadersOfOps(const std::vector<std::unique_ptr<Graph>> &programs) {
  std::map<const Op *, std::string> headers;
  for (const auto &program : programs) {
    CudaProgram lowered = unwrap(lowerToCuda(*program));
    std::vector<Op *> ops = program->ops();
    for (size_t i = 0; i < ops.size(); ++i)
      if (!lowered.lowering[i].header.empty())
        headers[ops[i]] = lowered.lowering[i].header;
  }
  return headers;
}

// Without a GPU too: every kernel header but common.cuh, tensorcore.cuh (instructions the
// others include), fp8_sources.cuh (what fp8.cuh's quantize kernels read, run by its ops),
// BoxMuller.h (support/'s normal draw that common.cuh includes, checked by
// GpuTraining.ParametersDrawnOnTheDeviceHaveTheHostsBits), Sampling.h (support/'s sampling
// arithmetic that sample.cuh includes, checked by GpuGeneration.SampledTokensAreTheCpusForThe-
// SameSeed) and ScalarMath.h (support/'s scalar math that the elementwise, FP8 and optimizer
// kernels share with the CPU) has ops among the odd programs, so a new header cannot go
// untested by the GPU test below.
TEST(KernelFamilies, EveryHeaderHasOpsAtOddShapes) {
  auto programs = oddPrograms();
  std::map<std::string, int> ops;
  for (const auto &[op, header] : kernelHeadersOfOps(programs))
    ++ops[header];
  for (const KernelHeader &header : kernelHeaders()) {
    llvm::StringRef name = header.name;
    if (name == "common.cuh" || name == "tensorcore.cuh" || name == "fp8_sources.cuh" || name == "BoxMuller.h" ||
        name == "Sampling.h" || name == "ScalarMath.h")
      continue;
    EXPECT_GT(ops[header.name], 0) << header.name << " has no op in the odd programs";
  }
}

class KernelFamilies : public testing::TestWithParam<std::string> {};

TEST_P(KernelFamilies, MatchTheCpuAtOddShapes) {
  SKIP_WITHOUT_GPU();
  auto programs = oddPrograms();
  std::map<const Op *, std::string> headers = kernelHeadersOfOps(programs);
  int checked = 0;
  for (const auto &program : programs)
    expectEveryOpMatchesTheCpu(program.get(), checked, false, [&](const Op &op) {
      auto it = headers.find(&op);
      return it != headers.end() && it->second == GetParam();
    });
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(Headers, KernelFamilies,
                         testing::Values("attention.cuh", "decode.cuh", "decode_stream.cuh", "elementwise.cuh",
                                         "embedding.cuh", "fp8.cuh", "gemv.cuh", "layout.cuh", "loss.cuh", "norms.cuh",
                                         "optimizer.cuh", "reduce.cuh", "softmax.cuh"),
                         [](const testing::TestParamInfo<std::string> &info) {
                           return info.param.substr(0, info.param.find('.'));
                         });

/// layer_norm_linear, layer_norm_mlp and their gradients as the GPU runs them (their norm and
/// GEMM ops) against the fused ops on the CPU: LayerNorm and RMSNorm, GELU and SwiGLU, with and
/// without biases and tied embeddings, fp32 and BF16, and a shape no tile divides (39 rows of
/// 48 features, fc1 200 wide).
TEST(GpuKernels, LayerNormLinearAndMLPAndTheirGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  ModelConfig odd = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  odd.dModel = 48;
  odd.ffn = 200;
  odd.seqLen = 13;
  for (const ModelConfig &c : {unwrap(loadModelConfig(sourcePath("models/tiny.yaml"))),
                               unwrap(loadModelConfig(sourcePath("tests/models/tiny-variants.yaml"))),
                               odd})
    for (const char *recipe : {"fp32", "bf16"}) {
      SCOPED_TRACE(fmt::format("{} d_model {} ffn {} {}", c.name, c.dModel, c.ffn, recipe));
      auto graph = unwrap(buildGPT(c, 3));
      ASSERT_TRUE(graph);
      PipelineOptions options;
      options.passOptions.precision.recipe = *parseRecipe(recipe);
      auto pipeline = unwrap(PassPipeline::create(trainingPipeline(), options));
      ASSERT_FALSE(bool(pipeline.run(*graph)));
      int checked = 0;
      expectEveryOpMatchesTheCpu(graph.get(), checked, /*onlyLayerNormFused=*/true);
      EXPECT_GE(checked, 4); // each of the four ops at least once
    }
}

/// attention and its gradient at shapes the tiny model does not have: several 64-row tiles, a
/// last tile cut short, head dimensions from 12 to 128, fewer KV heads than query heads
/// (grouped-query attention, down to one: MQA) and q and k rotated inside the op (rope_theta);
/// on tensor cores (BF16), a thread per row (BF16 at head dimension 12, which the tensor-core
/// kernels do not take) and in fp32. Run by tgc's kernels, and by cuDNN's fused attention where
/// cuDNN is found (BF16, head dimensions that are multiples of 8: every shape here but 12).
class GpuAttention : public testing::TestWithParam<std::string> {};

TEST_P(GpuAttention, AndItsGradientMatchTheCpuAtSeveralShapes) {
  SKIP_WITHOUT_GPU();
  bool cudnn = GetParam() == "cudnn";
  if (cudnn)
    if (auto api = loadCudnn(); !api)
      GTEST_SKIP() << llvm::toString(api.takeError());
  struct Shape {
    int64_t B, T, H, Dh, KV = 0; // KV 0: H
    bool rope = false;
  };
  Rng rng(freshSeed());
  for (const char *dtype : {"bf16", "fp32"})
    for (Shape s : {Shape{2, 128, 2, 64}, Shape{1, 300, 2, 64}, Shape{1, 200, 2, 128}, Shape{3, 96, 1, 32}, Shape{2, 64, 3, 16},
                    Shape{1, 1, 1, 16}, Shape{2, 70, 2, 12}, // head dimension 12: no tensor cores
                    Shape{2, 130, 4, 64, 2, true}, Shape{1, 200, 4, 128, 1, true}, Shape{2, 96, 4, 32, 1},
                    Shape{1, 100, 2, 64, 2, true}, Shape{2, 70, 4, 12, 2, true}}) {
      int64_t KV = s.KV ? s.KV : s.H, D = s.H * s.Dh;
      SCOPED_TRACE(fmt::format("{}: B {} T {} H {} KV {} Dh {}{}", dtype, s.B, s.T, s.H, KV, s.Dh, s.rope ? " rope" : ""));
      Graph graph("attention");
      Builder b(graph);
      Value *qkv = b.input("qkv", TensorType(DType::F32, {s.B, s.T, D + 2 * KV * s.Dh}));
      Value *dout = b.input("dout", TensorType(DType::F32, {s.B, s.T, D}));
      AttrMap attrs;
      attrs.set("heads", s.H);
      if (KV != s.H)
        attrs.set("kv_heads", KV);
      if (s.rope)
        attrs.set("rope_theta", 500.0); // (angles that turn far within the rows here)
      attrs.set("scale", 1.0 / std::sqrt(double(s.Dh)));
      if (std::string(dtype) == "bf16")
        attrs.set("gemm_dtype", std::string("bf16"));
      Op *forward = b.createOp(OpKind::Attention, {qkv}, attrs, "out");
      ASSERT_TRUE(forward);
      graph.addOutput(forward->result(0));
      graph.addOutput(forward->result(1));
      graph.addOutput(b.create(OpKind::AttentionBackward, {dout, qkv, forward->result(0), forward->result(1)}, attrs,
                               "dqkv"));
      ASSERT_FALSE(bool(b.takeError()));
      std::map<std::string, Tensor> inputs;
      for (const char *name : {"qkv", "dout"}) {
        Tensor t = Tensor::zeros(graph.lookup(name)->type());
        for (float &v : t.data)
          v = float(rng.normal() * 2); // scores up to about 30: peaked softmax rows too
        inputs[name] = std::move(t);
      }
      Interpreter cpu(graph);
      ASSERT_FALSE(bool(cpu.bindAll(inputs)));
      auto want = unwrap(cpu.run());
      CudaOptions options;
      options.poisonResults = true;
      options.cudnnAttention = cudnn;
      auto gpu = unwrap(createCudaExecutor(graph, options));
      ASSERT_TRUE(gpu);
      bool byCudnn = llvm::StringRef(gpu->describe()).contains("attention by cuDNN");
      EXPECT_EQ(byCudnn, cudnn && std::string(dtype) == "bf16" && s.Dh % 8 == 0) << gpu->describe();
      if (byCudnn) { // the forward and the gradient
        EXPECT_TRUE(llvm::StringRef(gpu->describe()).contains("(2 of 2 ops)")) << gpu->describe();
      }
      ASSERT_FALSE(bool(gpu->bindAll(inputs)));
      auto got = unwrap(gpu->run());
      ASSERT_EQ(got.size(), 3u); // out, lse, dqkv
      for (size_t r = 0; r < 3; ++r) {
        double scale = 0, worst = 0;
        for (size_t i = 0; i < want[r].data.size(); ++i) {
          ASSERT_FALSE(std::isnan(got[r].data[i])) << "result " << r << " element " << i << " unwritten or NaN";
          scale = std::max(scale, double(std::fabs(want[r].data[i])));
          worst = std::max(worst, double(std::fabs(got[r].data[i] - want[r].data[i])));
        }
        double bound = std::string(dtype) == "bf16" ? 1e-2 : 1e-5;
        EXPECT_LE(worst, bound * scale) << "result " << r << ": max difference " << worst << " at scale " << scale;
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Kernels, GpuAttention, testing::Values("tgc", "cudnn"),
                         [](const testing::TestParamInfo<std::string> &info) { return info.param; });

TEST(GpuKernels, Bf16OutputsThatRoundFollowTheCpuWithinBf16) {
  // CudaProgram::bf16Rounding: fc1 as cuBLASLt's GELU_AUX_BIAS epilogue writing the activation
  // and h in BF16 (its bias read from the parameters' BF16 copy), fc2's dgrad with the GELU's
  // gradient as the DGELU epilogue writing BF16 (fc1's bias gradient sums it, and the next
  // product reads it), the logits in BF16 for the loss. Each rounds what the CPU keeps in fp32:
  // the results agree within BF16's rounding. 300 rows (past the few-row products), a vocabulary
  // of 1000.
  const int64_t M = 300, K = 64, N = 256, V = 1000;
  std::string text = fmt::format(
      "graph @g\n%x = input() : f32[{0},{1}]\n%dy = input() : f32[{0},{1}]\n%targets = input() : i32[{0}]\n"
      "%w1 = param() {{init=\"normal\", std=0.1}} : f32[{2},{1}]\n%b1 = param() {{init=\"zeros\"}} : f32[{2}]\n"
      "%w2 = param() {{init=\"normal\", std=0.1}} : f32[{1},{2}]\n%wh = param() {{init=\"normal\", std=0.1}} : f32[{3},{1}]\n"
      "%act, %h = matmul_bias_gelu(%x, %w1, %b1) {{gemm_dtype=\"bf16\"}} : f32[{0},{2}], f32[{0},{2}]\n"
      "%y = matmul(%act, %w2) {{gemm_dtype=\"bf16\", transpose_b=true}} : f32[{0},{1}]\n"
      "%dh = matmul_dgelu(%dy, %w2, %h) {{gemm_dtype=\"bf16\"}} : f32[{0},{2}]\n"
      "%dx = matmul(%dh, %w1) {{gemm_dtype=\"bf16\"}} : f32[{0},{1}]\n"
      "%db1 = reduce_to(%dh) {{shape=[{2}]}} : f32[{2}]\n"
      "%logits = matmul(%y, %wh) {{gemm_dtype=\"bf16\", transpose_b=true}} : f32[{0},{3}]\n"
      "%loss = cross_entropy(%logits, %targets) : f32[]\n"
      "return %dx, %db1, %loss\n",
      M, K, N, V);
  auto graph = unwrap(parseGraph(text, "bf16-rounding.ir"));
  ASSERT_TRUE(graph);
  // The lowering rounds these three (no GPU needed to check that).
  CudaProgram program = unwrap(lowerToCuda(*graph));
  EXPECT_EQ(program.bf16Rounding.size(), 3u);
  for (const char *name : {"act", "h", "dh", "logits"})
    EXPECT_TRUE(program.bf16Stored.count(graph->lookup(name))) << name;
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves{{"x", Tensor::zeros(TensorType(DType::F32, {M, K}))},
                                       {"dy", Tensor::zeros(TensorType(DType::F32, {M, K}))},
                                       {"w1", Tensor::zeros(TensorType(DType::F32, {N, K}))},
                                       {"b1", Tensor::zeros(TensorType(DType::F32, {N}))},
                                       {"w2", Tensor::zeros(TensorType(DType::F32, {K, N}))},
                                       {"wh", Tensor::zeros(TensorType(DType::F32, {V, K}))}};
  for (auto &[name, t] : leaves)
    for (float &v : t.data)
      v = float(rng.normal()) * (name == "x" || name == "dy" ? 1.0f : 0.1f);
  Tensor targets = Tensor::zeros(TensorType(DType::I32, {M}));
  for (int32_t &t : targets.ints)
    t = int32_t(rng.below(uint64_t(V)));
  leaves["targets"] = targets;
  std::vector<Tensor> want, got;
  runOnBoth(*graph, leaves, want, got);
  ASSERT_EQ(got.size(), 3u);
  expectWithinBf16("bf16 rounding", want, got);
}

TEST(GpuKernels, CudnnReadingQkvAndDoutWhereTheirGemmsWroteThemMatchesTheCpu) {
  // CudaProgram::qkvRows and doutRows: the qkv GEMM writes BF16 rows (bias from the
  // parameters' BF16 copy), which cuDNN's attention and its gradient read in place as q, k and
  // v (the head-major copy is qkv's memory); the projection's dgrad writes dout in BF16 rows,
  // which the gradient reads. T 200: a last tile cut short. Against the CPU within BF16.
  const int64_t B = 2, T = 200, C = 96, H = 2, Dh = 64, D = H * Dh;
  std::string text = fmt::format(
      "graph @g\n%x = input() : f32[{0},{1},{2}]\n%g = input() : f32[{0},{1},{2}]\n"
      "%w = param() {{init=\"normal\", std=0.1}} : f32[{3},{2}]\n%b = param() {{init=\"normal\", std=0.5}} : f32[{3}]\n"
      "%wp = param() {{init=\"normal\", std=0.1}} : f32[{2},{4}]\n"
      "%qkv = matmul_bias(%x, %w, %b) {{gemm_dtype=\"bf16\"}} : f32[{0},{1},{3}]\n"
      "%out, %lse, %heads = attention(%qkv) {{gemm_dtype=\"bf16\", head_major=true, heads={5}, scale=0.125}} "
      ": f32[{0},{1},{4}], f32[{0},{5},{1}], f32[3,{0},{5},{1},{6}]\n"
      "%dout = matmul(%g, %wp) {{gemm_dtype=\"bf16\"}} : f32[{0},{1},{4}]\n"
      "%dqkv = attention_backward(%dout, %heads, %out, %lse) {{gemm_dtype=\"bf16\", head_major=true, heads={5}, "
      "scale=0.125}} : f32[{0},{1},{3}]\n"
      "return %out, %dqkv\n",
      B, T, C, 3 * D, D, H, Dh);
  auto graph = unwrap(parseGraph(text, "cudnn-rows.ir"));
  ASSERT_TRUE(graph);
  LoweringOptions options; // the lowering's choice, without a GPU
  for (const Op *op : graph->ops())
    if (cudnnAttentionShape(*graph, *op, options))
      options.cudnnAttention[op] = 0;
  CudaProgram program = unwrap(lowerToCuda(*graph, options));
  EXPECT_EQ(program.qkvRows.lookup(graph->lookup("heads")), graph->lookup("qkv"));
  EXPECT_EQ(program.doutRows.size(), 1u);
  SKIP_WITHOUT_GPU();
  if (auto api = loadCudnn(); !api)
    GTEST_SKIP() << llvm::toString(api.takeError());
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves;
  for (const Op *op : graph->ops())
    if (op->kind() == OpKind::Input || op->kind() == OpKind::Param) {
      Tensor t = Tensor::zeros(op->result()->type());
      for (float &v : t.data)
        v = float(rng.normal()) * (op->kind() == OpKind::Input ? 1.0f : 0.1f);
      leaves[op->result()->name()] = std::move(t);
    }
  std::vector<Tensor> want, got;
  std::string described;
  runOnBoth(*graph, leaves, want, got, &described);
  EXPECT_NE(described.find("attention by cuDNN"), std::string::npos) << described;
  ASSERT_EQ(got.size(), 2u);
  expectWithinBf16("cuDNN in place", want, got);
}

TEST(GpuKernels, CastTransposeGivesTheCpusBytesAndCounts) {
  // fp8.cuh's quantizeTransposeBlocks (quantize {transpose=true}): q, its transpose, the amax and
  // the saturation count, bit for bit against the CPU: one 16 x 16 tile's corner, sides that are
  // not multiples of 64 (partial tiles: 48 x 80, and a [3, 16, 112] batch as rows), 33 x 33 tiles
  // (more than four blocks a multiprocessor: each block takes several in turn); delayed scaling
  // at a scale that saturates some values, and current scaling with a margin; E4M3 and E5M2; and
  // each applying the GELU first (activation="gelu", fuse-gelu-quantize's), or making the GELU's
  // gradient of x and h with its column sums (activation="gelu_backward", bias_grad), or summing
  // the columns of x itself (bias_grad alone, fuse-quantize-bias-grad's), where an ulp of tanhf
  // may move a rare value to the next FP8 code (expectFp8OfGeluMatches) and the sums by as much.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  for (std::string shape : {"16,16", "48,80", "3,16,112", "2112,2112"})
    for (bool current : {false, true})
      for (const char *format : {"e4m3", "e5m2"})
        for (std::string activation : {"", "gelu", "gelu_backward", "sums"}) {
          SCOPED_TRACE(fmt::format("[{}], {}, {}, {}", shape, current ? "current" : "delayed", format, activation));
          TensorType type =
              unwrap(parseGraph(fmt::format("graph @g\n%x = input() : f32[{}]\nreturn %x\n", shape), "shape.ir"))
                  ->lookup("x")
                  ->type();
          int64_t cols = type.dim(-1), rows = type.numElements() / cols;
          bool gradient = activation == "gelu_backward", sums = gradient || activation == "sums";
          bool gelu = gradient || activation == "gelu";
          std::string text = fmt::format(
              "graph @g\n%x = input() : f32[{0}]\n%s = input() : f32[]\n%si = input() : f32[]\n{6}"
              "%q, %amax, %sat, %qt{7} = quantize(%x, %s, %si{8}) {{{5}format=\"{1}\", {2}transpose=true}} : "
              "f8{1}[{0}], f32[], f32[], f8{1}[{3},{4}]{9}\nreturn %q, %amax, %sat, %qt{7}\n",
              shape, format, current ? "margin=1, scaling=\"current\", " : "", cols, rows,
              activation.empty()         ? ""
              : gradient                 ? "activation=\"gelu_backward\", bias_grad=true, "
              : activation == "sums"     ? "bias_grad=true, "
                                         : "activation=\"gelu\", ",
              gradient ? fmt::format("%h = input() : f32[{}]\n", shape) : "", sums ? ", %db" : "",
              gradient ? ", %h" : "", sums ? fmt::format(", f32[{}]", cols) : "");
          auto graph = unwrap(parseGraph(text, "cast-transpose.ir"));
          ASSERT_TRUE(graph);
          std::map<std::string, Tensor> leaves;
          Tensor x = Tensor::zeros(type), h = Tensor::zeros(type);
          for (float &v : x.data)
            v = float(rng.normal() * 4);
          for (float &v : h.data)
            v = float(rng.normal() * 2);
          // (The largest |dy| meets h = 1.5, where the GELU's gradient is 1.12: its gradient is
          // above half the amax below, so the delayed scale saturates at least it, whatever the
          // draw; at [16, 16] the draws alone once saturated nothing.)
          if (gradient) {
            auto largest = std::max_element(x.data.begin(), x.data.end(),
                                            [](float a, float b) { return std::fabs(a) < std::fabs(b); });
            h.data[size_t(largest - x.data.begin())] = 1.5f;
          }
          // What the quantize converts: x, or here the largest GELU gradient (|dy| times at most 1.13).
          float amax = 0;
          for (size_t i = 0; i < x.data.size(); ++i)
            amax = std::max(amax, std::fabs(x.data[i]) * (gradient ? 1.13f : 1.0f));
          // Whatever is above half the amax saturates under the delayed scale.
          float scale = (std::string(format) == "e4m3" ? 448.0f : 57344.0f) * 2 / amax;
          leaves["x"] = std::move(x);
          if (gradient)
            leaves["h"] = std::move(h);
          leaves["s"] = Tensor{TensorType(DType::F32, {}), {scale}, {}};
          leaves["si"] = Tensor{TensorType(DType::F32, {}), {1.0f / scale}, {}};
          std::vector<Tensor> want, got;
          runOnBoth(*graph, leaves, want, got);
          ASSERT_EQ(got.size(), sums ? 5u : 4u);
          if (gelu) {
            expectFp8OfGeluMatches(want[0], got[0]);
            expectFp8OfGeluMatches(want[3], got[3]);
            EXPECT_NEAR(got[1].data[0], want[1].data[0], 1e-6 * want[1].data[0]); // amax: an ulp
            EXPECT_NEAR(got[2].data[0], want[2].data[0], 2 + want[0].data.size() / 16384.0);
          } else {
            for (size_t r = 0; r < 4; ++r)
              EXPECT_EQ(got[r].data, want[r].data) << "result " << r;
          }
          if (sums) { // the column sums: each within an ulp or two of the CPU's
            double largest = 0;
            for (float v : want[4].data)
              largest = std::max(largest, double(std::fabs(v)));
            for (int64_t c = 0; c < cols; ++c)
              ASSERT_NEAR(got[4].data[c], want[4].data[c], 1e-5 * largest + 1e-5) << "column " << c;
          }
          if (!current && activation != "gelu") {
            EXPECT_GT(want[2].data[0], 0.0f); // (the delayed scale saturates some)
          }
        }
}


TEST(GpuKernels, TheLossGradientsCastTransposeFollowsTheCpu) {
  // quantize {activation="cross_entropy_backward", transpose=true} (fuse-cross-entropy-quantize,
  // an FP8 LM head): the rows' log-sum-exp and the mean loss (loss.cuh), then the gradient's FP8
  // bytes and their transpose from the logits, tile by tile. A [2, 152, 1008] batch (partial
  // tiles both ways), delayed scaling at a scale that saturates the target's entries, and
  // current scaling; E5M2 and E4M3; and block scaling's cast (1 x 128 blocks both ways) on a
  // [2, 192, 1024] one. The CPU takes the softmax in double, the GPU in float: a rare value may
  // land on the next FP8 code, the loss and amax within float's rounding.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  for (const char *scaling : {"delayed", "current", "block"})
    for (const char *format : {"e5m2", "e4m3"}) {
      bool current = scaling == std::string("current"), block = scaling == std::string("block");
      if (block && format == std::string("e5m2"))
        continue; // (block scaling is E4M3 both ways)
      SCOPED_TRACE(fmt::format("{}, {}", scaling, format));
      const int64_t B = 2, T = block ? 192 : 152, V = block ? 1024 : 1008;
      std::string attrs = current ? "margin=1, scaling=\"current\", " : block ? "block_rows=1, scaling=\"block\", " : "";
      std::string text = fmt::format(
          "graph @g\n%x = input() : f32[{0},{1},{2}]\n%t = input() : i32[{0},{1}]\n%s = input() : f32[]\n"
          "%si = input() : f32[]\n%dl = input() : f32[]\n"
          "%q, %amax, %sat, %qt, %loss = quantize(%x, %s, %si, %t, %dl) {{activation=\"cross_entropy_backward\", "
          "{3}format=\"{4}\", transpose=true}} : f8{4}[{0},{1},{2}], f32[{6}], f32[], f8{4}[{2},{5}], f32[]\n"
          "return %q, %amax, %sat, %qt, %loss\n",
          B, T, V, attrs, format, B * T, block ? "2" : ""); // (block: the amax and the largest block scale)
      auto graph = unwrap(parseGraph(text, "loss-cast-transpose.ir"));
      ASSERT_TRUE(graph);
      Tensor x = Tensor::zeros(TensorType(DType::F32, {B, T, V})), t = Tensor::zeros(TensorType(DType::I32, {B, T}));
      for (float &v : x.data)
        v = float(rng.normal() * 3);
      for (int32_t &v : t.ints)
        v = int32_t(rng.below(uint64_t(V)));
      // The gradient's largest entries are the targets' (p - 1) / rows, most near -1 / rows: the
      // delayed scale saturates those above 0.75 / rows.
      float scale = (std::string(format) == "e4m3" ? 448.0f : 57344.0f) * float(B * T) / 0.75f;
      std::map<std::string, Tensor> leaves{{"x", std::move(x)}, {"t", std::move(t)}};
      leaves["s"] = Tensor{TensorType(DType::F32, {}), {scale}, {}};
      leaves["si"] = Tensor{TensorType(DType::F32, {}), {1.0f / scale}, {}};
      leaves["dl"] = Tensor{TensorType(DType::F32, {}), {1.0f}, {}};
      std::vector<Tensor> want, got;
      runOnBoth(*graph, leaves, want, got);
      ASSERT_EQ(got.size(), 5u);
      expectFp8OfGeluMatches(want[0], got[0]);
      expectFp8OfGeluMatches(want[3], got[3]);
      EXPECT_NEAR(got[1].data[0], want[1].data[0], 1e-5 * want[1].data[0]); // amax
      EXPECT_NEAR(got[2].data[0], want[2].data[0], 2 + want[0].data.size() / 16384.0); // saturated (block: flushed)
      EXPECT_NEAR(got[4].data[0], want[4].data[0], 1e-6 * want[4].data[0]); // the loss
      EXPECT_GT(want[4].data[0], 1.0f);
      if (!current && !block) {
        EXPECT_GT(want[2].data[0], 0.0f); // (the delayed scale saturates some)
      }
    }
}

} // namespace

TEST(GpuKernels, BlockScaledCastGivesTheCpusBytesScalesAndCounts) {
  // fp8.cuh's quantizeBlockScaled (quantize {scaling="block"}): q and q^T read back through the
  // block scales it wrote in cuBLASLt's layouts, the amax, the largest block scale and the count
  // of values flushed to zero, bit for bit against the CPU's blockQuantize: 1 x 128 and 128 x 128
  // blocks, with and without the transpose (1 x 128: quantized again along the rows), E4M3 and
  // E5M2, rows of magnitudes 2^0 to 2^-42 (flushed in 128 x 128 blocks) and one block of zeros, a
  // [3, 128, 256] batch as 384 rows, 200 rows (a tile cut short: 1 x 128 blocks of q alone), and
  // through the GELU it applies as it reads (fuse-gelu-quantize's).
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  for (std::string shape : {"128,128", "256,384", "3,128,256", "200,256"})
    for (int64_t blockRows : {1, 128})
      for (bool transpose : {false, true})
        for (const char *format : {"e4m3", "e5m2"})
          for (bool gelu : {false, true}) {
            if ((shape == "200,256" && (blockRows == 128 || transpose)) || (gelu && shape != "256,384"))
              continue; // (Infer refuses the first; the GELU once is enough)
            SCOPED_TRACE(fmt::format("[{}], blocks of {} x 128, {}, {}{}", shape, blockRows,
                                     transpose ? "transposed too" : "q alone", format, gelu ? ", of gelu(x)" : ""));
            auto g = unwrap(parseGraph(fmt::format("graph @g\n%x = input() : f32[{}]\nreturn %x\n", shape), "shape.ir"));
            TensorType type = g->lookup("x")->type();
            int64_t cols = type.dim(-1), rows = type.numElements() / cols;
            std::string text = fmt::format(
                "graph @g\n%x = input() : f32[{0}]\n%s = input() : f32[]\n%si = input() : f32[]\n"
                "%q, %amax, %sat{4} = quantize(%x, %s, %si) {{block_rows={3}, format=\"{1}\", scaling=\"block\"{5}{6}}} : "
                "f8{1}[{0}], f32[2], f32[]{2}\nreturn %q, %amax, %sat{4}\n",
                shape, format, transpose ? fmt::format(", f8{}[{},{}]", format, cols, rows) : "", blockRows,
                transpose ? ", %qt" : "", transpose ? ", transpose=true" : "", gelu ? ", activation=\"gelu\"" : "");
            auto graph = unwrap(parseGraph(text, "block-cast.ir"));
            ASSERT_TRUE(graph);
            Tensor x = Tensor::zeros(type);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t c = 0; c < cols; ++c)
                x.data[size_t(r * cols + c)] = r < 2 && c < 128 ? 0.0f : float(rng.normal()) * std::ldexp(1.0f, -6 * int(r % 8));
            std::map<std::string, Tensor> leaves;
            leaves["x"] = std::move(x);
            leaves["s"] = Tensor{TensorType(DType::F32, {}), {1.0f}, {}};
            leaves["si"] = Tensor{TensorType(DType::F32, {}), {1.0f}, {}};
            std::vector<Tensor> want, got;
            runOnBoth(*graph, leaves, want, got);
            ASSERT_EQ(got.size(), transpose ? 4u : 3u);
            if (gelu) { // (an ulp of tanhf moves a rare value to the next code, as above)
              for (size_t k : {size_t(0), size_t(3)})
                if (k < got.size())
                  expectFp8OfGeluMatches(want[k], got[k]);
              EXPECT_NEAR(got[1].data[0], want[1].data[0], 1e-6 * want[1].data[0]); // amax: an ulp
              EXPECT_EQ(got[1].data[1], want[1].data[1]); // the largest block scale
              EXPECT_EQ(got[2].data[0], want[2].data[0]); // the values flushed
              continue;
            }
            for (size_t k = 0; k < got.size(); ++k) {
              ASSERT_EQ(got[k].data.size(), want[k].data.size()) << k;
              size_t differ = 0;
              for (size_t i = 0; i < got[k].data.size(); ++i)
                differ += got[k].data[i] != want[k].data[i];
              EXPECT_EQ(differ, 0u) << "result " << k;
            }
          }
}

TEST(GpuKernels, BlockScaledCastSumsTheBiasGradientAsTheCpu) {
  // quantize {scaling="block", bias_grad=true} (fuse-quantize-bias-grad's and
  // fuse-gelu-quantize's under block scaling): the cast-transpose of an output gradient, or of
  // fc1's GELU gradient read from dy and h, sums the columns into the bias gradient as it goes
  // (each tile's in doubles, then the tile rows'). The bytes and scales of both directions as
  // the CPU's (the GELU's gradient within an ulp of tanhf, as above); the sums as the CPU's
  // reduce_to, to the bit where they are exact (x alone) and within 1e-5 through the GELU.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  for (std::string shape : {"256,384", "3,128,256"})
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(fmt::format("[{}]{}", shape, gelu ? ", of gelu_backward(dy, h)" : ""));
      auto g = unwrap(parseGraph(fmt::format("graph @g\n%x = input() : f32[{}]\nreturn %x\n", shape), "shape.ir"));
      TensorType type = g->lookup("x")->type();
      int64_t cols = type.dim(-1), rows = type.numElements() / cols;
      std::string text = fmt::format(
          "graph @g\n%x = input() : f32[{0}]\n%h = input() : f32[{0}]\n%s = input() : f32[]\n%si = input() : f32[]\n"
          "%q, %amax, %sat, %qt, %db = quantize(%x, %s, %si{1}) {{{2}bias_grad=true, block_rows=1, format=\"e4m3\", "
          "scaling=\"block\", transpose=true}} : f8e4m3[{0}], f32[2], f32[], f8e4m3[{3},{4}], f32[{3}]\n"
          "return %q, %amax, %sat, %qt, %db\n",
          shape, gelu ? ", %h" : "", gelu ? "activation=\"gelu_backward\", " : "", cols, rows);
      auto graph = unwrap(parseGraph(text, "block-bias-grad.ir"));
      ASSERT_TRUE(graph);
      std::map<std::string, Tensor> leaves;
      for (const char *name : {"x", "h"}) {
        Tensor t = Tensor::zeros(type);
        for (float &v : t.data)
          v = float(rng.normal());
        leaves[name] = std::move(t);
      }
      leaves["s"] = Tensor{TensorType(DType::F32, {}), {1.0f}, {}};
      leaves["si"] = Tensor{TensorType(DType::F32, {}), {1.0f}, {}};
      std::vector<Tensor> want, got;
      runOnBoth(*graph, leaves, want, got);
      ASSERT_EQ(got.size(), 5u);
      for (size_t k : {size_t(0), size_t(3)})
        expectFp8OfGeluMatches(want[k], got[k]);
      EXPECT_EQ(got[1].data[1], want[1].data[1]); // the largest block scale
      Gap gap = gapOf(want[4].data, got[4].data);
      EXPECT_LE(gap.worst, gelu ? 1e-5 * gap.scale : 0.0) << "the bias gradient's largest " << gap.scale;
    }
}
