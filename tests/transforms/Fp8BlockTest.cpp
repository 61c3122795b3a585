// FP8 block scaling (Transformer Engine's Float8BlockScaling) on the CPU reference: the
// power-of-two block scales, the quantize in 1 x 128 and 128 x 128 blocks and its transposes,
// the shape rules, the recipe's choices and a model trained with it against fp32.
#include "app/Checkpoint.h"
#include "app/Trainer.h"
#include "backends/cpu/Fp8Scaling.h"
#include "backends/cpu/Interpreter.h"
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "ir/Attributes.h"
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "support/Random.h"
#include "transforms/Pass.h"
#include "transforms/precision/Precision.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

/// What quantize {scaling="block", block_rows=R, transpose=true} of x [rows, cols] gives on the
/// interpreter: q and q's transpose as the GEMMs read them, {max |x|, the largest block scale},
/// and the count of values flushed to zero.
struct BlockQuantized {
  std::vector<float> q, qt, amax;
  float flushed = -1;
};
BlockQuantized quantizeBlocksWithStats(const std::vector<float> &x, int64_t rows, int64_t cols, int64_t blockRows) {
  auto g = unwrap(parseGraph(
      fmt::format("graph @q\n%x = input() : f32[{0},{1}]\n%s = input() : f32[]\n%si = input() : f32[]\n"
                  "%q, %amax, %flushed, %qt = quantize(%x, %s, %si) {{block_rows={2}, format=\"e4m3\", "
                  "scaling=\"block\", transpose=true}} : f8e4m3[{0},{1}], f32[2], f32[], f8e4m3[{1},{0}]\n"
                  "return %q, %qt, %amax, %flushed\n",
                  rows, cols, blockRows),
      "q.ir"));
  if (!g)
    return {};
  Interpreter interp(*g);
  EXPECT_FALSE(bool(interp.bind("x", Tensor{TensorType(DType::F32, {rows, cols}), x, {}})));
  for (const char *s : {"s", "si"}) // the state's scale: block scaling does not read it
    EXPECT_FALSE(bool(interp.bind(s, Tensor{TensorType(DType::F32, {}), {1e6f}, {}})));
  auto out = unwrap(interp.run());
  return {out[0].data, out[1].data, out[2].data, out[3].data[0]};
}
std::pair<std::vector<float>, std::vector<float>> quantizeBlocks(const std::vector<float> &x, int64_t rows,
                                                                 int64_t cols, int64_t blockRows) {
  BlockQuantized b = quantizeBlocksWithStats(x, rows, cols, blockRows);
  return {b.q, b.qt};
}

/// The tiny model with sides of 128 (d_model 128, ffn 256, 4 x 32 tokens): every linear layer
/// legal for block scaling, the head too.
ModelConfig blockModel(Recipe recipe) {
  ModelConfig config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  config.dModel = 128;
  config.ffn = 256;
  config.heads = 2;
  config.vocab = 128;
  config.train.batch = 4;
  config.train.steps = 10;
  config.precision.keepBf16.clear();
  config.precision.fp8MinDim = 0;
  config.precision.recipe = recipe;
  config.precision.fp8Scaling = Fp8Scaling::Block;
  return config;
}

/// Whether v is within E4M3's half-ulp (2^-4 relative) of x, as a normal value rounds.
bool closeInE4M3(float v, float x) { return std::fabs(v - x) <= std::fabs(x) * 0.0625f; }

} // namespace

TEST(BlockScaling, ScalesArePowersOfTwoAtOrBelowMaxOverAmax) {
  EXPECT_EQ(blockScale(448.0f, Fp8Format::E4M3), 1.0f);
  EXPECT_EQ(blockScale(1.0f, Fp8Format::E4M3), 256.0f);    // 448 rounds down to 256
  EXPECT_EQ(blockScale(3.5f, Fp8Format::E4M3), 128.0f);    // 448 / 3.5 = 128 exactly
  EXPECT_EQ(blockScale(3.6f, Fp8Format::E4M3), 64.0f);     // 124.4 -> 64
  EXPECT_EQ(blockScale(1.0f, Fp8Format::E5M2), 32768.0f);  // 57344 -> 2^15
  EXPECT_EQ(blockScale(1000.0f, Fp8Format::E4M3), 0.25f);  // 0.448 -> 2^-2
  EXPECT_EQ(blockScale(1e-40f, Fp8Format::E4M3), std::ldexp(1.0f, 127)); // FLT_MAX's power of two
  for (float amax : {0.0f, INFINITY, NAN})
    EXPECT_EQ(blockScale(amax, Fp8Format::E4M3), 1.0f) << amax;
}

