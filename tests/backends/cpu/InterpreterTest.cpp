// Interpreter ops against plain loops on random inputs, and the arithmetic data stream.
#include "ir/Parser.h"
#include "models/GPTBuilder.h"
#include "driver/Program.h"
#include "app/Data.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

#include <cmath>
#include <fstream>
#include <cstring>
#include <set>

#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

Tensor randomTensor(const TensorType &type, Rng &rng) {
  Tensor t = Tensor::zeros(type);
  for (float &v : t.data)
    v = float(rng.normal());
  return t;
}

/// Runs a one-op graph given as IR text with the inputs bound by name.
std::vector<Tensor> runText(const std::string &text, std::map<std::string, Tensor> inputs) {
  auto graph = unwrap(parseGraph(text, "test.ir"));
  if (!graph)
    return {};
  Interpreter interp(*graph);
  EXPECT_FALSE(bool(interp.bindAll(inputs)));
  return unwrap(interp.run());
}

/// Runs a program and the fused program that replaces it on the same inputs; every result must
/// be the same, bit for bit. Returns the fused program's results.
std::vector<Tensor> expectSameBits(const std::string &separateText, const std::string &fusedText,
                                   const std::map<std::string, Tensor> &inputs) {
  auto separate = runText(separateText, inputs), fused = runText(fusedText, inputs);
  EXPECT_EQ(separate.size(), fused.size());
  EXPECT_FALSE(fused.empty());
  for (size_t r = 0; r < std::min(separate.size(), fused.size()); ++r)
    EXPECT_EQ(separate[r].data, fused[r].data) << "result " << r;
  return fused;
}

TEST(Interpreter, MatMulAllTransposesAndBatchings) {
  Rng rng(42);
  const int64_t B = 3, M = 5, K = 7, N = 4;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool sharedB : {false, true}) {
        SCOPED_TRACE(testing::Message() << "ta=" << ta << " tb=" << tb << " shared=" << sharedB);
        TensorType aType(DType::F32, ta ? Shape{B, K, M} : Shape{B, M, K});
        Shape bShape = tb ? Shape{N, K} : Shape{K, N};
        if (!sharedB)
          bShape.insert(bShape.begin(), B);
        TensorType bType(DType::F32, bShape);
        std::string text = "graph @g\n%a = input() : " + aType.str() + "\n%b = input() : " +
                           bType.str() + "\n%c = matmul(%a, %b) {transpose_a=" +
                           (ta ? "true" : "false") + ", transpose_b=" + (tb ? "true" : "false") +
                           "} : f32[3,5,4]\nreturn %c\n";
        Tensor a = randomTensor(aType, rng), b = randomTensor(bType, rng);
        auto out = runText(text, {{"a", a}, {"b", b}});
        ASSERT_EQ(out.size(), 1u);
        for (int64_t n = 0; n < B; ++n)
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double want = 0;
              for (int64_t k = 0; k < K; ++k) {
                double av = a.data[n * M * K + (ta ? k * M + i : i * K + k)];
                int64_t bBase = sharedB ? 0 : n * K * N;
                double bv = b.data[bBase + (tb ? j * K + k : k * N + j)];
                want += av * bv;
              }
              EXPECT_NEAR(out[0].data[(n * M + i) * N + j], want, 1e-5 * (1 + std::abs(want)));
            }
      }
}

/// The CPU GEMM's arithmetic for one output, as CpuKernels.cpp documents it: 32 partial sums
/// (products added in fp32, no FMA), combined pairwise in a fixed order.
float dotOf32Lanes(const std::vector<float> &a, const std::vector<float> &b) {
  float acc[32] = {};
  for (size_t i = 0; i < a.size(); ++i)
    acc[i % 32] += a[i] * b[i];
  for (int width = 16; width > 0; width /= 2)
    for (int j = 0; j < width; ++j)
      acc[j] += acc[j + width];
  return acc[0];
}

