// Generation on the GPU against the CPU (GenerateTest.cpp's twin): decode steps through the
// whole cache, the few-row products, the normalising GEMVs, the attention writing the cache and
// streaming long ones, prefill then decode giving the CPU's tokens. Skipped where there is no GPU.
#include "app/InferencePrograms.h"
#include "tests/RandomWeights.h"
#include "support/Numerics.h"
#include "tests/backends/cuda/GpuTestUtil.h"

#include <algorithm>
#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

class GpuDecode : public testing::TestWithParam<std::string> {};

TEST_P(GpuDecode, StepsFollowTheCpuThroughTheWholeCache) {
  // Under bf16 the caches are stored in BF16 on the GPU (chooseBf16Caches), bound from the
  // host, written and read as such. "llama-": the Llama block's step (RoPE at each sequence's
  // position, two KV heads for four query heads: caches of the KV heads, kv_write then the
  // attention reading KV head h / 2).
  SKIP_WITHOUT_GPU();
  const GpuDecodeCase param = gpuDecodeCase(GetParam());
  const double bound = param.bound;
  auto program = tinyGpuProgram(param.recipe, GPTOutput::Decode, param.model);
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = randomWeights(*program, rng);
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
    ASSERT_LE(gap.worst, bound * gap.scale) << "position " << pos;
  }
  // The caches as the CPU holds them (a BF16 cache is read back widened: the same values).
  for (const char *cache : {"h0.attn.k_cache", "h1.attn.v_cache"}) {
    Gap gap = gapOf(unwrap(cpu.read(cache)).data, unwrap(gpu->read(cache)).data);
    EXPECT_LE(gap.worst, bound * gap.scale) << cache;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, GpuDecode, gpuDecodeCases(), gpuDecodeCaseName);

TEST(GpuGeneration, MarginalProfileLeavesTheStepsAsTheyWere) {
  // TGC_GPU_PROFILE=marginal replays the whole step, and the step without each kind of op, before
  // each step (OpProfile.cpp): those replays write the caches' rows at the step's position from
  // wrong values, which the step then writes again. The steps' logits and the caches are the
  // same bits as an executor's without the profile, and the profile is printed.
  SKIP_WITHOUT_GPU();
  auto program = tinyGpuProgram("bf16", GPTOutput::Decode);
  ASSERT_TRUE(program);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = randomWeights(*program, rng);
  auto plain = unwrap(createCudaExecutor(*program));
  ::setenv("TGC_GPU_PROFILE", "marginal", 1);
  auto profiled = unwrap(createCudaExecutor(*program));
  ::unsetenv("TGC_GPU_PROFILE");
  ASSERT_TRUE(plain && profiled);
  ASSERT_FALSE(bool(plain->bindAll(leaves)));
  ASSERT_FALSE(bool(profiled->bindAll(leaves)));
  const TensorType column = program->lookup("tokens")->type();
  int64_t vocab = program->lookup("wte")->type().dim(0);
  for (int32_t pos = 0; pos < 6; ++pos) {
    Tensor tokens = Tensor::zeros(column), positions = Tensor::zeros(column);
    for (int32_t &t : tokens.ints)
      t = int32_t(rng.below(vocab));
    std::fill(positions.ints.begin(), positions.ints.end(), pos);
    std::map<std::string, Tensor> step{{"tokens", tokens}, {"positions", positions}};
    ASSERT_FALSE(bool(plain->bindAll(step)));
    ASSERT_FALSE(bool(profiled->bindAll(step)));
    EXPECT_EQ(unwrap(profiled->run()).at(0).data, unwrap(plain->run()).at(0).data) << "position " << pos;
  }
  EXPECT_EQ(unwrap(profiled->read("h1.attn.v_cache")).data, unwrap(plain->read("h1.attn.v_cache")).data);
  testing::internal::CaptureStderr();
  profiled.reset(); // prints the profile
  std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("6 steps; the step replayed from a CUDA graph"), std::string::npos) << printed;
  EXPECT_NE(printed.find("decode_attention"), std::string::npos) << printed;
}

struct ProductShape {
  int64_t M, K, N;
};