TEST(BlockScaling, EachOneBy128BlockKeepsItsOwnPrecisionAndTheTransposeIsQuantizedAgain) {
  // Rows of magnitudes 2^0, 2^-6, ..., 2^-42 (by row mod 8), columns 0-127 and 128-255 a further
  // 2^12 apart: one scale a tensor flushes most of it; each 1 x 128 block keeps E4M3's precision.
  const int64_t rows = 128, cols = 256;
  std::vector<float> x(rows * cols);
  Rng rng(freshSeed());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = float(rng.uniform() - 0.5) * std::ldexp(1.0f, -6 * int(r % 8) - (c >= 128 ? 12 : 0));
  auto [q, qt] = quantizeBlocks(x, rows, cols, 1);
  ASSERT_EQ(q.size(), x.size());
  int64_t rowwiseOff = 0, transposedOff = 0, differ = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float v = x[r * cols + c];
      rowwiseOff += !closeInE4M3(q[r * cols + c], v);
      // q^T's blocks run down the columns (128 rows of mixed magnitudes): the small rows flush.
      transposedOff += !closeInE4M3(qt[c * rows + r], v);
      differ += qt[c * rows + r] != q[r * cols + c];
    }
  // Each 1 x 128 block's values keep E4M3's precision, but for those E4M3's subnormals take
  // (below 2^-6 of the block's largest).
  int64_t subnormal = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols; b += 128) {
      float amax = 0;
      for (int64_t c = b; c < b + 128; ++c)
        amax = std::fmax(amax, std::fabs(x[r * cols + c]));
      for (int64_t c = b; c < b + 128; ++c)
        subnormal += std::fabs(x[r * cols + c]) * blockScale(amax, Fp8Format::E4M3) < std::ldexp(1.0f, -6);
    }
  EXPECT_LE(rowwiseOff, subnormal);
  EXPECT_LT(subnormal, rows * cols / 50);
  EXPECT_GT(transposedOff, rows * cols / 2);
  EXPECT_GT(differ, rows * cols / 2);
  // The transpose is x^T quantized in its own 1 x 128 blocks.
  std::vector<float> xt(x.size()), expected(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      xt[c * rows + r] = x[r * cols + c];
  blockQuantize(xt.data(), cols, rows, 1, Fp8Format::E4M3, expected.data());
  EXPECT_EQ(qt, expected);
}

TEST(BlockScaling, A128By128BlockSharesOneScaleAndItsTransposeIsQsTransposed) {
  // Row 1 is 2^-20 of row 0, in the same 128 x 128 block: it takes row 0's scale and flushes; in
  // the next row block (rows 128-255) the same small values have a block of their own.
  const int64_t rows = 256, cols = 128;
  std::vector<float> x(rows * cols);
  for (int64_t c = 0; c < cols; ++c) {
    x[0 * cols + c] = 1.0f + float(c) / 128.0f;
    x[1 * cols + c] = (1.0f + float(c) / 128.0f) * std::ldexp(1.0f, -20);
    x[129 * cols + c] = x[1 * cols + c];
  }
  auto [q, qt, amax, flushedCount] = quantizeBlocksWithStats(x, rows, cols, 128);
  ASSERT_EQ(q.size(), x.size());
  int64_t flushed = 0;
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_TRUE(closeInE4M3(q[c], x[c])) << c;
    EXPECT_TRUE(closeInE4M3(q[129 * cols + c], x[129 * cols + c])) << c;
    flushed += q[cols + c] == 0.0f;
  }
  // Row 1 (about 2^-13 once scaled by 2^7, below E4M3's half-smallest 2^-10) is flushed whole,
  // and the op counts it; the block of rows 128-255 takes 448 / 1.99 * 2^20 rounded down, 2^27,
  // the largest block scale (the first block's is 2^7: its amax is max |x|).
  EXPECT_EQ(flushed, cols);
  EXPECT_EQ(flushedCount, float(cols));
  ASSERT_EQ(amax.size(), 2u);
  EXPECT_EQ(amax[0], 1.0f + 127.0f / 128.0f);
  EXPECT_EQ(amax[1], std::ldexp(1.0f, 27));
  EXPECT_EQ(blockScale(amax[0], Fp8Format::E4M3), std::ldexp(1.0f, 7));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(qt[c * rows + r], q[r * cols + c]) << r << ", " << c;
}

