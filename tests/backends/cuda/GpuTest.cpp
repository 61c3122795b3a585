// The GPU backend against the CPU interpreter: every generated kernel and GEMM of the tiny
// model's training program on fresh random inputs (results poisoned with NaN first, so that an
// unwritten element fails), and fp32 training parity. Skipped where there is no GPU.
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "ir/Gemv.h"
#include "backends/cuda/libraries/KernelHeaders.h"
#include "ir/Attributes.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "backends/cuda/CudaExecutor.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/libraries/Nccl.h"
#include "backends/cpu/Fp8Scaling.h"
#include "app/Generate.h"
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "app/Trainer.h"
#include "tests/TestUtil.h"
#include "tests/app/RankRuns.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

/// The GPU these tests run on (they skip where there is none).
Device theGpu() { return unwrap(detectCudaDevice()); }

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    if (auto gpu = detectCudaDevice(); !gpu)                                                       \
      GTEST_SKIP() << llvm::toString(gpu.takeError());                                             \
  } while (0)

/// The tiny model's training program (or its generation step with a KV cache) as the GPU
/// compiles it.
std::unique_ptr<Graph> tinyGpuProgram(const std::string &recipe, GPTOutput output = GPTOutput::Loss) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 4, output));
  if (!graph)
    return nullptr;
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision; // fp8_min_dim 16: every linear layer but the head FP8
  options.passOptions.precision.recipe = *parseRecipe(recipe);
  bool training = output == GPTOutput::Loss;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(training, *parseRecipe(recipe)), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// Upper bound (exclusive) for the integer operand `i` of `op`.
int64_t intBound(const Op &op, unsigned i) {
  switch (op.kind()) {
  case OpKind::Embedding:
    return op.operand(0)->type().dim(0);
  case OpKind::EmbeddingBackward:
    return *op.attrs().getInt("vocab");
  case OpKind::NLLLoss:
  case OpKind::CrossEntropy:
    return op.operand(0)->type().dim(-1);
  case OpKind::NLLLossBackward:
  case OpKind::CrossEntropyBackward:
    return op.operand(1)->type().dim(-1);
  default:
    return 20; // a step number: 1..20
  }
}

Tensor randomOperand(const Op &op, unsigned i, Rng &rng) {
  Tensor t = Tensor::zeros(op.operand(i)->type());
  for (float &v : t.data)
    v = float(rng.normal());
  bool scalarStep = t.type.rank() == 0 && !isFloat(t.type.dtype);
  // The generation ops' positions: rows of the cache [B, T, D], leaving kv_write room for
  // its S rows.
  bool position = (op.kind() == OpKind::KvWrite || op.kind() == OpKind::DecodeAttention) && i == 3;
  int64_t rows = op.kind() == OpKind::KvWrite ? op.operand(0)->type().dim(1) - op.operand(2)->type().dim(1) + 1
                 : op.kind() == OpKind::DecodeAttention ? op.operand(1)->type().dim(1) : 0;
  for (int32_t &v : t.ints)
    v = position     ? int32_t(rng.below(rows))
        : scalarStep ? int32_t(1 + rng.below(20))
                     : int32_t(rng.below(intBound(op, i)));
  // AdamW reads a second moment (>= 0), a learning rate and a clip factor in (0, 1].
  if (op.kind() == OpKind::AdamW && i == 3)
    for (float &v : t.data)
      v = std::fabs(v);
  if (op.kind() == OpKind::AdamW && (i == 4 || i == 5))
    t.data[0] = i == 4 ? 1e-3f : 0.5f;
  if (op.kind() == OpKind::ClipScale)
    t.data[0] = std::fabs(t.data[0]) * 10;
  // A quantize's scale spans the range a delayed scale takes (some values saturate); its
  // scale_inv is set from it by the caller. fp8_update reads amaxes (>= 0) and a scale (> 0).
  if (op.kind() == OpKind::Quantize && i == 1)
    t.data[0] = float(std::exp2(rng.normal() * 3) * 100);
  if (op.kind() == OpKind::Fp8Update && i != 3 && i != 4)
    for (float &v : t.data)
      v = std::fabs(v) * (i == 1 ? 100 : 1);
  return t;
}

bool isLayerNormFused(OpKind kind) {
  return kind == OpKind::LayerNormLinear || kind == OpKind::LayerNormMLP ||
         kind == OpKind::LayerNormLinearBackward || kind == OpKind::LayerNormMLPBackward;
}

/// FP8 values (code times scale_inv) of a quantize that applies the GELU or its gradient first:
/// the GPU's tanhf and the CPU's differ by an ulp now and then, which moves a value across an FP8
/// rounding boundary about once in 2^20 elements. Such elements may be one FP8 step apart (a
/// quarter of the value at most, E5M2's; near zero one subnormal step, under 1e-5 of the largest
/// value), a few in 10^5 of them; every other element has the CPU's code. Under current scaling
/// the amax itself may be such a value, an ulp apart, and with it the scale: each value then
/// within 1e-6 of the CPU's.
void expectFp8OfGeluMatches(const Tensor &want, const Tensor &got) {
  ASSERT_EQ(want.data.size(), got.data.size());
  float largest = 0;
  for (float w : want.data)
    largest = std::max(largest, std::fabs(w));
  size_t apart = 0;
  for (size_t i = 0; i < want.data.size(); ++i) {
    float w = want.data[i], g = got.data[i], magnitude = std::max(std::fabs(w), std::fabs(g));
    if (std::fabs(g - w) <= 1e-6f * magnitude)
      continue;
    ++apart;
    ASSERT_LE(std::fabs(g - w), std::max(0.25f * magnitude, 1e-5f * largest)) << "element " << i;
  }
  EXPECT_LE(apart, 2 + want.data.size() / 16384) << apart << " of " << want.data.size() << " elements differ";
}