TEST(Interpreter, MatMulOutputsAreTheDocumentedDotProductBitForBit) {
  // Whatever the kernel (one output at a time, four at a time, either SIMD clone, any thread
  // count), every output is the same function of its row and column: the CPU reference's bits
  // do not depend on how the GEMM is blocked. K = 300 has a tail after the 32-lane blocks; N = 70
  // leaves outputs that the four-at-a-time kernel does not cover.
  Rng rng(freshSeed());
  const int64_t M = 37, K = 300, N = 70;
  Tensor a = randomTensor(TensorType(DType::F32, {M, K}), rng);
  Tensor b = randomTensor(TensorType(DType::F32, {N, K}), rng);
  auto out = runText("graph @g\n%a = input() : f32[37,300]\n%b = input() : f32[70,300]\n"
                     "%c = matmul(%a, %b) {transpose_b=true} : f32[37,70]\nreturn %c\n",
                     {{"a", a}, {"b", b}});
  ASSERT_EQ(out.size(), 1u);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      std::vector<float> row(a.data.begin() + i * K, a.data.begin() + (i + 1) * K);
      std::vector<float> column(b.data.begin() + j * K, b.data.begin() + (j + 1) * K);
      float want = dotOf32Lanes(row, column), got = out[0].data[i * N + j];
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "output " << i << ", " << j << ": " << got << " against " << want;
    }
}

TEST(Interpreter, TransposeMatchesIndexFormula) {
  Rng rng(1);
  TensorType xType(DType::F32, {2, 3, 4, 5});
  Tensor x = randomTensor(xType, rng);
  auto out = runText("graph @g\n%x = input() : f32[2,3,4,5]\n"
                     "%y = transpose(%x) {perm=[2,0,3,1]} : f32[4,2,5,3]\nreturn %y\n",
                     {{"x", x}});
  ASSERT_EQ(out.size(), 1u);
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 5; ++d)
          EXPECT_EQ(out[0].data[((c * 2 + a) * 5 + d) * 3 + b], x.data[((a * 3 + b) * 4 + c) * 5 + d]);
}

TEST(Interpreter, SliceAddBroadcastAndScale) {
  Rng rng(2);
  Tensor x = randomTensor(TensorType(DType::F32, {2, 3, 6}), rng);
  Tensor bias = randomTensor(TensorType(DType::F32, {2}), rng);
  auto out = runText("graph @g\n%x = input() : f32[2,3,6]\n%bias = input() : f32[2]\n"
                     "%s = slice(%x) {axis=2, size=2, start=3} : f32[2,3,2]\n"
                     "%y = add(%s, %bias) : f32[2,3,2]\n"
                     "%z = scale(%y) {factor=-0.5} : f32[2,3,2]\nreturn %z\n",
                     {{"x", x}, {"bias", bias}});
  ASSERT_EQ(out.size(), 1u);
  for (int r = 0; r < 6; ++r)
    for (int j = 0; j < 2; ++j)
      EXPECT_FLOAT_EQ(out[0].data[r * 2 + j], -0.5f * (x.data[r * 6 + 3 + j] + bias.data[j]));
}