/// matmul, matmul_bias and matmul_bias_gelu of each shape on the GPU against the CPU (gemv.cuh's
/// kernels where fewRows takes them, cuBLASLt past them), on fresh random operands.
void expectProductsMatchTheCpu(const std::vector<ProductShape> &shapes, Rng &rng) {
  for (const ProductShape &s : shapes)
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

TEST(GpuGeneration, FewRowProductsMatchTheCpu) {
  // gemv.cuh: the products of decode steps against a weight. 1 row (and 2 to 8 where K is no
  // multiple of 32 or N past 16384) on the CUDA cores; 2 to 64 on tensor cores (partial and whole
  // m16 tiles) with K in 8 slices (256), 1 slice (96: each warp all of K, written without shared
  // memory), past 8 loads of weight a lane (2048: the next weights load while these multiply);
  // 200 columns (a partial block) and 16384 (the most the tensor-core kernel takes); with and
  // without a bias, and the bias then the GELU (matmul_bias_gelu, both of its results). 65 rows,
  // or 16385 columns past 8 rows: cuBLASLt.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  std::vector<ProductShape> shapes;
  for (int64_t M : {1, 3, 8, 9, 24, 32, 64, 65})
    shapes.push_back({M, 256, 200});
  shapes.push_back({24, 96, 200});
  shapes.push_back({32, 2048, 200});
  shapes.push_back({17, 256, 16384});
  // 2 column tiles a warp (K <= N: 24 rows; 40 rows, three row tiles), 4 (a block for every
  // multiprocessor), both with a partial last block (Gemv.cpp's rowsColumnTiles).
  shapes.push_back({24, 512, 1000});
  shapes.push_back({40, 256, 6000});
  shapes.push_back({16, 512, 5000});
  shapes.push_back({17, 256, 16385});
  shapes.push_back({8, 256, 16385});
  // The GEMV's tiles (Gemv.cpp's gemvTile): K in 8 slices with 2 columns a warp and a partial
  // last block; 8 slices of 4 loads a lane; 2 slices of 3 loads.
  shapes.push_back({1, 2048, 2100});
  shapes.push_back({4, 8192, 2050});
  shapes.push_back({2, 1536, 1000});
  // One row of K 8192 into 2101 columns: 1051 tiles of 2 columns in 4 slices, taken by a wave
  // that strides over them (Gemv.cpp's stridedLongGemvBlocks, 132 multiprocessors), the last
  // partial.
  shapes.push_back({1, 8192, 2101});
  expectProductsMatchTheCpu(shapes, rng);
}

TEST(GpuGeneration, NormalisingProductsMatchTheCpu) {
  // gemv.cuh's residual_norm_linear (fuse-residual-norm-gemv): 1, 3 and 8 rows, rows of 64, 200
  // (a partial last lane pass) and 1024 features (the most a warp holds), LayerNorm and RMSNorm,
  // with a bias and the GELU or neither; 200 columns (a partial block). Then one row of 1024 and
  // 2048 features into 4502 columns: 1126 tiles, which an H100's or H200's 132 multiprocessors
  // take in gemvBf16RowsStrided's one wave (Gemv.cpp), the last tile partial. Both results against
  // the CPU: the sum exactly, the product within BF16's reach (a norm value summed in another
  // order can round to the neighbouring BF16 before the product reads it).
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  std::vector<ProductShape> shapes{{1, 2048, 4502}, {1, 1024, 4502}};
  for (int64_t M : {1, 3, 8})
    for (int64_t K : {64, 200, 1024})
      shapes.push_back({M, K, 200});
  for (auto [M, K, N] : shapes)
    for (bool layer : {true, false}) {
      bool gelu = layer; // LayerNorm with a bias and the GELU, RMSNorm with neither
      SCOPED_TRACE(fmt::format("{} rows of {} into {}, {}", M, K, N, layer ? "layer_norm, bias, gelu" : "rms_norm"));
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

/// decode_attention's qkv and caches (%qkv, %k, %v of `graph`) drawn from a standard normal.
std::map<std::string, Tensor> normalLeaves(const Graph &graph, Rng &rng) {
  std::map<std::string, Tensor> leaves;
  for (const char *name : {"qkv", "k", "v"}) {
    Tensor t = Tensor::zeros(graph.lookup(name)->type());
    for (float &x : t.data)
      x = float(rng.normal());
    leaves[name] = std::move(t);
  }
  return leaves;
}

TEST(GpuGeneration, AttentionOverTheCacheWritingItMatchesTheCpu) {
  // decode.cuh's attention writing the caches (fuse-kv-write's; not in place: they are inputs
  // here, copied first), 8 sequences of 16 heads over a cache of 512 positions (16 parts of 32
  // keys each, 2048 in all) at positions anywhere in it, the last included; fp32 (exact caches)
  // and bf16. Every head its own KV head, and grouped: 2 and 1 KV heads through the tiles (the
  // group's first block writing the row), and heads of 6 (rows of 24 bytes: no tiles, kv_write's
  // launch before the attention).
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  const int64_t B = 8, T = 512, H = 16;
  for (auto [kv, Dh] : {std::pair<int64_t, int64_t>{16, 16}, {2, 16}, {1, 16}, {4, 6}})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(fmt::format("{} KV heads of {}, {}", kv, Dh, bf16 ? "bf16" : "fp32"));
      const int64_t Q = H * Dh, D = kv * Dh;
      std::string text = fmt::format(
          "graph @g\n%qkv = input() : f32[{0},1,{3}]\n%k = input() : f32[{0},{1},{2}]\n%v = input() : f32[{0},{1},{2}]\n"
          "%positions = input() : i32[{0},1]\n%out, %k.new, %v.new = decode_attention(%qkv, %k, %v, %positions) "
          "{{{4}heads={5}, kv_heads={6}, scale=0.25, write_cache=true}} : f32[{0},1,{7}], f32[{0},{1},{2}], "
          "f32[{0},{1},{2}]\nreturn %out, %k.new, %v.new\n",
          B, T, D, Q + 2 * D, bf16 ? "gemm_dtype=\"bf16\", " : "", H, kv, Q);
      auto graph = unwrap(parseGraph(text, "decode-attention.ir"));
      ASSERT_TRUE(graph);
      std::map<std::string, Tensor> leaves = normalLeaves(*graph, rng);
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

TEST(GpuGeneration, StreamedAttentionOverLongCachesMatchesTheCpu) {
  // decode_stream.cuh's attention (more (sequence, head) pairs than SMs, or heads of 128: the
  // parts read from memory, keys and values together, a running softmax a group of lanes),
  // heads of 64 and 128 over a cache of 1024 positions: 12 sequences of 16 heads (192 pairs, a
  // few parts of a couple of hundred keys each) and 2 (32 pairs, parts of a block's turn), at
  // positions anywhere in it, the first and last included. Reading caches that are inputs, and
  // writing caches that are state (in place; under bf16 stored in BF16, their values drawn in
  // BF16 so that the CPU's are the same), qkv made by a kernel before it, which it awaits under
  // programmatic launch, as in a step.
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  const int64_t T = 1024, H = 16;
  for (int64_t B : {12, 2})
    for (int64_t Dh : {64, 128})
      for (bool write : {true, false})
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(fmt::format("{} sequences, heads of {}, {}, {}", B, Dh, write ? "writing" : "reading",
                                   bf16 ? "bf16" : "fp32"));
          const int64_t D = H * Dh;
          std::string cache = fmt::format("f32[{},{},{}]", B, T, D);
          std::string text = fmt::format(
              "graph @g\n%raw = input() : f32[{0},1,{2}]\n%qkv = add(%raw, %raw) : f32[{0},1,{2}]\n"
              "%k = {3} : {1}\n%v = {3} : {1}\n"
              "%positions = input() : i32[{0},1]\n%out{4} = decode_attention(%qkv, %k, %v, %positions) "
              "{{{5}heads={6}, scale=0.125{7}}} : f32[{0},1,{8}]{9}\n{10}return %out\n",
              B, cache, 3 * D, write ? "state() {init=\"zeros\"}" : "input()", write ? ", %k.new, %v.new" : "",
              bf16 ? "gemm_dtype=\"bf16\", " : "", H, write ? ", write_cache=true" : "", D,
              write ? ", " + cache + ", " + cache : "", write ? "assign(%k, %k.new)\nassign(%v, %v.new)\n" : "");
          auto graph = unwrap(parseGraph(text, "decode-attention.ir"));
          ASSERT_TRUE(graph);
          std::map<std::string, Tensor> leaves = normalLeaves(*graph, rng);
          leaves["raw"] = std::move(leaves["qkv"]); // qkv is twice raw, made by the add's kernel
          leaves.erase("qkv");
          if (bf16)
            for (const char *cache : {"k", "v"})
              for (float &x : leaves[cache].data)
                x = roundToBf16(x);
          Tensor positions = Tensor::zeros(TensorType(DType::I32, {B, 1}));
          for (int32_t &p : positions.ints)
            p = int32_t(rng.below(T));
          positions.ints[0] = int32_t(T - 1);
          positions.ints[1] = 0;
          leaves["positions"] = positions;
          Interpreter cpu(*graph);
          auto gpu = unwrap(createCudaExecutor(*graph));
          ASSERT_TRUE(gpu);
          ASSERT_FALSE(bool(cpu.bindAll(leaves)));
          ASSERT_FALSE(bool(gpu->bindAll(leaves)));
          std::vector<float> want = unwrap(cpu.run()).at(0).data, got = unwrap(gpu->run()).at(0).data;
          Gap gap = gapOf(want, got);
          EXPECT_LE(gap.worst, (bf16 ? 1e-2 : 1e-5) * gap.scale) << "max difference " << gap.worst;
          if (write) { // the caches, with this step's rows written (a BF16 cache read back widened)
            for (const char *name : {"k", "v"})
              EXPECT_EQ(unwrap(gpu->read(name)).data, unwrap(cpu.read(name)).data) << name;
          }
        }
}

/// The sample op on random logits (ties and NaNs among them), vocabularies of GPT-2's size, an
/// odd thousand and a few, greedy, temperature alone, top-k, top-p and both, and settings out of
/// range (top-p <= 0 or > 1, top-k < 1 or past the vocabulary), and beside others a row of -inf
/// alone: the GPU's token of every row is the CPU's (support/Sampling.h decides in integers), for
/// several seeds.
void expectSampledTokensAreTheCpus(Rng &rng) {
  for (int64_t V : {50257, 1001, 37})
    for (int64_t B : {1, 5, 32, 48}) {
      if (V != 50257 && B > 5)
        continue;
      const int64_t stride = B == 5 ? 7 : 0;
      std::string text = fmt::format(
          "graph @g\n%logits = input() : f32[{0},1,{1}]\n%counters = input() : i32[{0},1]\n"
          "%sampling = input() : f32[3]\n%seed = input() : i32[2]\n"
          "%next = sample(%logits, %counters, %sampling, %seed) {{stride={2}}} : i32[{0},1]\nreturn %next\n",
          B, V, stride);
      auto graph = unwrap(parseGraph(text, "sample.ir"));
      ASSERT_TRUE(graph);
      struct Case { float temperature, topP, topK; };
      for (Case k : {Case{0, 1, 0}, Case{0.8f, 1, 0}, Case{1, 1, 40}, Case{0.7f, 0.9f, 0}, Case{1.2f, 0.95f, 100},
                     Case{1, 1, 1}, Case{2, 0.5f, 0}, Case{1, -0.5f, -3}, Case{0.9f, 1.5f, 1e9f}}) {
        SCOPED_TRACE(fmt::format("V {}, B {}, temperature {}, top_p {}, top_k {}", V, B, k.temperature, k.topP, k.topK));
        std::map<std::string, Tensor> leaves;
        Tensor logits = Tensor::zeros(graph->lookup("logits")->type());
        for (float &x : logits.data)
          x = float(rng.normal() * 3);
        logits.data[V / 2] = logits.data[V / 3]; // a tie
        logits.data[1] = std::nanf("");
        if (B > 1) // the first row without a finite logit: nothing weighs, the argmax's token
          std::fill(logits.data.begin(), logits.data.begin() + V, -INFINITY);
        leaves["logits"] = logits;
        Tensor counters = Tensor::zeros(TensorType(DType::I32, {B, 1}));
        for (int64_t b = 0; b < B; ++b)
          counters.ints[b] = int32_t(b * stride + rng.below(1000));
        leaves["counters"] = counters;
        leaves["sampling"] = Tensor{TensorType(DType::F32, {3}), {k.temperature, k.topP, k.topK}, {}};
        for (int trial = 0; trial < 4; ++trial) {
          leaves["seed"] = Tensor{TensorType(DType::I32, {2}), {}, {int32_t(rng.next()), int32_t(rng.next())}};
          std::vector<Tensor> want, got;
          runOnBoth(*graph, leaves, want, got);
          ASSERT_EQ(got.size(), 1u);
          EXPECT_EQ(got[0].ints, want[0].ints) << "trial " << trial;
        }
      }
    }
}

TEST(GpuGeneration, SampledTokensAreTheCpusForTheSameSeed) {
  // GPT-2's vocabulary at 1, 5 and 32 rows takes the cooperative launch (sampleGrid: chunks of
  // 2048, then 4096), at 48 rows sampleRows (too many blocks to hold at once); then every shape
  // in sampleCluster's one launch of a cluster a row (TGC_SAMPLE_CLUSTER=1; sm_90).
  SKIP_WITHOUT_GPU();
  Rng rng(freshSeed());
  expectSampledTokensAreTheCpus(rng);
  if (theGpu().computeCapability < 90)
    GTEST_SKIP() << "thread-block clusters need compute capability 9.0";
  ::setenv("TGC_SAMPLE_CLUSTER", "1", 1);
  SCOPED_TRACE("TGC_SAMPLE_CLUSTER=1");
  expectSampledTokensAreTheCpus(rng);
  ::unsetenv("TGC_SAMPLE_CLUSTER");
}

TEST(GpuGeneration, PrefillAndDecodeGiveTheCpusTokens) {
  // Prompts of four lengths in one batch (the longest needs the 32-position prefill), greedy
  // and sampled: the GPU's tokens are the CPU interpreter's; for the GPT-2 block and the Llama
  // block (its caches of two KV heads, q and k rotated at each sequence's positions).
  SKIP_WITHOUT_GPU();
  for (const char *model : {"models/tiny.yaml", "models/llama-tiny.yaml"}) {
    SCOPED_TRACE(model);
    ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
    c.precision.recipe = Recipe::Fp32;
    auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
    ASSERT_TRUE(graph);
    Rng rng(freshSeed());
    std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
    auto cpu = unwrap(Generator::create(c, weights, 4, Device::cpu()));
    auto gpu = unwrap(Generator::create(c, weights, 4, theGpu()));
    ASSERT_TRUE(cpu && gpu);
    std::vector<std::vector<int32_t>> prompts = randomPrompts(rng, {1, 7, 16, 20}, c.vocab);
    for (SamplingOptions options : {SamplingOptions{}, SamplingOptions{0.8, 10, 0.9, 7}}) {
      auto want = unwrap(cpu->generate(prompts, c.seqLen - 20 + 1, options));
      auto got = unwrap(gpu->generate(prompts, c.seqLen - 20 + 1, options));
      EXPECT_EQ(got, want) << "temperature " << options.temperature;
      EXPECT_EQ(gpu->stats().prefillLength, 32);
      EXPECT_TRUE(gpu->stats().cached);
    }
  }
}


TEST(GpuGeneration, APrefillHoldsTheDecodeStepsWeightsAndCachesInItsMemory) {
  // CudaOptions::regionsOf: a prefill compiled beside the decode step uses the decode program's
  // parameter and state regions and BF16 weight copy (its weights not bound again, its caches
  // the decode step's), so it allocates at least the weights' fp32 bytes and the caches' less
  // than one compiled alone; its logits are the alone program's, bit for bit.
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  int64_t weightBytes = 0;
  for (const auto &[name, t] : weights)
    weightBytes += 4 * t.type.numElements();
  const int64_t batch = 2, positions = 16;
  auto decode = unwrap(compileInference(c, weights, batch, theGpu(), GPTOutput::Decode));
  auto shared = unwrap(compileInference(c, weights, batch, theGpu(), GPTOutput::Prefill, positions,
                                        decode.executor.get()));
  auto alone = unwrap(compileInference(c, weights, batch, theGpu(), GPTOutput::Prefill, positions));
  for (const char *leaf : {"wte", "h0.attn.qkv.weight", "h1.attn.k_cache"}) {
    EXPECT_TRUE(shared.executor->borrowsLeaf(leaf)) << leaf;
    EXPECT_FALSE(alone.executor->borrowsLeaf(leaf)) << leaf;
  }
  EXPECT_GE(alone.executor->deviceBytes() - shared.executor->deviceBytes(), weightBytes);
  Tensor tokens = Tensor::zeros(TensorType(DType::I32, {batch, positions}));
  for (int32_t &t : tokens.ints)
    t = int32_t(rng.below(c.vocab));
  std::vector<Tensor> logits;
  for (CompiledProgram *p : {&shared, &alone}) {
    ASSERT_FALSE(bool(p->executor->bind(program::kTokens, tokens)));
    ASSERT_FALSE(bool(p->executor->bind(program::kLastRows, Tensor{TensorType(DType::I32, {batch, 1}), {}, {15, 31}})));
    ASSERT_FALSE(bool(bindSampling(*p->executor, SamplingOptions{})));
    logits.push_back(unwrap(p->executor->run()).at(*program::outputIndex(*p->graph, program::kLogits)));
  }
  EXPECT_EQ(logits[0].data, logits[1].data);
  // The shared prefill wrote the decode step's cache.
  Tensor written = unwrap(decode.executor->read("h1.attn.k_cache"));
  EXPECT_NE(std::count(written.data.begin(), written.data.end(), 0.0f), int64_t(written.data.size()));
}

} // namespace

namespace {

/// Traced values (Generator::promptValues) by name.
std::map<std::string, const Tensor *> valuesByName(const std::vector<std::pair<std::string, Tensor>> &values) {
  std::map<std::string, const Tensor *> byName;
  for (const auto &[name, value] : values)
    byName[name] = &value;
  return byName;
}

/// Where the GPU's run of a prompt parts from the CPU's (Generator::promptValues): each value
/// both hold, in the GPU's program order, whose RMS difference passes 1e-3 of the CPU value's
/// RMS (the first 15 of them printed, with the largest difference), then how many did.
void printValueGaps(Generator &gpu, Generator &cpu, const std::vector<int32_t> &sequence) {
  auto onGpu = unwrap(gpu.promptValues(sequence)), onCpu = unwrap(cpu.promptValues(sequence));
  std::map<std::string, const Tensor *> cpuValues = valuesByName(onCpu);
  int parted = 0, compared = 0;
  for (const auto &[name, value] : onGpu) {
    auto it = cpuValues.find(name);
    if (it == cpuValues.end() || it->second->data.size() != value.data.size() || value.data.empty())
      continue;
    ++compared;
    double squaredError = 0, squared = 0, largest = 0;
    for (size_t i = 0; i < value.data.size(); ++i) {
      double difference = double(value.data[i]) - it->second->data[i];
      squaredError += difference * difference;
      squared += double(it->second->data[i]) * it->second->data[i];
      largest = std::max(largest, std::abs(difference));
    }
    double relative = std::sqrt(squaredError / std::max(squared, 1e-300));
    if (!(relative > 1e-3))
      continue;
    if (++parted <= 15)
      fmt::print("  %{}: RMS difference {:.2e} of its RMS, largest {:.3g}\n", name, relative, largest);
  }
  fmt::print("values the GPU's and the CPU's runs both hold: {}; {} parted by more than 1e-3\n", compared, parted);
}

/// That the CPU's emulation of `gpu`'s checkpoint agrees with the GPU's `tokens` continuing
/// `prompt`: the logits of the whole sequence within 2% of the largest (their products' sums
/// run in another order, and a last-bit change may move an FP8 rounding by a step), and each
/// token the GPU chose within twice that of the CPU's best. (Comparing the CPU's own greedy
/// tokens would fail wherever two tokens' logits are closer than that: an undertrained model's
/// ties are the CPU's and GPU's to break.)
void expectCpuAgrees(Generator &gpu, Generator &cpu, const std::vector<int32_t> &prompt,
                     const std::vector<int32_t> &tokens) {
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), tokens.begin(), tokens.end() - 1);
  Tensor onGpu = unwrap(gpu.promptLogits(sequence)), onCpu = unwrap(cpu.promptLogits(sequence));
  ASSERT_EQ(onGpu.data.size(), onCpu.data.size());
  float largest = 0, error = 0;
  size_t worst = 0;
  double squaredError = 0, squared = 0;
  for (size_t i = 0; i < onCpu.data.size(); ++i) {
    largest = std::max(largest, std::abs(onCpu.data[i]));
    float difference = std::abs(onGpu.data[i] - onCpu.data[i]);
    if (difference > error)
      error = difference, worst = i;
    squaredError += double(difference) * difference;
    squared += double(onCpu.data[i]) * onCpu.data[i];
  }
  // Printed whether or not the bounds hold, to tell FP8's rounding noise from a systematic gap.
  const int64_t V = onCpu.type.dim(-1);
  fmt::print("prompt logits: largest {:.4f}, worst difference {:.4f} at position {} token {}, "
             "RMS difference {:.2e} of the logits' RMS\n",
             largest, error, int64_t(worst) / V, int64_t(worst) % V, std::sqrt(squaredError / squared));
  float bound = 0.02f * largest;
  EXPECT_LE(error, bound) << "the largest logit is " << largest;
  if (error > bound) // where the two runs part, to tell a fault from FP8's rounding
    printValueGaps(gpu, cpu, sequence);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float *row = onCpu.data.data() + (prompt.size() - 1 + i) * V;
    float best = *std::max_element(row, row + V);
    EXPECT_GE(row[tokens[i]], best - 2 * bound) << "new token " << i << ": " << tokens[i];
  }
}