/// Every op of `program` alone on the GPU against the CPU, on fresh random operands; `checked`
/// counts them. A LayerNorm+Linear/MLP op (or gradient) runs on the GPU as expand-layernorm-fused
/// lowers it; `onlyLayerNormFused` restricts the ops to those.
void expectEveryOpMatchesTheCpu(const Graph *program, int &checked, bool onlyLayerNormFused = false,
                                const std::function<bool(const Op &)> &selected = nullptr) {
  Rng rng(freshSeed());
  for (const Op *op : program->ops()) {
    if (isLeaf(op->kind()) || hasSideEffects(op->kind()) ||
        (onlyLayerNormFused && !isLayerNormFused(op->kind())) || (selected && !selected(*op)))
      continue;
    // The op alone, its operands as inputs.
    Graph single("op");
    Builder b(single);
    std::map<std::string, Tensor> inputs;
    llvm::SmallVector<Value *, 8> operands;
    // attention_backward's out and lse (and with head_major, its head-major q, k, v) are what
    // the forward made of a packed qkv (below), a random input.
    bool attentionGradient = op->kind() == OpKind::AttentionBackward;
    bool headMajor = attentionGradient && isHeadMajor(op->attrs());
    for (unsigned i = 0; i < (attentionGradient ? 2u : op->numOperands()); ++i) {
      std::string name = "in" + std::to_string(i);
      TensorType type = op->operand(i)->type();
      if (headMajor && i == 1) {
        type = op->result()->type(); // the packed qkv
        operands.push_back(b.input(name, type));
        inputs[name] = Tensor::zeros(type);
        for (float &v : inputs[name].data)
          v = float(rng.normal());
        continue;
      }
      if (!isFp8(type.dtype)) {
        // An FP8 product's bias is a parameter (the GPU adds its BF16 copy).
        bool bias = op->kind() == OpKind::MatMulBias && i == 2 && isFp8(op->operand(0)->type().dtype);
        operands.push_back(bias ? b.param(name, type, AttrMap()) : b.input(name, type));
        inputs[name] = randomOperand(*op, i, rng);
        continue;
      }
      // An FP8 operand comes from a quantize of a random f32 input, at a random scale.
      TensorType wide(DType::F32, type.shape);
      Value *x = b.input(name, wide), *scale = b.input(name + ".scale", TensorType(DType::F32, {}));
      Value *scaleInv = b.input(name + ".scale_inv", TensorType(DType::F32, {}));
      AttrMap attrs;
      attrs.set("format", std::string(type.dtype == DType::F8E5M2 ? "e5m2" : "e4m3"));
      operands.push_back(b.create(OpKind::Quantize, {x, scale, scaleInv}, attrs, name + ".q"));
      Tensor values = Tensor::zeros(wide);
      for (float &v : values.data)
        v = float(rng.normal());
      float s = float(std::exp2(rng.normal()) * 100);
      inputs[name] = std::move(values);
      inputs[name + ".scale"] = Tensor{TensorType(DType::F32, {}), {s}, {}};
      inputs[name + ".scale_inv"] = Tensor{TensorType(DType::F32, {}), {1.0f / s}, {}};
    }
    if (op->kind() == OpKind::Quantize)
      inputs["in2"].data[0] = 1.0f / inputs["in1"].data[0];
    if (attentionGradient) {
      Op *forward = b.createOp(OpKind::Attention, {operands[1]}, op->attrs(), "forward");
      ASSERT_TRUE(forward);
      if (headMajor)
        operands[1] = forward->result(2);
      operands.append({forward->result(0), forward->result(1)});
    }
    Op *copy = b.createOp(op->kind(), operands, op->attrs(), "out");
    ASSERT_FALSE(bool(b.takeError()));
    for (unsigned r = 0; r < copy->numResults(); ++r)
      single.addOutput(copy->result(r));
    SCOPED_TRACE(printOp(*copy));
    Interpreter cpu(single);
    ASSERT_FALSE(bool(cpu.bindAll(inputs)));
    auto want = unwrap(cpu.run());
    bool expanded = isLayerNormFused(op->kind());
    if (expanded) {
      auto expand = unwrap(PassPipeline::create(std::vector<std::string>{"expand-layernorm-fused"}, {}));
      ASSERT_FALSE(bool(expand.run(single)));
    }
    CudaOptions options;
    options.poisonResults = true;
    auto gpu = unwrap(createCudaExecutor(single, options));
    ASSERT_TRUE(gpu);
    ASSERT_FALSE(bool(gpu->bindAll(inputs)));
    auto got = unwrap(gpu->run());
    ASSERT_EQ(got.size(), want.size());
    bool geluQuantize = op->kind() == OpKind::Quantize && op->attrs().has("activation");
    for (size_t r = 0; r < want.size(); ++r) {
      EXPECT_EQ(got[r].ints, want[r].ints) << "result " << r; // argmax: the same indices
      if (geluQuantize && isFp8(copy->result(r)->type().dtype)) {
        expectFp8OfGeluMatches(want[r], got[r]);
        continue;
      }
      double scale = 0, worst = 0;
      for (size_t i = 0; i < want[r].data.size(); ++i) {
        float w = want[r].data[i], g = got[r].data[i];
        if (std::isinf(w)) {
          ASSERT_EQ(g, w) << "element " << i;
          continue;
        }
        ASSERT_FALSE(std::isnan(g)) << "element " << i << " unwritten or NaN (CPU: " << w << ")";
        scale = std::max(scale, double(std::fabs(w)));
        worst = std::max(worst, double(std::fabs(g - w)));
      }
      // Hopper's FP8 tensor cores add products with about 14 significant bits before cuBLASLt
      // promotes the sums to fp32 (DeepSeek-V3 report, section 3.3.2): 1e-3 for FP8 GEMMs.
      // decode_attention rounds its softmax's probabilities to BF16 under gemm_dtype, from
      // scores summed in another order than the CPU's: one can land on the neighbouring BF16.
      // The attention kernels take the softmax online (FlashAttention): under gemm_dtype they
      // round unnormalised probabilities to BF16, where the CPU rounds normalised ones.
      bool fp8Gemm = (op->kind() == OpKind::MatMul || op->kind() == OpKind::MatMulBias) &&
                     isFp8(op->operand(0)->type().dtype);
      bool attention = op->kind() == OpKind::DecodeAttention || op->kind() == OpKind::Attention ||
                       op->kind() == OpKind::AttentionBackward;
      bool bf16Attention = attention && op->attrs().getString("gemm_dtype") == "bf16";
      // An expanded op is a chain of GEMMs and kernels, each summing in its own order: in fp32
      // 1e-4; under BF16 a sum an ulp away can round an intermediate (fc1's activation, the
      // recomputed norm) to the neighbouring BF16 value before the next GEMM reads it.
      bool bf16 = op->attrs().getString("gemm_dtype") == "bf16";
      // residual_norm_linear is such a chain too: its norm rounded to BF16, then its GEMV.
      expanded |= op->kind() == OpKind::ResidualNormLinear;
      // matmul_dgelu: cuBLASLt's own GELU derivative applied to the product.
      bool dgelu = op->kind() == OpKind::MatMulDGelu;
      double bound = (bf16Attention || (expanded && bf16)) ? 1e-2
                     : fp8Gemm                             ? 1e-3
                     : expanded || dgelu                   ? 1e-4
                                                           : 1e-5;
      if (expanded || dgelu)
        std::printf("%s result %zu: max difference %.3g at scale %.3g (%.3g of it)\n",
                    op->name().str().c_str(), r, worst, scale, worst / std::max(scale, 1e-30));
      EXPECT_LE(worst, bound * scale + 1e-6) << "result " << r << ": max difference " << worst
                                             << " at scale " << scale;
    }
    ++checked;
  }
}

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
  // Two layers: 5 ops each where the GEMVs normalise their rows (bf16, fp8: their decode step's
  // products are BF16), 8 in fp32, and the embeddings, head and argmax.
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
    // A prefill of an odd prompt length: 5 positions.
    auto graph = unwrap(buildGPT(c, c.train.batch, output, output == GPTOutput::Prefill ? 5 : 0));
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
  // FP8 with current scaling (each quantize scales by its own amax, with a margin).
  ModelConfig current = odd;
  current.precision.fp8Scaling = Fp8Scaling::Current;
  current.precision.margin = 1;
  compile(current, GPTOutput::Loss, Recipe::Fp8, gpuPipeline(true, Recipe::Fp8));
  // Rows wider than the norm kernels hold in registers (d_model 1040 > 1024: their loops over
  // global memory), 13 heads of 80; the norms' backward with --recompute's programs too.
  ModelConfig wide = odd;
  wide.vocab = 1000;
  wide.dModel = 1040;
  wide.heads = 13;
  compile(wide, GPTOutput::Loss, Recipe::Bf16, gpuPipeline(true, Recipe::Bf16));
  wide.train.recompute = true;
  compile(wide, GPTOutput::Loss, Recipe::Fp32, gpuPipeline(true, Recipe::Fp32));
  // Many rows: the norms' gradient takes chunks of several rows a block (1616 rows: 3 a chunk,
  // the last chunk 2), and the column sums many chunks.
  ModelConfig tall = odd;
  tall.vocab = 1000;
  tall.train.batch = 101;
  compile(tall, GPTOutput::Loss, Recipe::Bf16, gpuPipeline(true, Recipe::Bf16));
  compile(tall, GPTOutput::Loss, Recipe::Fp32, gpuPipeline(true, Recipe::Fp32));
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
// others include) and BoxMuller.h (support/'s normal draw that common.cuh includes, checked by
// GpuTraining.ParametersDrawnOnTheDeviceHaveTheHostsBits) has ops among the odd programs, so a
// new header cannot go untested by the GPU test below.
TEST(KernelFamilies, EveryHeaderHasOpsAtOddShapes) {
  auto programs = oddPrograms();
  std::map<std::string, int> ops;
  for (const auto &[op, header] : kernelHeadersOfOps(programs))
    ++ops[header];
  for (const KernelHeader &header : kernelHeaders()) {
    llvm::StringRef name = header.name;
    if (name == "common.cuh" || name == "tensorcore.cuh" || name == "BoxMuller.h")
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
                         testing::Values("attention.cuh", "decode.cuh", "elementwise.cuh", "embedding.cuh",
                                         "fp8.cuh", "gemv.cuh", "layout.cuh", "loss.cuh", "norms.cuh", "optimizer.cuh",
                                         "reduce.cuh", "softmax.cuh"),
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
/// last tile cut short, head dimensions from 12 to 128; on tensor cores (BF16), a thread per
/// row (BF16 at head dimension 12, which the tensor-core kernels do not take) and in fp32. Run
/// by tgc's kernels, and by cuDNN's fused attention where cuDNN is found (BF16, head dimensions
/// that are multiples of 8: every shape here but 12).
class GpuAttention : public testing::TestWithParam<std::string> {};

TEST_P(GpuAttention, AndItsGradientMatchTheCpuAtSeveralShapes) {
  SKIP_WITHOUT_GPU();
  bool cudnn = GetParam() == "cudnn";
  if (cudnn)
    if (auto api = loadCudnn(); !api)
      GTEST_SKIP() << llvm::toString(api.takeError());
  struct Shape {
    int64_t B, T, H, Dh;
  };
  Rng rng(freshSeed());
  for (const char *dtype : {"bf16", "fp32"})
    for (Shape s : {Shape{2, 128, 2, 64}, Shape{1, 300, 2, 64}, Shape{1, 200, 2, 128}, Shape{3, 96, 1, 32}, Shape{2, 64, 3, 16},
                    Shape{1, 1, 1, 16}, Shape{2, 70, 2, 12}}) { // head dimension 12: no tensor cores
      SCOPED_TRACE(fmt::format("{}: B {} T {} H {} Dh {}", dtype, s.B, s.T, s.H, s.Dh));
      int64_t D = s.H * s.Dh;
      Graph graph("attention");
      Builder b(graph);
      Value *qkv = b.input("qkv", TensorType(DType::F32, {s.B, s.T, 3 * D}));
      Value *dout = b.input("dout", TensorType(DType::F32, {s.B, s.T, D}));
      AttrMap attrs;
      attrs.set("heads", s.H);
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

/// The largest difference between `got` and `want`, and the largest magnitude in `want` (what
/// the tests' bounds are relative to).
struct Gap {
  double worst = 0, scale = 0;
};
Gap gapOf(const std::vector<float> &want, const std::vector<float> &got) {
  Gap gap;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    gap.scale = std::max(gap.scale, double(std::fabs(want[i])));
    gap.worst = std::max(gap.worst, double(std::fabs(got[i] - want[i])));
  }
  return gap;
}

class GpuDecode : public testing::TestWithParam<std::string> {};

TEST_P(GpuDecode, StepsFollowTheCpuThroughTheWholeCache) {
  // Under bf16 the caches are stored in BF16 on the GPU (chooseBf16Caches), bound from the
  // host, written and read as such.
  SKIP_WITHOUT_GPU();
  const bool bf16 = GetParam() == "bf16";
  auto program = tinyGpuProgram(GetParam(), GPTOutput::Decode);
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = initParams(*program, rng.next());
  for (auto &[name, t] : leaves)
    for (float &v : t.data)
      v += float(rng.normal() * 0.1);
  Interpreter cpu(*program);
  auto gpu = unwrap(createCudaExecutor(*program));
  ASSERT_TRUE(gpu);
  ASSERT_FALSE(bool(cpu.bindAll(leaves)));
  ASSERT_FALSE(bool(gpu->bindAll(leaves)));
  const TensorType column = program->lookup("tokens")->type();
  int64_t T = program->lookup("h0.attn.k_cache")->type().dim(1), vocab = program->lookup("wte")->type().dim(0);
  for (int64_t pos = 0; pos < T; ++pos) {
    Tensor tokens = Tensor::zeros(column), positions = Tensor::zeros(column);
    for (int32_t &t : tokens.ints)
      t = int32_t(rng.below(vocab));
    for (size_t b = 0; b < positions.ints.size(); ++b) // each sequence at a position of its own
      positions.ints[b] = int32_t(pos * (b + 1) % T);
    std::map<std::string, Tensor> step{{"tokens", tokens}, {"positions", positions}};
    ASSERT_FALSE(bool(cpu.bindAll(step)));
    ASSERT_FALSE(bool(gpu->bindAll(step)));
    std::vector<float> want = unwrap(cpu.run()).at(0).data, got = unwrap(gpu->run()).at(0).data;
    ASSERT_EQ(got.size(), want.size());
    Gap gap = gapOf(want, got);
    ASSERT_LE(gap.worst, (bf16 ? 1e-2 : 1e-5) * gap.scale) << "position " << pos;
  }
  // The caches as the CPU holds them (a BF16 cache is read back widened: the same values).
  for (const char *cache : {"h0.attn.k_cache", "h1.attn.v_cache"}) {
    Gap gap = gapOf(unwrap(cpu.read(cache)).data, unwrap(gpu->read(cache)).data);
    EXPECT_LE(gap.worst, (bf16 ? 1e-2 : 1e-5) * gap.scale) << cache;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuDecode, testing::Values("fp32", "bf16"));

/// Runs `graph` on the CPU interpreter and on the GPU from the same leaves; `want` and `got` get
/// their outputs (left empty, with a test failure, where either fails).
void runOnBoth(const Graph &graph, const std::map<std::string, Tensor> &leaves, std::vector<Tensor> &want,
               std::vector<Tensor> &got, std::string *described = nullptr) {
  Interpreter cpu(graph);
  auto gpu = unwrap(createCudaExecutor(graph));
  ASSERT_TRUE(gpu);
  if (described) // how the executor runs it (CudaExecutor::describe)
    *described = gpu->describe();
  ASSERT_FALSE(bool(cpu.bindAll(leaves)));
  ASSERT_FALSE(bool(gpu->bindAll(leaves)));
  want = unwrap(cpu.run());
  got = unwrap(gpu->run());
  ASSERT_EQ(got.size(), want.size());
}

/// Each result of `got` within BF16's rounding (1e-2 of the largest magnitude) of `want`'s, the
/// gap printed under `what`.
void expectWithinBf16(const char *what, const std::vector<Tensor> &want, const std::vector<Tensor> &got) {
  for (size_t r = 0; r < got.size() && r < want.size(); ++r) {
    Gap gap = gapOf(want[r].data, got[r].data);
    std::printf("%s, result %zu: max difference %.3g at scale %.3g\n", what, r, gap.worst, gap.scale);
    EXPECT_LE(gap.worst, 1e-2 * gap.scale) << "result " << r << ": max difference " << gap.worst;
  }
}

TEST(GpuGeneration, FewRowProductsMatchTheCpu) {
  // gemv.cuh: the products of decode steps against a weight. 1 to 8 rows on the CUDA cores; 9
  // to 64 on tensor cores (partial and whole m16 tiles) with K in 8 slices (256), 1 slice (96:
  // each warp all of K, written without shared memory), past 8 loads of weight a lane (2048: the
  // next weights load while these multiply); 200 columns (a partial block) and 16384 (the most
  // the tensor-core kernel takes); with and without a bias, and the bias then the GELU
  // (matmul_bias_gelu, both of its results). 65 rows, or 16385 columns past 8 rows: cuBLASLt.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  struct Shape {
    int64_t M, K, N;
  };
  std::vector<Shape> shapes;
  for (int64_t M : {1, 3, 8, 9, 24, 32, 64, 65})
    shapes.push_back({M, 256, 200});
  shapes.push_back({24, 96, 200});
  shapes.push_back({32, 2048, 200});
  shapes.push_back({17, 256, 16384});
  shapes.push_back({17, 256, 16385});
  shapes.push_back({8, 256, 16385});
  for (const Shape &s : shapes)
    for (const char *kind : {"matmul", "matmul_bias", "matmul_bias_gelu"}) {
      const int64_t M = s.M, K = s.K, N = s.N;
      bool bias = std::string(kind) != "matmul", gelu = std::string(kind) == "matmul_bias_gelu";
      SCOPED_TRACE(fmt::format("{} rows, K {}, N {}, {}", M, K, N, kind));
      std::string text = fmt::format(
          "graph @g\n%x = input() : f32[{0},{1}]\n%w = param() {{init=\"normal\", std=1.0}} : f32[{2},{1}]\n{3}"
          "{4} = {5} {{gemm_dtype=\"bf16\"{6}}} : f32[{0},{2}]{7}\nreturn {4}\n",
          M, K, N, bias ? fmt::format("%b = param() {{init=\"zeros\"}} : f32[{}]\n", N) : "", gelu ? "%y, %h" : "%y",
          bias ? fmt::format("{}(%x, %w, %b)", kind) : "matmul(%x, %w)", bias ? "" : ", transpose_b=true",
          gelu ? fmt::format(", f32[{},{}]", M, N) : "");
      auto graph = unwrap(parseGraph(text, "gemv.ir"));
      ASSERT_TRUE(graph);
      FewRows kernel = M <= 8 ? FewRows::Gemv : M <= 64 && N <= 16384 ? FewRows::Tensor : FewRows::None;
      for (const Op *op : graph->ops())
        if (op->kind() != OpKind::Input && op->kind() != OpKind::Param) {
          EXPECT_EQ(int(fewRows(*op)), int(kernel));
        }
      std::map<std::string, Tensor> leaves{{"x", Tensor::zeros(TensorType(DType::F32, {M, K}))},
                                           {"w", Tensor::zeros(TensorType(DType::F32, {N, K}))}};
      if (bias)
        leaves["b"] = Tensor::zeros(TensorType(DType::F32, {N}));
      for (auto &[name, t] : leaves)
        for (float &v : t.data)
          v = float(rng.normal());
      std::vector<Tensor> want, got;
      runOnBoth(*graph, leaves, want, got);
      ASSERT_EQ(got.size(), gelu ? 2u : 1u);
      for (size_t r = 0; r < got.size(); ++r) {
        Gap gap = gapOf(want[r].data, got[r].data);
        // The same BF16 products, summed in another order.
        EXPECT_LE(gap.worst, 1e-5 * gap.scale) << "result " << r << ": max difference " << gap.worst;
      }
    }
}

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
  // gradient of x and h with its column sums (activation="gelu_backward", bias_grad), where an
  // ulp of tanhf may move a rare value to the next FP8 code (expectFp8OfGeluMatches) and the sums
  // by as much.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  for (std::string shape : {"16,16", "48,80", "3,16,112", "2112,2112"})
    for (bool current : {false, true})
      for (const char *format : {"e4m3", "e5m2"})
        for (std::string activation : {"", "gelu", "gelu_backward"}) {
          SCOPED_TRACE(fmt::format("[{}], {}, {}, {}", shape, current ? "current" : "delayed", format, activation));
          TensorType type =
              unwrap(parseGraph(fmt::format("graph @g\n%x = input() : f32[{}]\nreturn %x\n", shape), "shape.ir"))
                  ->lookup("x")
                  ->type();
          int64_t cols = type.dim(-1), rows = type.numElements() / cols;
          bool gradient = activation == "gelu_backward";
          std::string text = fmt::format(
              "graph @g\n%x = input() : f32[{0}]\n%s = input() : f32[]\n%si = input() : f32[]\n{6}"
              "%q, %amax, %sat, %qt{7} = quantize(%x, %s, %si{8}) {{{5}format=\"{1}\", {2}transpose=true}} : "
              "f8{1}[{0}], f32[], f32[], f8{1}[{3},{4}]{9}\nreturn %q, %amax, %sat, %qt{7}\n",
              shape, format, current ? "margin=1, scaling=\"current\", " : "", cols, rows,
              activation.empty() ? ""
              : gradient         ? "activation=\"gelu_backward\", bias_grad=true, "
                                 : "activation=\"gelu\", ",
              gradient ? fmt::format("%h = input() : f32[{}]\n", shape) : "", gradient ? ", %db" : "",
              gradient ? ", %h" : "", gradient ? fmt::format(", f32[{}]", cols) : "");
          auto graph = unwrap(parseGraph(text, "cast-transpose.ir"));
          ASSERT_TRUE(graph);
          std::map<std::string, Tensor> leaves;
          Tensor x = Tensor::zeros(type), h = Tensor::zeros(type);
          for (float &v : x.data)
            v = float(rng.normal() * 4);
          for (float &v : h.data)
            v = float(rng.normal() * 2);
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
          ASSERT_EQ(got.size(), gradient ? 5u : 4u);
          if (!activation.empty()) {
            expectFp8OfGeluMatches(want[0], got[0]);
            expectFp8OfGeluMatches(want[3], got[3]);
            EXPECT_NEAR(got[1].data[0], want[1].data[0], 1e-6 * want[1].data[0]); // amax: an ulp
            EXPECT_NEAR(got[2].data[0], want[2].data[0], 2 + want[0].data.size() / 16384.0);
          } else {
            for (size_t r = 0; r < 4; ++r)
              EXPECT_EQ(got[r].data, want[r].data) << "result " << r;
          }
          if (gradient) { // the column sums: each gradient within an ulp or two of the CPU's
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

TEST(GpuGeneration, NormalisingProductsMatchTheCpu) {
  // gemv.cuh's residual_norm_linear (fuse-residual-norm-gemv): 1, 3 and 8 rows, rows of 64, 200
  // (a partial last lane pass) and 1024 features (the most a warp holds), LayerNorm and RMSNorm,
  // with a bias and the GELU or neither; 200 columns (a partial block). Both results against the
  // CPU: the sum exactly, the product within BF16's reach (a norm value summed in another order
  // can round to the neighbouring BF16 before the product reads it).
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  const int64_t N = 200;
  for (int64_t M : {1, 3, 8})
    for (int64_t K : {64, 200, 1024})
      for (bool layer : {true, false}) {
        bool gelu = layer; // LayerNorm with a bias and the GELU, RMSNorm with neither
        SCOPED_TRACE(fmt::format("{} rows of {}, {}", M, K, layer ? "layer_norm, bias, gelu" : "rms_norm"));
        std::string text = fmt::format(
            "graph @g\n%a = input() : f32[{0},1,{1}]\n%b = input() : f32[{0},1,{1}]\n"
            "%gamma = input() : f32[{1}]\n{3}%w = param() {{init=\"normal\", std=1.0}} : f32[{2},{1}]\n{4}"
            "%s, %y = residual_norm_linear(%a, %b, %gamma, {5}%w{6}) {{{7}eps=1e-05, gemm_dtype=\"bf16\", norm=\"{8}\"}} "
            ": f32[{0},1,{1}], f32[{0},1,{2}]\nreturn %s, %y\n",
            M, K, N, layer ? fmt::format("%beta = input() : f32[{}]\n", K) : "",
            gelu ? fmt::format("%bias = input() : f32[{}]\n", N) : "", layer ? "%beta, " : "", gelu ? ", %bias" : "",
            gelu ? "activation=\"gelu\", bias=true, " : "", layer ? "layer_norm" : "rms_norm");
        auto graph = unwrap(parseGraph(text, "norm-gemv.ir"));
        ASSERT_TRUE(graph);
        std::map<std::string, Tensor> leaves;
        for (const Op *op : graph->ops())
          if (op->kind() == OpKind::Input || op->kind() == OpKind::Param) {
            Tensor t = Tensor::zeros(op->result()->type());
            for (float &v : t.data)
              v = float(rng.normal());
            leaves[op->result()->name()] = std::move(t);
          }
        std::vector<Tensor> want, got;
        runOnBoth(*graph, leaves, want, got);
        ASSERT_EQ(got.size(), 2u);
        EXPECT_EQ(got[0].data, want[0].data); // the sums: one fp32 add each
        Gap gap = gapOf(want[1].data, got[1].data);
        EXPECT_LE(gap.worst, 1e-2 * gap.scale) << "max difference " << gap.worst << " at scale " << gap.scale;
      }
}

TEST(GpuGeneration, AttentionOverTheCacheWritingItMatchesTheCpu) {
  // decode.cuh's attention writing the caches (fuse-kv-write's; not in place: they are inputs
  // here, copied first), 8 sequences of 16 heads over a cache of 512 positions (16 parts of 32
  // keys each, 2048 in all) at positions anywhere in it, the last included; fp32 (exact caches)
  // and bf16.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  const int64_t B = 8, T = 512, H = 16, Dh = 16, D = H * Dh;
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "fp32");
    std::string text = fmt::format(
        "graph @g\n%qkv = input() : f32[{0},1,{3}]\n%k = input() : f32[{0},{1},{2}]\n%v = input() : f32[{0},{1},{2}]\n"
        "%positions = input() : i32[{0},1]\n%out, %k.new, %v.new = decode_attention(%qkv, %k, %v, %positions) "
        "{{{4}heads={5}, scale=0.25, write_cache=true}} : f32[{0},1,{2}], f32[{0},{1},{2}], f32[{0},{1},{2}]\n"
        "return %out, %k.new, %v.new\n",
        B, T, D, 3 * D, bf16 ? "gemm_dtype=\"bf16\", " : "", H);
    auto graph = unwrap(parseGraph(text, "decode-attention.ir"));
    ASSERT_TRUE(graph);
    std::map<std::string, Tensor> leaves;
    for (const char *name : {"qkv", "k", "v"}) {
      Tensor t = Tensor::zeros(graph->lookup(name)->type());
      for (float &x : t.data)
        x = float(rng.normal());
      leaves[name] = std::move(t);
    }
    Tensor positions = Tensor::zeros(TensorType(DType::I32, {B, 1}));
    for (int32_t &p : positions.ints)
      p = int32_t(rng.below(T));
    positions.ints[0] = int32_t(T - 1); // every part of the first sequence
    leaves["positions"] = positions;
    std::vector<Tensor> want, got;
    runOnBoth(*graph, leaves, want, got);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[1].data, want[1].data); // the caches: copied, and this step's rows written
    EXPECT_EQ(got[2].data, want[2].data);
    Gap gap = gapOf(want[0].data, got[0].data);
    EXPECT_LE(gap.worst, (bf16 ? 1e-2 : 1e-5) * gap.scale) << "max difference " << gap.worst;
  }
}

TEST(GpuGeneration, PrefillAndDecodeGiveTheCpusTokens) {
  // Prompts of four lengths in one batch (the longest needs the 32-position prefill), greedy
  // and sampled: the GPU's tokens are the CPU interpreter's.
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp32;
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = initParams(*graph, rng.next());
  for (auto &[name, t] : weights)
    for (float &v : t.data)
      v += float(rng.normal() * 0.1);
  auto cpu = unwrap(Generator::create(c, weights, 4, Device::cpu()));
  auto gpu = unwrap(Generator::create(c, weights, 4, theGpu()));
  ASSERT_TRUE(cpu && gpu);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t length : {1, 7, 16, 20}) {
    prompts.emplace_back(length);
    for (int32_t &t : prompts.back())
      t = int32_t(rng.below(c.vocab));
  }
  for (SamplingOptions options : {SamplingOptions{}, SamplingOptions{0.8, 10, 0.9, 7}}) {
    auto want = unwrap(cpu->generate(prompts, c.seqLen - 20 + 1, options));
    auto got = unwrap(gpu->generate(prompts, c.seqLen - 20 + 1, options));
    EXPECT_EQ(got, want) << "temperature " << options.temperature;
    EXPECT_EQ(gpu->stats().prefillLength, 32);
    EXPECT_TRUE(gpu->stats().cached);
  }
}

std::vector<double> losses(Device device, int steps, const char *recipe = "fp32") {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml")));
  c.precision.recipe = *parseRecipe(recipe);
  auto trainer = unwrap(Trainer::create(c, "", device));
  std::vector<double> out;
  if (!trainer)
    return out;
  for (int i = 0; i < steps; ++i) {
    auto r = unwrap(trainer->step());
    out.push_back(r.loss);
  }
  return out;
}

TEST(GpuTraining, Fp32LossesFollowTheCpuFor20Steps) {
  SKIP_WITHOUT_GPU();
  std::vector<double> cpu = losses(Device::cpu(), 20), gpu = losses(theGpu(), 20);
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "step " << i + 1;
}

/// Three training steps of the tiny model under `recipe` with executors made with `a` and `b`,
/// from the same weights and batches: the same losses, gradient norms, parameters, moments and
/// FP8 scaling state, bit for bit.
void expectTheSameBits(const char *recipe, CudaOptions a, CudaOptions b) {
  SCOPED_TRACE(recipe);
  auto program = tinyGpuProgram(recipe);
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = initParams(*program, rng.next());
  auto first = unwrap(createCudaExecutor(*program, a));
  auto second = unwrap(createCudaExecutor(*program, b));
  ASSERT_TRUE(first && second);
  ASSERT_FALSE(bool(first->bindAll(leaves)));
  ASSERT_FALSE(bool(second->bindAll(leaves)));
  int64_t vocab = program->lookup("wte")->type().dim(0);
  for (int32_t step = 1; step <= 3; ++step) {
    std::map<std::string, Tensor> inputs;
    for (const char *name : {"tokens", "targets"}) {
      Tensor t = Tensor::zeros(program->lookup(name)->type());
      for (int32_t &id : t.ints)
        id = int32_t(rng.below(vocab));
      inputs[name] = std::move(t);
    }
    inputs["step"] = Tensor{TensorType(DType::I32, {}), {}, {step}};
    ASSERT_FALSE(bool(first->bindAll(inputs)));
    ASSERT_FALSE(bool(second->bindAll(inputs)));
    std::vector<Tensor> x = unwrap(first->run()), y = unwrap(second->run());
    ASSERT_EQ(x.size(), y.size());
    for (size_t o = 0; o < x.size(); ++o)
      EXPECT_EQ(x[o].data, y[o].data) << "step " << step << ", output %" << program->outputs()[o]->name();
  }
  int compared = 0;
  for (const Op *op : program->ops())
    if (op->kind() == OpKind::Param || op->kind() == OpKind::State) {
      std::string name = op->result()->name();
      EXPECT_EQ(unwrap(first->read(name)).data, unwrap(second->read(name)).data) << name;
      ++compared;
    }
  EXPECT_GT(compared, 80);
}

TEST(GpuTraining, GroupedOptimizerGivesTheBitsOfOneKernelPerOp) {
  // AdamW as one launch over the contiguous parameters and the gradient norm as one pair of
  // launches give exactly what one kernel per op gives. Under bf16 and fp8 the grouped AdamW
  // also writes the parameters' BF16 copy the next step's GEMMs read, which one kernel per op
  // leaves to the conversion at each step's start.
  SKIP_WITHOUT_GPU();
  CudaOptions perOp;
  perOp.groupOptimizer = false;
  for (const char *recipe : {"fp32", "bf16", "fp8"})
    expectTheSameBits(recipe, CudaOptions{}, perOp);
}

TEST(GpuTraining, ValuesStoredInBf16GiveTheBitsOfConvertingAtEachGemm) {
  // Values only BF16 GEMMs read, stored in BF16 by their producers, give exactly what storing
  // them in fp32 and converting them at each GEMM gives. (The GELU epilogues that write BF16
  // round h and its gradient, which the fp32 path keeps: without them here; the losses'
  // tests take them.)
  SKIP_WITHOUT_GPU();
  CudaOptions stored, converting;
  stored.bf16Rounding = false;
  converting.storeBf16 = false;
  for (const char *recipe : {"bf16", "fp8"})
    expectTheSameBits(recipe, stored, converting);
}

TEST(GpuTraining, Bf16LossesFollowTheCpuEmulationFor20Steps) {
  // BF16 GEMMs read the same BF16 operands on both (the weights from the GPU's BF16 copy of the
  // parameter buffer, which the step before's AdamW wrote); the order of the fp32 sums differs,
  // which can move a later BF16 rounding by one step, and the GPU's GELU epilogues round fc1's
  // bias, h and the GELU's gradient to BF16 (CudaProgram::bf16Rounding), which the CPU keeps.
  SKIP_WITHOUT_GPU();
  std::vector<double> cpu = losses(Device::cpu(), 20, "bf16"), gpu = losses(theGpu(), 20, "bf16");
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 2e-3 * cpu[i]) << "step " << i + 1;
}