TEST(BlockScaling, ShapesAndAttributesAreChecked) {
  auto parse = [](const std::string &shape, const std::string &attrs) {
    return parseGraph(fmt::format("graph @q\n%x = input() : f32[{0}]\n%s = input() : f32[]\n%si = input() : f32[]\n"
                                  "%q, %amax, %sat = quantize(%x, %s, %si) {{format=\"e4m3\", scaling=\"block\"{1}}} "
                                  ": f8e4m3[{0}], f32[2], f32[]\nreturn %q\n",
                                  shape, attrs),
                      "q.ir");
  };
  EXPECT_TRUE(bool(parse("3,256", ", block_rows=1")));
  EXPECT_TRUE(bool(parse("2,64,128", ", block_rows=128")));
  struct Bad {
    const char *shape, *attrs, *message;
  } bads[] = {
      {"4,100", ", block_rows=1", "last dimension that is a multiple of 128, got f32[4,100]"},
      {"3,128", ", block_rows=128", "128 x 128 blocks needs a row count that is a multiple of 128, got 3 rows"},
      {"4,128", ", block_rows=64", "'block_rows' must be 1 or 128, got 64"},
      {"4,128", "", "block_rows"},
      {"4,128", ", block_rows=1, margin=0", "no 'margin'"},
  };
  for (const Bad &bad : bads) {
    auto g = parse(bad.shape, bad.attrs);
    ASSERT_FALSE(bool(g)) << bad.shape << bad.attrs;
    std::string message = llvm::toString(g.takeError());
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
  }
}

TEST(BlockScaling, TheRecipeNeedsSidesOf128ExceptTheRowsOfAForwardOnlyProduct) {
  PrecisionConfig config;
  config.recipe = Recipe::Fp8;
  config.fp8Scaling = Fp8Scaling::Block;
  EXPECT_TRUE(chooseGemmPrecision(config, "h0.mlp.fc1", 256, 128, 384).fp8);
  GemmChoice narrow = chooseGemmPrecision(config, "h0.mlp.fc1", 256, 128, 400);
  EXPECT_FALSE(narrow.fp8);
  EXPECT_EQ(narrow.reason, "K=128 or N=400 is not a multiple of 128 (block scaling's blocks)");
  EXPECT_FALSE(chooseGemmPrecision(config, "h0.mlp.fc1", 200, 128, 384).fp8);
  config.forwardOnly = true; // no weight gradient: any row count
  EXPECT_TRUE(chooseGemmPrecision(config, "h0.mlp.fc1", 200, 128, 384).fp8);
}