// A norm gradient given dres (fuse-norm-grad-add) is the norm gradient plus dres, bit for bit the
// add it replaces, for LayerNorm and RMSNorm; dgamma and dbeta do not change.
TEST(Interpreter, NormGradientWithTheResidualGradientIsTheAddItReplaces) {
  Rng rng(3);
  TensorType rows(DType::F32, {2, 5, 12}), features(DType::F32, {12});
  std::map<std::string, Tensor> inputs = {{"dy", randomTensor(rows, rng)},
                                          {"x", randomTensor(rows, rng)},
                                          {"dres", randomTensor(rows, rng)},
                                          {"g", randomTensor(features, rng)}};
  for (const char *kind : {"layer_norm_backward", "rms_norm_backward"}) {
    bool layer = llvm::StringRef(kind) == "layer_norm_backward";
    std::string types = layer ? "f32[2,5,12], f32[12], f32[12]" : "f32[2,5,12], f32[12]";
    std::string header = "graph @g\n%dy = input() : f32[2,5,12]\n%x = input() : f32[2,5,12]\n"
                         "%dres = input() : f32[2,5,12]\n%g = input() : f32[12]\n";
    std::string grads = layer ? "%dg, %db" : "%dg";
    SCOPED_TRACE(kind);
    auto fused = expectSameBits(
        header + fmt::format("%dx, {} = {}(%dy, %x, %g) {{eps=1e-05}} : {}\n", grads, kind, types) +
            "%sum = add(%dres, %dx) : f32[2,5,12]\nreturn %sum, " + grads + "\n",
        header + fmt::format("%sum, {} = {}(%dy, %x, %g, %dres) {{eps=1e-05}} : {}\n", grads, kind, types) +
            "return %sum, " + grads + "\n",
        inputs);
    ASSERT_FALSE(fused.empty());
    // And the sum is not dres alone: the gradient is there.
    EXPECT_NE(fused[0].data, inputs["dres"].data);
  }
}

// gelu_backward with bias_grad (fuse-gelu-bias-grad) gives the same dx and, bit for bit, the
// column sums reduce_to takes of it.
TEST(Interpreter, GeluGradientWithTheBiasGradientIsTheReduceItReplaces) {
  Rng rng(4);
  TensorType rows(DType::F32, {3, 7, 20});
  std::map<std::string, Tensor> inputs = {{"dy", randomTensor(rows, rng)}, {"x", randomTensor(rows, rng)}};
  std::string header = "graph @g\n%dy = input() : f32[3,7,20]\n%x = input() : f32[3,7,20]\n";
  auto fused = expectSameBits(header + "%dx = gelu_backward(%dy, %x) : f32[3,7,20]\n"
                                        "%db = reduce_to(%dx) {shape=[20]} : f32[20]\nreturn %dx, %db\n",
                               header + "%dx, %db = gelu_backward(%dy, %x) {bias_grad=true} : f32[3,7,20], f32[20]\n"
                                        "return %dx, %db\n",
                               inputs);
  ASSERT_EQ(fused.size(), 2u);
  double column0 = 0;
  for (int r = 0; r < 21; ++r)
    column0 += fused[0].data[r * 20];
  EXPECT_EQ(fused[1].data[0], float(column0));
}

// cross_entropy given dloss (fuse-cross-entropy-grad) returns the loss and, bit for bit,
// cross_entropy_backward's dlogits.
TEST(Interpreter, CrossEntropyWithItsGradientIsTheTwoOpsItReplaces) {
  Rng rng(5);
  Tensor targets = Tensor::zeros(TensorType(DType::I32, {2, 3}));
  for (size_t i = 0; i < targets.ints.size(); ++i)
    targets.ints[i] = int32_t((i * 7) % 11);
  std::map<std::string, Tensor> inputs = {{"logits", randomTensor(TensorType(DType::F32, {2, 3, 11}), rng)},
                                          {"targets", targets}};
  std::string header = "graph @g\n%logits = input() : f32[2,3,11]\n%targets = input() : i32[2,3]\n"
                       "%seed = constant() {value=0.5} : f32[]\n";
  auto fused = expectSameBits(header + "%loss = cross_entropy(%logits, %targets) : f32[]\n"
                                        "%dlogits = cross_entropy_backward(%seed, %logits, %targets) : f32[2,3,11]\n"
                                        "return %loss, %dlogits\n",
                               header + "%loss, %dlogits = cross_entropy(%logits, %targets, %seed) : f32[], f32[2,3,11]\n"
                                        "return %loss, %dlogits\n",
                               inputs);
  ASSERT_EQ(fused.size(), 2u);
  // Each row of the gradient sums to zero (softmax minus one-hot), scaled by 0.5 / 6.
  for (int r = 0; r < 6; ++r) {
    double sum = 0;
    for (int j = 0; j < 11; ++j)
      sum += fused[1].data[r * 11 + j];
    EXPECT_NEAR(sum, 0.0, 1e-6);
    EXPECT_LT(fused[1].data[r * 11 + targets.ints[r]], 0.0f);
  }
}