ModelConfig tinyFp8() {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8; // fp8_min_dim 16: every linear layer but the head in FP8
  return c;
}

TEST(GpuTraining, Fp8LossesFollowTheCpuEmulationFor20Steps) {
  SKIP_WITHOUT_GPU();
  auto cpu = unwrap(Trainer::create(tinyFp8(), "", Device::cpu()));
  auto gpu = unwrap(Trainer::create(tinyFp8(), "", theGpu()));
  ASSERT_TRUE(cpu && gpu);
  // The GPU sums in another order, so a value near an FP8 rounding boundary can round the other
  // way, and AdamW turns such differences into different steps: close, not equal. The GPU also
  // rounds to BF16 what the CPU keeps in fp32 where an FP8 program's activations are BF16 under
  // Transformer Engine (CudaProgram::bf16Rounding: the norms' outputs the quantizes read, the
  // products the norms read, fc1's h and its GELU's gradient, the biases): 4e-3 over 20 steps
  // (seen: 2.1e-3 at step 18). One step from the same state stays within 3e-4 (the next test).
  for (int i = 1; i <= 20; ++i) {
    double want = unwrap(cpu->step()).loss, got = unwrap(gpu->step()).loss;
    EXPECT_NEAR(got, want, 4e-3 * want) << "step " << i;
  }
}

