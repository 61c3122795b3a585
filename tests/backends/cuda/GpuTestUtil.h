// What the GPU tests share (tests/backends/cuda/GpuKernelsTest.cpp, tests/app/Gpu*Test.cpp):
// the GPU they run on, the tiny model as the GPU compiles it, random operands, and the
// comparisons of a GPU result with the CPU interpreter's within each dtype's bound.
#pragma once

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

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <fmt/format.h>

using namespace tgc;

namespace tgc::test {

/// The GPU these tests run on (they skip where there is none).
inline Device theGpu() { return unwrap(detectCudaDevice()); }

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    if (auto gpu = detectCudaDevice(); !gpu)                                                       \
      GTEST_SKIP() << llvm::toString(gpu.takeError());                                             \
  } while (0)

/// The tiny model's training program (or its generation step with a KV cache) as the GPU
/// compiles it.
inline std::unique_ptr<Graph> tinyGpuProgram(const std::string &recipe, GPTOutput output = GPTOutput::Loss,
                                             const char *model = "models/tiny.yaml", int64_t length = 0) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  auto graph = unwrap(buildGPT(c, 4, output, length));
  if (!graph)
    return nullptr;
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision = c.precision; // under fp8 every linear layer but the head FP8
  options.passOptions.precision.recipe = *parseRecipe(recipe);
  bool training = output == GPTOutput::Loss;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(training, *parseRecipe(recipe)), options));
  EXPECT_FALSE(bool(pipeline.run(*graph)));
  return graph;
}