TEST(Interpreter, CausalSoftmaxRowsSumToOneAndIgnoreTheFuture) {
  Rng rng(3);
  Tensor x = randomTensor(TensorType(DType::F32, {2, 4, 4}), rng);
  auto out = runText("graph @g\n%x = input() : f32[2,4,4]\n"
                     "%m = causal_mask(%x) : f32[2,4,4]\n%p = softmax(%m) : f32[2,4,4]\n"
                     "%l = log_softmax(%x) : f32[2,4,4]\nreturn %p, %l\n",
                     {{"x", x}});
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < 8; ++r) {
    int query = r % 4;
    double sum = 0, max = -1e30, expSum = 0;
    for (int k = 0; k <= query; ++k)
      max = std::max(max, double(x.data[r * 4 + k]));
    for (int k = 0; k <= query; ++k)
      expSum += std::exp(x.data[r * 4 + k] - max);
    for (int k = 0; k < 4; ++k) {
      float p = out[0].data[r * 4 + k];
      sum += p;
      if (k > query) {
        EXPECT_EQ(p, 0.0f);
      } else {
        EXPECT_NEAR(p, std::exp(x.data[r * 4 + k] - max) / expSum, 1e-6);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
    double fullMax = *std::max_element(&x.data[r * 4], &x.data[r * 4 + 4]), full = 0;
    for (int k = 0; k < 4; ++k)
      full += std::exp(x.data[r * 4 + k] - fullMax);
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(out[1].data[r * 4 + k], x.data[r * 4 + k] - fullMax - std::log(full), 1e-5);
  }
}

TEST(Interpreter, OutOfVocabularyIdsAreErrorsNotCrashes) {
  auto graph = unwrap(parseGraph("graph @g\n%t = input() : f32[4,2]\n%ids = input() : i32[3]\n"
                                 "%e = embedding(%t, %ids) : f32[3,2]\nreturn %e\n",
                                 "t"));
  ASSERT_TRUE(graph);
  Interpreter interp(*graph);
  ASSERT_FALSE(bool(interp.bind("t", Tensor::zeros(TensorType(DType::F32, {4, 2})))));
  ASSERT_FALSE(bool(interp.bind("ids", Tensor{TensorType(DType::I32, {3}), {}, {0, 4, 1}})));
  std::string message = errorOf(interp.run());
  EXPECT_NE(message.find("token id 4 at position 1 is outside the vocabulary [0, 4)"),
            std::string::npos)
      << message;
}

TEST(Interpreter, BindChecksNamesAndTypes) {
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[2]\n%y = gelu(%x) : f32[2]\n"
                                 "return %y\n",
                                 "t"));
  ASSERT_TRUE(graph);
  Interpreter interp(*graph);
  EXPECT_NE(errorOf(interp.bind("nope", Tensor::zeros(TensorType(DType::F32, {2}))))
                .find("no input, parameter or state named 'nope'"),
            std::string::npos);
  EXPECT_NE(errorOf(interp.bind("x", Tensor::zeros(TensorType(DType::F32, {3}))))
                .find("'x' is f32[2], but a f32[3] was given"),
            std::string::npos);
  EXPECT_NE(errorOf(interp.run()).find("input %x was not given a value"), std::string::npos);
}

