// The reduction family (reduce.cuh, embedding.cuh): column sums, sums of squares and the
// embedding's gradient.
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

/// Column sums, sums of squares and the embedding's gradient (reduce.cuh, embedding.cuh).
llvm::Error emitReduction(const Op &op, Emitter &e) {
  switch (op.kind()) {
  case OpKind::ReduceTo: {
    // Partial sums over chunks of kChunk rows, then the chunks in order.
    int64_t period = outputType(op).numElements(), repeats = operandType(op, 0).numElements() / period;
    // A thread sums 4 adjacent columns where the period is a multiple of 4 (reduce.cuh).
    int64_t threads = period % 4 == 0 ? period / 4 : period;
    int64_t chunks = (repeats + kChunk - 1) / kChunk, columnBlocks = (threads + kThreads - 1) / kThreads;
    e.uses("reduce.cuh");
    // x stored in BF16: a gradient cuDNN's attention or a DGELU epilogue wrote (countReaders).
    std::string params = fmt::format("{} *x, float *out, float *scratch", e.inputType(op.operand(0)));
    e.launch(0, params, chunks * columnBlocks,
             fmt::format("columnSumPartials<{}, {}, {}, {}>(x, scratch)", period, repeats, columnBlocks, kChunk));
    e.launch(1, params, columnTotalBlocks(period),
             fmt::format("columnSumTotals<{}, {}>(out, scratch)", period, chunks));
    e.lowering.scratchFloats.push_back(2 * chunks * period);
    return llvm::Error::success();
  }
  case OpKind::SumSquares: {
    int64_t count = operandType(op, 0).numElements(), blocks = sumSquaresBlocks(count);
    e.uses("reduce.cuh");
    const char *params = "const float *x, float *out, float *scratch";
    e.launch(0, params, blocks,
             fmt::format("sumSquaresPartials<{}, {}>(x, scratch)", count, (count + blocks - 1) / blocks));
    e.launch(1, params, 1, fmt::format("sumSquaresTotal<{}>(out, scratch)", blocks));
    e.lowering.scratchFloats.push_back(2 * blocks);
    return llvm::Error::success();
  }
  case OpKind::EmbeddingBackward: {
    // Rows table rows a block: each block reads every id once for all of them.
    constexpr int64_t kRows = 64;
    int64_t vocab = outputType(op).dim(0), dim = outputType(op).dim(1);
    e.uses("embedding.cuh");
    e.launch(0, "const float *dy, const int *ids, float *dtable", (vocab + kRows - 1) / kRows,
             fmt::format("embeddingBackward<{}, {}, {}, {}>(dy, ids, dtable)", dim, operandType(op, 1).numElements(),
                         vocab, kRows));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

} // namespace tgc