TEST(GpuTraining, Fp8ScalesAndAmaxHistoriesFollowTheCpuEmulationStepByStep) {
  SKIP_WITHOUT_GPU();
  ModelConfig c = tinyFp8();
  auto cpu = unwrap(Trainer::create(c, "", Device::cpu()));
  auto gpu = unwrap(Trainer::create(c, "", theGpu()));
  ASSERT_TRUE(cpu && gpu);
  double cpuSaturations = 0, gpuSaturations = 0, downstreamSum = 0, downstreamWorst = 0;
  int64_t downstreamCount = 0;
  for (int step = 1; step <= 20; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    // Each GPU step starts from the CPU's weights, optimizer and scaling state, so that what is
    // compared is one step's update of the scaling state, not 20 steps of drift.
    Checkpoint before = unwrap(cpu->checkpoint());
    ASSERT_FALSE(bool(gpu->resume(before, "the CPU run")));
    // The GPU adds the FP8 layers' biases in BF16 (cuBLASLt's FP8 epilogue takes no other),
    // which the CPU adds in fp32: one step's loss within 3e-4 (seen: up to 1.0e-4).
    double want = unwrap(cpu->step()).loss, got = unwrap(gpu->step()).loss;
    EXPECT_NEAR(got, want, 3e-4 * want);
    auto cpuState = summarizeFp8State(unwrap(cpu->checkpoint()).tensors, c.precision, 16);
    auto gpuState = summarizeFp8State(unwrap(gpu->checkpoint()).tensors, c.precision, 16);
    ASSERT_EQ(cpuState.size(), 24u); // 8 FP8 layers x (input, weight, grad_output)
    ASSERT_EQ(gpuState.size(), cpuState.size());
    for (size_t t = 0; t < cpuState.size(); ++t) {
      const Fp8TensorSummary &cs = cpuState[t], &gs = gpuState[t];
      SCOPED_TRACE(cs.site + " " + cs.role);
      ASSERT_EQ(gs.site + gs.role, cs.site + cs.role);
      EXPECT_EQ(gs.scaleInv, 1.0f / gs.scale);
      ASSERT_EQ(gs.newestAmax.size(), cs.newestAmax.size());
      ASSERT_EQ(cs.newestAmax.size(), 15u); // the window of 16 but the cleared current slot
      // Weights, and the first layer's input, are quantized before any FP8 GEMM of the step:
      // the same numbers. Everything after an FP8 GEMM inherits its accumulation error (1e-4,
      // see above), which an FP8 rounding boundary can turn into one value a step apart (6%
      // in E4M3, 12.5% in E5M2), more so through each E5M2 gradient: close on average, a few
      // percent at worst.
      // The first layer's input is its norm's output, which the GPU writes in BF16 (an FP8
      // layer's norm, CudaProgram::bf16Rounding): its amax, and the scale, within BF16's
      // rounding (half a BF16 step: 2^-8 of the value at most) of the CPU's.
      bool upstream = cs.role == "weight" || (cs.site == "h0.attn.qkv" && cs.role == "input");
      if (upstream) {
        double bound = cs.role == "weight" ? 1e-5 : 4e-3;
        EXPECT_NEAR(gs.scale, cs.scale, bound * cs.scale);
        for (size_t i = 0; i < cs.newestAmax.size(); ++i)
          EXPECT_NEAR(gs.newestAmax[i], cs.newestAmax[i], bound * cs.newestAmax[i]) << "amax " << i;
      } else {
        EXPECT_NEAR(gs.scale, cs.scale, 0.1 * cs.scale);
        double difference = std::fabs(gs.newestAmax[0] / cs.newestAmax[0] - 1);
        downstreamSum += difference;
        downstreamWorst = std::max(downstreamWorst, difference);
        ++downstreamCount;
      }
      if (step > 1) {
        EXPECT_NE(cs.scale, 1.0f);
      }
      cpuSaturations += cs.saturations;
      gpuSaturations += gs.saturations;
    }
  }
  EXPECT_LE(downstreamSum / downstreamCount, 0.01) << "mean relative amax difference";
  EXPECT_LE(downstreamWorst, 0.1);
  // Saturated values: the same counts but for a value at the edge rounding the other way.
  EXPECT_GT(cpuSaturations, 0);
  EXPECT_NEAR(gpuSaturations, cpuSaturations, 0.01 * cpuSaturations);
}

