// The bytes TGC_GPU_PROFILE=bandwidth counts for each op (lowering/Traffic.h), on the tiny
// model's BF16 decode step and prefill as the GPU lowers them: a product's weight by its BF16
// copy, an embedding by its rows, the KV caches by the rows read and written.
#include "backends/cuda/Pipeline.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/lowering/Traffic.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "tests/TestUtil.h"

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

Lowered lowerTiny(GPTOutput output, int64_t batch, int64_t length = 0) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
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
  Lowered l = lowerTiny(GPTOutput::Decode, 2);
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
  Lowered l = lowerTiny(GPTOutput::Prefill, 2, 16);
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

} // namespace