/// A generation step's case, "fp32", "bf16", "llama-fp32" or "llama-bf16" (the Llama block: RoPE
/// at each position, two KV heads for four query heads), and its bound on the logits against
/// the CPU, relative to their largest.
struct GpuDecodeCase {
  const char *model = "models/tiny.yaml";
  std::string recipe;
  double bound = 1e-5;
};
inline GpuDecodeCase gpuDecodeCase(llvm::StringRef param) {
  GpuDecodeCase c;
  c.recipe = param.str();
  if (param.consume_front("llama-")) {
    c.model = "models/llama-tiny.yaml";
    c.recipe = param.str();
  }
  // BF16: the GPU rounds some intermediates the CPU keeps in fp32 (StorageRules' rounding rules),
  // within BF16's rounding each; the Llama block's two SwiGLU layers and rotations compound them
  // to 1.1% of the logits' scale at worst (measured on the H200), GPT-2's to 1.03%
  // (TGC_TEST_SEED=783532246 on the H100 and the H200; ten other seeds under 1%).
  if (c.recipe == "bf16")
    c.bound = c.model == std::string("models/tiny.yaml") ? 1.2e-2 : 2e-2;
  return c;
}
inline auto gpuDecodeCases() { return testing::Values("fp32", "bf16", "llama-fp32", "llama-bf16"); }
inline std::string gpuDecodeCaseName(const testing::TestParamInfo<std::string> &info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

/// Upper bound (exclusive) for the integer operand `i` of `op`.
inline int64_t intBound(const Op &op, unsigned i) {
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

inline Tensor randomOperand(const Op &op, unsigned i, Rng &rng) {
  Tensor t = Tensor::zeros(op.operand(i)->type());
  for (float &v : t.data)
    v = float(rng.normal());
  bool scalarStep = t.type.rank() == 0 && !isFloat(t.type.dtype);
  // The generation ops' positions: rows of the cache [B, T, D], leaving kv_write room for
  // its S rows, and decode_attention for its S queries (a rotation's table ends at T).
  bool position = (op.kind() == OpKind::KvWrite || op.kind() == OpKind::DecodeAttention) && i == 3;
  int64_t rows = op.kind() == OpKind::KvWrite ? op.operand(0)->type().dim(1) - op.operand(2)->type().dim(1) + 1
                 : op.kind() == OpKind::DecodeAttention ? op.operand(1)->type().dim(1) - op.result(0)->type().dim(1) + 1
                                                        : 0;
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

inline bool isLayerNormFused(OpKind kind) {
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
inline void expectFp8OfGeluMatches(const Tensor &want, const Tensor &got) {
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


/// `op` alone in `single`, its operands as inputs (whose values go into `inputs`):
/// attention_backward's out and lse (and with head_major, its head-major q, k, v) are what the
/// forward made of a packed qkv, a random input; an FP8 operand comes from a quantize of a
/// random f32 input at a random scale. Returns the copy of `op`, or null (with a failure).
inline Op *singleOpProgram(const Op &opRef, Rng &rng, Graph &single, std::map<std::string, Tensor> &inputs) {
  const Op *op = &opRef;
  Builder b(single);
  llvm::SmallVector<Value *, 8> operands;
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
    setFp8Format(attrs, type.dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3);
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
    if (!forward) {
      ADD_FAILURE() << "no attention forward for the gradient";
      return nullptr;
    }
    if (headMajor)
      operands[1] = forward->result(2);
    operands.append({forward->result(0), forward->result(1)});
  }
  Op *copy = b.createOp(op->kind(), operands, op->attrs(), "out");
  if (auto err = b.takeError()) {
    ADD_FAILURE() << llvm::toString(std::move(err));
    return nullptr;
  }
  return copy;
}

/// The GPU's results `got` of `op`'s copy `copy` against the CPU's `want`, within the bound of
/// the op's arithmetic (`expanded`: run as expand-layernorm-fused lowers it).
inline void expectOpResultsMatch(const Op *op, const Op *copy, const std::vector<Tensor> &want,
                                 const std::vector<Tensor> &got, bool expanded) {
  bool geluQuantize = op->kind() == OpKind::Quantize && quantizeOptions(op->attrs()).activation != QuantizeActivation::None;
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
}

/// Every op of `program` alone on the GPU against the CPU, on fresh random operands; `checked`
/// counts them. A LayerNorm+Linear/MLP op (or gradient) runs on the GPU as expand-layernorm-fused
/// lowers it; `onlyLayerNormFused` restricts the ops to those.
inline void expectEveryOpMatchesTheCpu(const Graph *program, int &checked, bool onlyLayerNormFused = false,
                                       const std::function<bool(const Op &)> &selected = nullptr) {
  Rng rng(freshSeed());
  for (const Op *op : program->ops()) {
    if (isLeaf(op->kind()) || hasSideEffects(op->kind()) ||
        (onlyLayerNormFused && !isLayerNormFused(op->kind())) || (selected && !selected(*op)))
      continue;
    Graph single("op");
    std::map<std::string, Tensor> inputs;
    Op *copy = singleOpProgram(*op, rng, single, inputs);
    ASSERT_TRUE(copy);
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
    expectOpResultsMatch(op, copy, want, got, expanded);
    ++checked;
  }
}

/// The largest difference between `got` and `want`, and the largest magnitude in `want` (what
/// the tests' bounds are relative to).
struct Gap {
  double worst = 0, scale = 0;
};
inline Gap gapOf(const std::vector<float> &want, const std::vector<float> &got) {
  Gap gap;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    gap.scale = std::max(gap.scale, double(std::fabs(want[i])));
    gap.worst = std::max(gap.worst, double(std::fabs(got[i] - want[i])));
  }
  return gap;
}

/// Runs `graph` on the CPU interpreter and on the GPU from the same leaves; `want` and `got` get
/// their outputs (left empty, with a test failure, where either fails).
inline void runOnBoth(const Graph &graph, const std::map<std::string, Tensor> &leaves, std::vector<Tensor> &want,
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
inline void expectWithinBf16(const char *what, const std::vector<Tensor> &want, const std::vector<Tensor> &got) {
  for (size_t r = 0; r < got.size() && r < want.size(); ++r) {
    Gap gap = gapOf(want[r].data, got[r].data);
    std::printf("%s, result %zu: max difference %.3g at scale %.3g\n", what, r, gap.worst, gap.scale);
    EXPECT_LE(gap.worst, 1e-2 * gap.scale) << "result " << r << ": max difference " << gap.worst;
  }
}

} // namespace tgc::test