// A step whose gradients are not finite changes nothing on the GPU either: clip_scale's 0 makes
// the grouped AdamW keep every weight and moment (the micro model with an LM head of 3e38,
// tests/filecheck/inputs/overflow.safetensors), and the step counts.
TEST(GpuTraining, AStepWhoseGradientsAreNotFiniteChangesNoWeight) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = unwrap(loadModelConfig(sourcePath("tests/models/micro.yaml")));
  config.train.steps = 3;
  auto trainer = unwrap(Trainer::create(config, "", theGpu()));
  ASSERT_TRUE(trainer);
  std::string path = sourcePath("tests/filecheck/inputs/overflow.safetensors");
  ASSERT_FALSE(bool(trainer->resume(unwrap(readCheckpoint(path)), path)));
  Checkpoint before = unwrap(trainer->checkpoint());
  for (int i = 0; i < 2; ++i)
    EXPECT_FALSE(std::isfinite(unwrap(trainer->step()).gradNorm));
  Checkpoint after = unwrap(trainer->checkpoint());
  EXPECT_EQ(*after.meta.getInteger("step"), *before.meta.getInteger("step") + 2);
  int compared = 0;
  for (const auto &[name, tensor] : before.tensors) {
    if (name == "step")
      continue;
    ASSERT_TRUE(after.tensors.count(name)) << name;
    EXPECT_EQ(tensor.data, after.tensors.at(name).data) << name;
    ++compared;
  }
  EXPECT_GT(compared, 30);
}