TEST(BlockScaling, AModelTrainsWithItNearFp32AndEveryWgradReadsOperandsQuantizedAlongTheRows) {
  ModelConfig config = blockModel(Recipe::Fp8);
  std::vector<double> losses[2];
  for (int run = 0; run < 2; ++run) {
    ModelConfig c = blockModel(run ? Recipe::Fp8 : Recipe::Fp32);
    auto trainer = unwrap(Trainer::create(c));
    ASSERT_TRUE(trainer);
    for (int64_t i = 0; i < c.train.steps; ++i)
      losses[run].push_back(unwrap(trainer->step()).loss);
  }
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_NEAR(losses[1][i], losses[0][i], 0.01 * losses[0][i]) << "step " << i + 1;
  EXPECT_NE(losses[1], losses[0]);
  // The program: each FP8 product in the TN layout, reading quantizes' q or q^T (legalize-fp8-gemm
  // in the CPU's pipeline under block scaling).
  PipelineOptions options;
  options.passOptions.train = config.train;
  options.passOptions.precision = config.precision;
  auto graph = unwrap(buildGPT(config, config.train.batch));
  std::vector<std::string> passes = cpuPipeline(true, config.precision);
  EXPECT_TRUE(llvm::is_contained(passes, "legalize-fp8-gemm"));
  config.precision.fp8Scaling = Fp8Scaling::Delayed; // per-tensor transposes change no bit: left out
  EXPECT_FALSE(llvm::is_contained(cpuPipeline(true, config.precision), "legalize-fp8-gemm"));
  ASSERT_FALSE(bool(unwrap(PassPipeline::create(passes, options)).run(*graph)));
  int fp8Gemms = 0;
  for (const Op *op : graph->ops()) {
    if (op->kind() != OpKind::MatMul || !isFp8(op->operand(0)->type().dtype))
      continue;
    ++fp8Gemms;
    MatMulLayout layout = matmulLayout(op->attrs());
    EXPECT_TRUE(!layout.transposeA && layout.transposeB) << op->result()->name();
  }
  EXPECT_EQ(fp8Gemms, 3 * (4 * config.layers + 1)); // forward, dgrad and wgrad of each linear layer
  // The GPU's program: fc2's input quantize applies the GELU as it reads fc1's output, and fc1's
  // output gradient quantize the GELU's gradient, summing fc1's bias gradient
  // (fuse-gelu-quantize); qkv's output gradient quantize sums qkv's bias gradient
  // (fuse-quantize-bias-grad; the norms' gradients sum proj's and fc2's); every one lowered, its
  // GEMMs over block scales and adding their biases in the epilogue (fuse-fp8-bias).
  auto gpu = unwrap(buildGPT(config, config.train.batch));
  options.passOptions.precision = config.precision;
  options.passOptions.precision.fp8Scaling = Fp8Scaling::Block;
  ASSERT_FALSE(bool(unwrap(PassPipeline::create(gpuPipeline(true, Recipe::Fp8, Fp8Scaling::Block), options)).run(*gpu)));
  int blockQuantizes = 0, geluQuantizes = 0, geluGradientQuantizes = 0, biasGradients = 0, biasEpilogues = 0;
  for (const Op *op : gpu->ops()) {
    EXPECT_NE(op->kind(), OpKind::Gelu) << op->result()->name();
    biasEpilogues += op->kind() == OpKind::MatMulBias;
    if (op->kind() == OpKind::Quantize) {
      QuantizeOptions q = quantizeOptions(op->attrs());
      geluQuantizes += q.activation == QuantizeActivation::Gelu;
      geluGradientQuantizes += q.activation == QuantizeActivation::GeluBackward;
      biasGradients += q.biasGrad;
      EXPECT_TRUE(q.blockScaling) << op->result()->name();
      EXPECT_TRUE(!q.biasGrad || q.transpose) << op->result()->name();
      ++blockQuantizes;
    }
  }
  EXPECT_EQ(blockQuantizes, 3 * (4 * config.layers + 1));
  EXPECT_EQ(geluQuantizes, config.layers);
  EXPECT_EQ(geluGradientQuantizes, config.layers);
  EXPECT_EQ(biasGradients, 2 * config.layers);
  EXPECT_EQ(biasEpilogues, 4 * config.layers);
  EXPECT_TRUE(bool(lowerToCuda(*gpu)));
}

TEST(BlockScaling, AResumedRunContinuesBitForBit) {
  auto train = [](Trainer &t, int steps) {
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i)
      losses.push_back(unwrap(t.step()).loss);
    return losses;
  };
  auto straight = unwrap(Trainer::create(blockModel(Recipe::Fp8)));
  ASSERT_TRUE(straight);
  std::vector<double> all = train(*straight, 4);
  auto first = unwrap(Trainer::create(blockModel(Recipe::Fp8)));
  ASSERT_TRUE(first);
  train(*first, 2);
  llvm::SmallString<128> file;
  llvm::sys::fs::createUniquePath("tgc-test-%%%%%%-block-resume.safetensors", file, /*MakeAbsolute=*/true);
  std::string path = file.str().str();
  ASSERT_FALSE(bool(writeCheckpoint(path, unwrap(first->checkpoint()))));
  auto second = unwrap(Trainer::create(blockModel(Recipe::Fp8)));
  ASSERT_TRUE(second);
  ASSERT_FALSE(bool(second->resume(unwrap(readCheckpoint(path)), path)));
  EXPECT_EQ(train(*second, 2), std::vector<double>(all.begin() + 2, all.end()));
  Checkpoint a = unwrap(straight->checkpoint()), b = unwrap(second->checkpoint());
  for (const auto &[name, t] : a.tensors)
    EXPECT_EQ(t.data, b.tensors.at(name).data) << name;
  llvm::sys::fs::remove(path);
}