TEST(GpuGeneration, TracedValuesAreTheStepsOwn) {
  // Executor::setTracingValues on the GPU (through Generator::promptValues, bf16): the step runs
  // eagerly and reads each op's results back; the last traced logits are promptLogits's, the
  // CPU traces the values the GPU does (by name) but those only one side's passes make, and
  // each shared value is within BF16's reach of the CPU's.
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  Rng rng(freshSeed());
  auto graph = unwrap(buildGPT(c, 2, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  auto gpu = unwrap(Generator::create(c, weights, 2, theGpu()));
  auto cpu = unwrap(Generator::create(c, weights, 2, Device::cpu()));
  ASSERT_TRUE(gpu && cpu);
  std::vector<int32_t> prompt = randomPrompts(rng, {9}, c.vocab)[0];
  auto traced = unwrap(gpu->promptValues(prompt));
  ASSERT_FALSE(traced.empty());
  auto logits = std::find_if(traced.rbegin(), traced.rend(), [](const auto &v) { return v.first == "logits"; });
  ASSERT_NE(logits, traced.rend());
  Tensor want = unwrap(gpu->promptLogits(prompt));
  const int64_t V = c.vocab;
  for (size_t i = 0; i < want.data.size(); ++i)
    ASSERT_EQ(logits->second.data[i], want.data[i]) << "position " << i / V << " token " << i % V;
  auto onCpu = unwrap(cpu->promptValues(prompt));
  std::map<std::string, const Tensor *> cpuValues = valuesByName(onCpu);
  int shared = 0;
  for (const auto &[name, value] : traced) {
    auto it = cpuValues.find(name);
    if (it == cpuValues.end() || it->second->data.size() != value.data.size())
      continue;
    ++shared;
    Gap gap = gapOf(it->second->data, value.data);
    EXPECT_LE(gap.worst, 2e-2 * gap.scale) << "%" << name;
  }
  EXPECT_GT(shared, 10);
}

TEST(GpuGeneration, AnFp8CheckpointGeneratesAtAnyBatchWithTheWindowsTokens) {
  // Trained in FP8 on the GPU (delayed, then current scaling): the decode step runs the layers
  // training ran in FP8 in FP8 at 1, 5 and 17 sequences too (rows no multiple of 16), with the
  // scales frozen, so the cached decode gives the full program's tokens over the window, and
  // the CPU's emulation of the same checkpoint agrees.
  SKIP_WITHOUT_GPU();
  if (gpuRecipeFor(theGpu().computeCapability) != Recipe::Fp8)
    GTEST_SKIP() << "no FP8 tensor cores on this GPU";
  for (Fp8Scaling scaling : {Fp8Scaling::Delayed, Fp8Scaling::Current}) {
    ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
    c.precision.recipe = Recipe::Fp8;
    c.precision.fp8Scaling = scaling;
    auto trainer = unwrap(Trainer::create(c, "", theGpu()));
    ASSERT_TRUE(trainer);
    for (int step = 0; step < 50; ++step)
      ASSERT_TRUE(std::isfinite(unwrap(trainer->step()).loss));
    Checkpoint checkpoint = unwrap(trainer->checkpoint());
    for (int64_t batch : {1, 5, 17}) {
      SCOPED_TRACE(fmt::format("{} scaling, batch {}", fp8ScalingName(scaling).str(), batch));
      std::vector<std::vector<int32_t>> prompts(size_t(batch), std::vector<int32_t>{3, 8, 13});
      prompts.back() = {5, 7};
      auto gpu = unwrap(Generator::create(c, checkpoint.tensors, batch, theGpu()));
      ASSERT_TRUE(gpu);
      auto cached = unwrap(gpu->generate(prompts, 8, {}));
      EXPECT_TRUE(gpu->stats().cached);
      EXPECT_EQ(cached, unwrap(gpu->generateWithoutCache(prompts, 8, {})));
      auto cpu = unwrap(Generator::create(c, checkpoint.tensors, batch, Device::cpu()));
      ASSERT_TRUE(cpu);
      // The CPU rounds the values the GPU stores in BF16 (ln1's and ln2's outputs, which the FP8
      // casts read): without it the casts part at FP8's rounding boundaries (1.5e-2 of their
      // RMS), and the logits 1.7e-2.
      ASSERT_FALSE(bool(cpu->roundAs(*gpu)));
      for (size_t b : {size_t(0), prompts.size() - 1})
        expectCpuAgrees(*gpu, *cpu, prompts[b], cached[b]);
    }
  }
}

TEST(GpuGeneration, ABf16PrefillOfManyRowsAndDecodeOfManyHeadsKeepTheWindowsAndTheCpusTokens) {
  // Forty prompts padded to the 48-position prefill (a multiple of 16, not of the attention's
  // tiles, not a power of two, shorter than the cache): its 1920 rows go to cuBLASLt, whose qkv
  // product writes BF16 rows that cuDNN's attention (where it runs) and the cache writes read in
  // place; the decode step's 160 (sequence, head) pairs, more than the SMs, read the caches
  // straight from memory, not through tiles. Every token of the cached run, and of the full
  // window's where the two part, is the CPU's best within the bound of expectCpuAgrees (the CPU
  // rounding the values the GPU stores in BF16). The two GPU runs are not compared token for
  // token: the prefill's last layer runs on the 40 rows the logits need, the window's on all
  // 1920, and the decode's attention sums in parts what the window's sums whole, each in BF16
  // products of other bits, and over 320 greedy choices of the tiny model's 64 tokens a near-tie
  // goes either way (seen on an H100 in session 44). On the CPU the two runs give the same
  // tokens (GenerateTest's cached and full programs).
  SKIP_WITHOUT_GPU();
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Bf16;
  c.seqLen = 64;
  auto graph = unwrap(buildGPT(c, 1, GPTOutput::Logits));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> weights = randomWeights(*graph, rng);
  std::vector<std::vector<int32_t>> prompts;
  for (int group = 0; group < 5; ++group)
    for (auto &prompt : randomPrompts(rng, {40, 33, 24, 17, 12, 9, 5, 1}, c.vocab))
      prompts.push_back(std::move(prompt));
  const int64_t batch = int64_t(prompts.size());
  auto gpu = unwrap(Generator::create(c, weights, batch, theGpu()));
  auto cpu = unwrap(Generator::create(c, weights, batch, Device::cpu()));
  ASSERT_TRUE(gpu && cpu);
  auto cached = unwrap(gpu->generate(prompts, 8, {}));
  EXPECT_EQ(gpu->stats().prefillLength, 48);
  EXPECT_TRUE(gpu->stats().cached);
  auto windowed = unwrap(gpu->generateWithoutCache(prompts, 8, {}));
  ASSERT_EQ(cached.size(), prompts.size());
  ASSERT_EQ(windowed.size(), prompts.size());
  ASSERT_FALSE(bool(cpu->roundAs(*gpu)));
  int parted = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    SCOPED_TRACE(fmt::format("sequence {} (a prompt of {})", b, prompts[b].size()));
    expectCpuAgrees(*gpu, *cpu, prompts[b], cached[b]);
    if (cached[b] != windowed[b]) {
      ++parted;
      expectCpuAgrees(*gpu, *cpu, prompts[b], windowed[b]);
    }
  }
  fmt::print("{} of {} sequences part from the full window's tokens\n", parted, prompts.size());
}

} // namespace