/// Trains the seed model on the GPU under `precision`, then scores it with `tgc eval`'s
/// held-out progressions, generated on the GPU.
void expectSeedLearns(PrecisionConfig precision) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/seed.yaml")));
  c.precision = precision;
  auto trainer = unwrap(Trainer::create(c, "", theGpu()));
  ASSERT_TRUE(trainer);
  for (int64_t i = 0; i < c.train.steps; ++i)
    ASSERT_TRUE(bool(unwrap(trainer->step()).step));
  Checkpoint checkpoint = unwrap(trainer->checkpoint());
  auto generator = unwrap(Generator::create(c, checkpoint.tensors, 64, theGpu()));
  ASSERT_TRUE(generator);
  EvalResult result = unwrap(evaluateArithmetic(*generator, c, 64, 8, 64));
  EXPECT_GE(result.tokenAccuracy(), 0.99) << result.correctTokens << " of " << result.tokens;
}

TEST(GpuTraining, SeedModelLearnsInBf16) {
  SKIP_WITHOUT_GPU();
  PrecisionConfig p;
  p.recipe = Recipe::Bf16;
  expectSeedLearns(p);
}

TEST(GpuTraining, SeedModelLearnsInFp8WithEveryLinearLayerInFp8) {
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/seed.yaml")));
  PrecisionConfig p = c.precision;
  p.recipe = Recipe::Fp8;
  p.fp8MinDim = 0; // the policy would keep the seed's small GEMMs in BF16
  expectSeedLearns(p);
}