TEST(Interpreter, PeakBytesCountTheAttentionsScoresWhileItRuns) {
  // qkv f32[2,64,96] (49152 bytes), out [2,64,32] and lse [2,4,64]: while attention runs, its
  // CPU kernel also holds four [2,4,64,64] score tensors and the heads (4 * 131072 + 49152).
  auto graph = unwrap(parseGraph("graph @g\n%qkv = input() : f32[2,64,96]\n"
                                 "%out, %lse = attention(%qkv) {heads=4, scale=0.125} : f32[2,64,32], f32[2,4,64]\n"
                                 "return %out\n",
                                 "t"));
  ASSERT_TRUE(graph);
  EXPECT_EQ(interpreterPeakBytes(*graph), 49152 + 16384 + 2048 + 4 * 131072 + 49152);
}

TEST(Interpreter, ContainerMemoryLimitsAreRead) {
  llvm::SmallString<128> root;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("tgc-cgroup", root));
  std::string dir = root.str().str(), self = dir + "/self";
  auto write = [](const std::string &path, const std::string &text) { std::ofstream(path) << text; };
  // No limit files: nothing to say.
  write(self, "0::/\n");
  EXPECT_FALSE(cgroupAvailableMemory(dir, self).has_value());
  // cgroup v2, in the process's own cgroup.
  ASSERT_FALSE(llvm::sys::fs::create_directories(dir + "/job"));
  write(self, "0::/job\n");
  write(dir + "/job/memory.max", "6442450944\n");
  write(dir + "/job/memory.current", "1073741824\n");
  EXPECT_EQ(cgroupAvailableMemory(dir, self), int64_t(5) << 30);
  // "max" is no limit; then cgroup v1, whose "no limit" is a huge number.
  write(dir + "/job/memory.max", "max\n");
  ASSERT_FALSE(llvm::sys::fs::create_directories(dir + "/memory"));
  write(dir + "/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write(dir + "/memory/memory.usage_in_bytes", "100\n");
  EXPECT_FALSE(cgroupAvailableMemory(dir, self).has_value());
  write(dir + "/memory/memory.limit_in_bytes", "1000\n");
  EXPECT_EQ(cgroupAvailableMemory(dir, self), 900);
  // v1: the process's own cgroup (its memory controller's line) and its ancestors, the least.
  ASSERT_FALSE(llvm::sys::fs::create_directories(dir + "/memory/slice/job"));
  write(self, "5:cpu,cpuacct:/slice/job\n4:memory:/slice/job\n");
  write(dir + "/memory/slice/job/memory.limit_in_bytes", "700\n");
  write(dir + "/memory/slice/job/memory.usage_in_bytes", "100\n");
  EXPECT_EQ(cgroupAvailableMemory(dir, self), 600);
  write(dir + "/memory/slice/memory.limit_in_bytes", "400\n"); // the slice above binds it more
  write(dir + "/memory/slice/memory.usage_in_bytes", "300\n");
  EXPECT_EQ(cgroupAvailableMemory(dir, self), 100);
  // v2: a limit on an ancestor of the process's cgroup binds too.
  ASSERT_FALSE(llvm::sys::fs::create_directories(dir + "/user.slice/job"));
  write(self, "0::/user.slice/job\n");
  write(dir + "/user.slice/job/memory.max", "max\n");
  write(dir + "/user.slice/job/memory.current", "5\n");
  write(dir + "/user.slice/memory.max", "3000\n");
  write(dir + "/user.slice/memory.current", "1000\n");
  EXPECT_EQ(cgroupAvailableMemory(dir, self), 2000);
}

