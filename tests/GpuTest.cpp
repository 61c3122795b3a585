// The GPU backend against the CPU interpreter: every generated kernel and GEMM of the tiny
// model's training program on fresh random inputs (results poisoned with NaN first, so that an
// unwritten element fails), and fp32 training parity. Skipped where there is no GPU.
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "passes/Pass.h"
#include "runtime/CudaExecutor.h"
#include "runtime/Generate.h"
#include "runtime/Interpreter.h"
#include "runtime/Random.h"
#include "runtime/Trainer.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    std::string why;                                                                               \
    if (!cudaAvailable(&why))                                                                      \
      GTEST_SKIP() << "no GPU: " << why;                                                           \
  } while (0)

std::unique_ptr<Graph> tinyGpuProgram(const std::string &recipe) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(c, 4));
  if (!graph)
    return nullptr;
  PipelineOptions options;
  options.passOptions.train = c.train;
  options.passOptions.precision.recipe = recipe;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/true), options));
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
  for (int32_t &v : t.ints)
    v = scalarStep ? int32_t(1 + rng.below(20)) : int32_t(rng.below(intBound(op, i)));
  // AdamW reads a second moment (>= 0), a learning rate and a clip factor in (0, 1].
  if (op.kind() == OpKind::AdamW && i == 3)
    for (float &v : t.data)
      v = std::fabs(v);
  if (op.kind() == OpKind::AdamW && (i == 4 || i == 5))
    t.data[0] = i == 4 ? 1e-3f : 0.5f;
  if (op.kind() == OpKind::ClipScale)
    t.data[0] = std::fabs(t.data[0]) * 10;
  return t;
}

class GpuKernels : public testing::TestWithParam<std::string> {};

TEST_P(GpuKernels, EveryOpOfTheTinyTrainingProgramMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  auto program = tinyGpuProgram(GetParam());
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  int checked = 0;
  for (const Op *op : program->ops()) {
    if (isLeaf(op->kind()) || hasSideEffects(op->kind()))
      continue;
    // The op alone, its operands as inputs.
    Graph single("op");
    Builder b(single);
    std::map<std::string, Tensor> inputs;
    llvm::SmallVector<Value *, 8> operands;
    for (unsigned i = 0; i < op->numOperands(); ++i) {
      std::string name = "in" + std::to_string(i);
      operands.push_back(b.input(name, op->operand(i)->type()));
      inputs[name] = randomOperand(*op, i, rng);
    }
    Op *copy = b.createOp(op->kind(), operands, op->attrs(), "out");
    ASSERT_FALSE(bool(b.takeError()));
    for (unsigned r = 0; r < copy->numResults(); ++r)
      single.addOutput(copy->result(r));
    SCOPED_TRACE(printOp(*copy));
    Interpreter cpu(single);
    ASSERT_FALSE(bool(cpu.bindAll(inputs)));
    auto want = unwrap(cpu.run());
    CudaOptions options;
    options.poisonResults = true;
    auto gpu = unwrap(createCudaExecutor(single, options));
    ASSERT_TRUE(gpu);
    ASSERT_FALSE(bool(gpu->bindAll(inputs)));
    auto got = unwrap(gpu->run());
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < want.size(); ++r) {
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
      EXPECT_LE(worst, 1e-5 * scale + 1e-6) << "result " << r << ": max difference " << worst
                                            << " at scale " << scale;
    }
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuKernels, testing::Values("fp32", "bf16"));

std::vector<double> losses(Device device, int steps) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml")));
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
  std::vector<double> cpu = losses(Device::Cpu, 20), gpu = losses(Device::Cuda, 20);
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * cpu[i]) << "step " << i + 1;
}

TEST(GpuTraining, SeedModelLearnsInBf16) {
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/seed.yaml")));
  c.precision.recipe = "bf16";
  auto trainer = unwrap(Trainer::create(c, "", Device::Cuda));
  ASSERT_TRUE(trainer);
  for (int64_t i = 0; i < c.train.steps; ++i)
    ASSERT_TRUE(bool(unwrap(trainer->step()).step));
  Checkpoint checkpoint = unwrap(trainer->checkpoint());
  auto generator = unwrap(Generator::create(c, checkpoint.tensors, 64, Device::Cuda));
  ASSERT_TRUE(generator);
  EvalResult result = unwrap(evaluateArithmetic(*generator, c, 64, 8, 64));
  EXPECT_GE(result.tokenAccuracy(), 0.99) << result.correctTokens << " of " << result.tokens;
}

TEST(GpuTraining, SameSeedSameLossesBitForBit) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(losses(Device::Cuda, 5), losses(Device::Cuda, 5));
}

} // namespace
