// The bytes TGC_GPU_PROFILE=bandwidth counts for each op (lowering/Traffic.h), on the tiny
// model's BF16 decode step and prefill as the GPU lowers them: a product's weight by its BF16
// copy, an embedding by its rows, the KV caches by the rows read and written; and which weight
// each of the decode step's products asks L2 for ahead of its reader (OpLowering::prefetch).
#include "backends/cuda/lowering/Traffic.h"
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Families.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "models/GPTBuilder.h"
#include "tests/TestUtil.h"
#include "transforms/Pass.h"

using namespace tgc;
using namespace tgc::test;

namespace {

struct Lowered {
  std::unique_ptr<Graph> graph;
  CudaProgram program;
  const Op *find(OpKind kind, llvm::StringRef result) const {
    for (const Op *op : graph->ops())
      if (op->kind() == kind && op->result()->name() == result)
        return op;
    ADD_FAILURE() << "no " << result.str();
    return nullptr;
  }
};

Lowered lower(const char *model, GPTOutput output, int64_t batch, int64_t length = 0) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(model)));
  c.precision.recipe = Recipe::Bf16;
  Lowered l;
  l.graph = unwrap(buildGPT(c, batch, output, length));
  PipelineOptions options;
  options.passOptions.precision = c.precision;
  options.passOptions.precision.forwardOnly = true;
  auto pipeline = unwrap(PassPipeline::create(gpuPipeline(/*training=*/false, Recipe::Bf16), options));
  EXPECT_FALSE(bool(pipeline.run(*l.graph)));
  l.program = unwrap(lowerToCuda(*l.graph));
  return l;
}

TEST(Traffic, ADecodeStepsProductsEmbeddingsAndAttentionsMoveWhatTheyRead) {
  Lowered l = lower("models/tiny.yaml", GPTOutput::Decode, 2);
  const CudaProgram &p = l.program;
  auto stored = [&](const Op &op, std::initializer_list<unsigned> operands, unsigned results) {
    int64_t bytes = 0;
    for (unsigned i : operands)
      bytes += storedBytesOf(p, op.operand(i));
    for (unsigned r = 0; r < results; ++r)
      bytes += storedBytesOf(p, op.result(r));
    return bytes;
  };
  // The token embedding: two rows of the fp32 table [64, 64], not the table.
  const Op *embedding = l.find(OpKind::Embedding, "tok_emb");
  ASSERT_TRUE(embedding);
  EXPECT_EQ(opTraffic(p, *embedding, 0), 2 * 64 * 4 + stored(*embedding, {1}, 1));
  // The qkv product: its weight [192, 64] by the BF16 copy, its fp32 bias, input and output.
  const Op *qkv = l.find(OpKind::MatMulBias, "h0.attn.qkv.out");
  ASSERT_TRUE(qkv);
  EXPECT_EQ(opTraffic(p, *qkv, 0), 192 * 64 * 2 + stored(*qkv, {0, 2}, 1));
  // The attention: 10 rows of each BF16 cache [2, 32, 64] read, a row a sequence written, and
  // neither cache counted whole; qkv, the positions and the context as stored.
  const Op *attention = l.find(OpKind::DecodeAttention, "h0.attn.context.flat");
  ASSERT_TRUE(attention);
  ASSERT_EQ(storedBytesOf(p, attention->operand(1)), 2 * 32 * 64 * 2);
  const int64_t row = 64 * 2;
  EXPECT_EQ(opTraffic(p, *attention, 10), 2 * 10 * row + 2 * 2 * row + stored(*attention, {0, 3}, 1));
  EXPECT_EQ(opTraffic(p, *attention, 20) - opTraffic(p, *attention, 10), 2 * 10 * row);
}

TEST(Traffic, APrefillsCacheWriteMovesTheRowsOfItsTokens) {
  Lowered l = lower("models/tiny.yaml", GPTOutput::Prefill, 2, 16);
  const Op *write = nullptr;
  for (const Op *op : l.graph->ops())
    if (op->kind() == OpKind::KvWrite && !write)
      write = op;
  ASSERT_TRUE(write);
  // 2 sequences x 16 tokens written into each cache, and the qkv rows read.
  const int64_t rowBytes = storedBytesOf(l.program, write->operand(0)) / (2 * 32);
  EXPECT_EQ(opTraffic(l.program, *write, 0), 2 * 2 * 16 * rowBytes + storedBytesOf(l.program, write->operand(2)));
  // The positions' embeddings: the first 16 rows of wpe [32, 64] sliced, read and written once.
  const Op *positions = l.find(OpKind::Slice, "pos_emb");
  ASSERT_TRUE(positions);
  EXPECT_EQ(opTraffic(l.program, *positions, 0), 2 * 16 * 64 * 4);
}