TEST(Interpreter, PeakBytesFollowTheRunsSchedule) {
  // x and s bound throughout (8000 bytes); a, b, c, d 4000 each. a dies after b (read twice,
  // freed once); b and c after d. The peak is after d: x, s, b, c, d = 20000 bytes; then the
  // assign holds a copy of d until the step ends, with b and c freed: x, s, d, the copy.
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[1000]\n"
                                 "%s = state() {init=\"zeros\"} : f32[1000]\n"
                                 "%a = gelu(%x) : f32[1000]\n%b = add(%a, %a) : f32[1000]\n"
                                 "%c = gelu(%b) : f32[1000]\n%d = add(%b, %c) : f32[1000]\n"
                                 "assign(%s, %d)\nreturn %d\n",
                                 "t"));
  ASSERT_TRUE(graph);
  EXPECT_EQ(interpreterPeakBytes(*graph), 20000);
  EXPECT_FALSE(bool(checkHostMemory(*graph, 20000)));
  std::string message = errorOf(checkHostMemory(*graph, 19999));
  EXPECT_NE(message.find("@g needs at least 0.0 GiB of memory on the CPU interpreter, and this "
                         "machine has 0.0 GiB available"),
            std::string::npos)
      << message;
}

TEST(Interpreter, TinyTrainingStepFitsAndAMuchLargerBatchNeedsMore) {
  // The training program's estimate grows with the batch, and covers at least the parameters
  // with AdamW's two moments, and the batch's logits.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto trainingStep = [&](int64_t batch) {
    auto program = unwrap(compileForDevice(unwrap(buildGPT(c, batch)), c, Device::cpu(), true));
    return program.graph ? interpreterPeakBytes(*program.graph) : 0;
  };
  int64_t small = trainingStep(2), large = trainingStep(64);
  int64_t params = c.numParams() * 4, logits = 64 * c.seqLen * c.vocab * 4;
  EXPECT_GT(small, 3 * params);
  EXPECT_GT(large, small + logits);
  ASSERT_TRUE(availableHostMemory().has_value());
  EXPECT_GT(*availableHostMemory(), large);
}

TEST(ArithmeticData, SequencesAreProgressionsAndTargetsAreShifted) {
  DataConfig dc;
  ArithmeticData data(64, 16, dc, 99);
  Batch b = data.trainBatch(5, 8);
  ASSERT_EQ(b.tokens.size(), 8u * 16u);
  for (int s = 0; s < 8; ++s) {
    int step = (b.tokens[s * 16 + 1] - b.tokens[s * 16] + 64) % 64;
    EXPECT_GE(step, dc.minStep);
    EXPECT_LE(step, dc.maxStep);
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(b.targets[s * 16 + t], (b.tokens[s * 16 + t] + step) % 64);
      if (t + 1 < 16) {
        EXPECT_EQ(b.tokens[s * 16 + t + 1], b.targets[s * 16 + t]);
      }
    }
  }
}

TEST(ArithmeticData, HeldOutPairsNeverAppearInTraining) {
  DataConfig dc;
  ArithmeticData data(64, 8, dc, 5);
  auto eval = data.evalPairs(1000);
  EXPECT_GT(eval.size(), 30u); // about one pair in eight of 64 * 8
  std::set<std::pair<int64_t, int64_t>> held(eval.begin(), eval.end());
  for (auto [a, k] : eval)
    EXPECT_TRUE(ArithmeticData::isEvalPair(a, k));
  for (int64_t i = 0; i < 200; ++i) {
    Batch b = data.trainBatch(i, 16);
    for (int s = 0; s < 16; ++s) {
      int64_t a = b.tokens[s * 8], k = (b.tokens[s * 8 + 1] - a + 64) % 64;
      EXPECT_FALSE(held.count({a, k})) << "pair (" << a << ", " << k << ") in batch " << i;
    }
  }
}

TEST(ArithmeticData, SameSeedSameBatchesDifferentSeedDifferentBatches) {
  ArithmeticData a(64, 8, DataConfig(), 11), b(64, 8, DataConfig(), 11), c(64, 8, DataConfig(), 12);
  EXPECT_EQ(a.trainBatch(3, 4).tokens, b.trainBatch(3, 4).tokens);
  EXPECT_NE(a.trainBatch(3, 4).tokens, a.trainBatch(4, 4).tokens);
  EXPECT_NE(a.trainBatch(3, 4).tokens, c.trainBatch(3, 4).tokens);
  EXPECT_NEAR(a.lossFloor(), std::log(8.0) / 8.0, 1e-12);
}

} // namespace