TEST(GpuTraining, ParametersDrawnOnTheDeviceHaveTheHostsBits) {
  // initLeaves on the GPU draws the normal parameters there (tgc_fill_normal), the host's draws
  // bit for bit: 64M elements of one tensor (a double log or cos an ulp away from the host's
  // would show as a differing float), a small one, and ones and zeros still bound from the host.
  SKIP_WITHOUT_GPU();
  auto graph = unwrap(parseGraph("graph @g\n"
                                 "%small = param() {init=\"normal\", std=0.02} : f32[1000]\n"
                                 "%big = param() {init=\"normal\", std=1.0} : f32[8192,8192]\n"
                                 "%gamma = param() {init=\"ones\"} : f32[1000]\n"
                                 "%beta = param() {init=\"zeros\"} : f32[1000]\n"
                                 "%x = add(%small, %gamma) : f32[1000]\n"
                                 "%y = add(%x, %beta) : f32[1000]\n"
                                 "return %y\n",
                                 "init.ir"));
  ASSERT_TRUE(graph);
  uint64_t seed = freshSeed();
  auto gpu = unwrap(createCudaExecutor(*graph));
  ASSERT_TRUE(gpu);
  ASSERT_FALSE(bool(initLeaves(*gpu, *graph, seed, ZeroLeaves::Omit)));
  std::map<std::string, Tensor> host = initParams(*graph, seed);
  for (const char *name : {"small", "big", "gamma", "beta"}) {
    Tensor got = unwrap(gpu->read(name));
    const std::vector<float> &want = host.at(name).data;
    ASSERT_EQ(got.data.size(), want.size()) << name;
    size_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i)
      differing += std::memcmp(&got.data[i], &want[i], sizeof(float)) != 0;
    EXPECT_EQ(differing, 0u) << name << ": " << differing << " of " << want.size() << " elements differ";
  }
}

TEST(GpuTraining, SameSeedSameLossesBitForBit) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(losses(theGpu(), 5), losses(theGpu(), 5));
  // BF16: the attention on cuDNN where it is found (its deterministic gradient).
  EXPECT_EQ(losses(theGpu(), 5, "bf16"), losses(theGpu(), 5, "bf16"));
}

} // namespace

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

void expectTwoGpusFollowOne(Recipe recipe, double tolerance) {
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
  std::vector<RankRun> one = trainOnGpus(config, 1, 50), two = trainOnGpus(config, 2, 50);
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
  // Every parameter, moment and FP8 scaling tensor: the same bits on both GPUs.
  int fp8 = 0;
  for (const auto &[name, t] : two[0].state) {
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

} // namespace