/// The parameter each op reading a BF16 weight copy reads, and the one it prefetches, in order.
struct Reader {
  std::string weight, prefetch;
  int64_t bytes;
};
std::vector<Reader> readers(const Lowered &l) {
  std::vector<Reader> list;
  const std::vector<Op *> ops = l.graph->ops();
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpLowering &lowering = l.program.lowering[i];
    if (lowering.kind != OpLowering::Kernels || lowering.bf16Weights.empty())
      continue;
    EXPECT_TRUE(lowering.prefetchParams) << ops[i]->name().str();
    list.push_back({ops[i]->operand(lowering.bf16Weights.front())->name(),
                    lowering.prefetch ? lowering.prefetch->name() : "", lowering.prefetchBytes});
  }
  return list;
}

TEST(Prefetch, EachProductOfADecodeStepAsksL2ForTheNextProductsWeight) {
  ::setenv("TGC_PREFETCH_MB", "16", 1);
  Lowered l = lower("models/tiny.yaml", GPTOutput::Decode, 1);
  ::unsetenv("TGC_PREFETCH_MB");
  std::vector<Reader> list = readers(l);
  // Two layers' qkv, proj, fc1 and fc2, then the head: each prefetches the next's weight, all
  // of it (the tiny model's are far below 16 MiB), and the head the first layer's qkv (the next
  // step's first product).
  ASSERT_EQ(list.size(), 9u);
  EXPECT_EQ(list[0].weight, "h0.attn.qkv.weight");
  EXPECT_EQ(list[0].prefetch, "h0.attn.proj.weight");
  EXPECT_EQ(list[0].bytes, 64 * 64 * 2);
  EXPECT_EQ(list[2].prefetch, "h0.mlp.fc2.weight");
  EXPECT_EQ(list[2].bytes, 64 * 256 * 2);
  EXPECT_EQ(list[8].weight, "lm_head.weight");
  EXPECT_EQ(list[8].prefetch, "h0.attn.qkv.weight");
  for (size_t k = 0; k + 1 < list.size(); ++k)
    EXPECT_EQ(list[k].prefetch, list[k + 1].weight) << k;
  // The kernels take the two pointers last and pass them to the product.
  EXPECT_NE(l.program.source.find("const unsigned short *next, const unsigned short *nextEnd)"), std::string::npos);
  EXPECT_NE(l.program.source.find("L2Prefetch{next, nextEnd})"), std::string::npos);
}

TEST(Prefetch, TheBoundCutsALargeWeightAndZeroOrNoneTurnsItOff) {
  // gpt2-124m's products: its tied head (wte [50257, 768], 77 MB in BF16) is cut to the bound,
  // 1 MiB, as is every weight of 1 MiB or more (qkv's 3.5 MB); proj's 1.2 MB is 1 MiB too.
  ::setenv("TGC_PREFETCH_MB", "1", 1);
  std::vector<Reader> list = readers(lower("models/gpt2-124m.yaml", GPTOutput::Decode, 1));
  ASSERT_EQ(list.size(), 12u * 4 + 1);
  EXPECT_EQ(list[47].prefetch, "wte");
  for (const Reader &r : list)
    EXPECT_EQ(r.bytes, int64_t(1) << 20) << r.weight;
  for (const char *off : {"0", "-3", "none"}) { // (each said on stderr: not a count)
    ::setenv("TGC_PREFETCH_MB", off, 1);
    for (const Reader &r : readers(lower("models/tiny.yaml", GPTOutput::Decode, 1)))
      EXPECT_EQ(r.prefetch, "") << off << " " << r.weight;
  }
  // Unset (the default): no prefetch, the kernels' pointers null.
  ::unsetenv("TGC_PREFETCH_MB");
  for (const Reader &r : readers(lower("models/tiny.yaml", GPTOutput::Decode, 1)))
    EXPECT_EQ(r.prefetch, "") << r.weight;
}

} // namespace