TEST(Interpreter, TracesEachOpsResultsInProgramOrder) {
  // setTracingValues: every op's results (both of a two-result op), named as in the graph, in
  // program order, each the value the op computed (the outputs' are the outputs); a step
  // without tracing keeps none, and a new traced step replaces the last one's.
  Rng rng(freshSeed());
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[3,4]\n"
                                 "%w = param() {init=\"normal\", std=1.0} : f32[4,4]\n"
                                 "%b = param() {init=\"zeros\"} : f32[4]\n%y = matmul(%x, %w) : f32[3,4]\n"
                                 "%z, %h = matmul_bias_gelu(%y, %w, %b) : f32[3,4], f32[3,4]\n"
                                 "%s = add(%z, %y) : f32[3,4]\nreturn %s\n",
                                 "trace.ir"));
  ASSERT_TRUE(graph);
  Interpreter interp(*graph);
  ASSERT_FALSE(bool(interp.bindAll({{"x", randomTensor(TensorType(DType::F32, {3, 4}), rng)},
                                    {"w", randomTensor(TensorType(DType::F32, {4, 4}), rng)},
                                    {"b", randomTensor(TensorType(DType::F32, {4}), rng)}})));
  unwrap(interp.run());
  EXPECT_TRUE(interp.tracedValues().empty());
  interp.setTracingValues(true);
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> outputs = unwrap(interp.run());
    auto traced = interp.tracedValues();
    std::vector<std::string> names;
    for (const auto &[name, value] : traced)
      names.push_back(name);
    EXPECT_EQ(names, (std::vector<std::string>{"y", "z", "h", "s"}));
    ASSERT_EQ(traced.size(), 4u);
    EXPECT_EQ(traced[3].second.data, outputs[0].data);
    for (size_t i = 0; i < traced[1].second.data.size(); ++i) // s = z + y, from the traced z and y
      EXPECT_EQ(traced[1].second.data[i] + traced[0].second.data[i], outputs[0].data[i]);
  }
}

TEST(Interpreter, RoundsTheNamedValuesToBf16AsTheyAreMade) {
  // setRoundedValues (a GPU's roundedValues, emulated): the named intermediate is rounded to
  // BF16 as its op makes it, so the ops that read it read the rounded value; leaves and unknown
  // names are ignored, and an empty list turns the rounding off.
  Rng rng(freshSeed());
  auto graph = unwrap(parseGraph("graph @g\n%x = input() : f32[3,8]\n%w = param() {init=\"normal\", std=1.0} : f32[8,8]\n"
                                 "%y = matmul(%x, %w) : f32[3,8]\n%s = add(%y, %x) : f32[3,8]\nreturn %s\n",
                                 "round.ir"));
  ASSERT_TRUE(graph);
  Interpreter interp(*graph);
  Tensor x = randomTensor(TensorType(DType::F32, {3, 8}), rng);
  ASSERT_FALSE(bool(interp.bindAll({{"x", x}, {"w", randomTensor(TensorType(DType::F32, {8, 8}), rng)}})));
  interp.setTracingValues(true);
  std::vector<Tensor> exact = unwrap(interp.run());
  std::vector<float> y = interp.tracedValues()[0].second.data;
  EXPECT_TRUE(interp.setRoundedValues({"y", "x", "nothing"}));
  std::vector<Tensor> rounded = unwrap(interp.run());
  int changed = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(interp.tracedValues()[0].second.data[i], roundToBf16(y[i]));
    EXPECT_EQ(rounded[0].data[i], roundToBf16(y[i]) + x.data[i]); // x itself not rounded
    changed += rounded[0].data[i] != exact[0].data[i];
  }
  EXPECT_GT(changed, 0);
  EXPECT_TRUE(interp.setRoundedValues({}));
  EXPECT_EQ(unwrap(interp.run())[0].data, exact[0].data);
}
