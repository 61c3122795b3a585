// The norm family (norms.cuh): LayerNorm and RMSNorm, the residual add before them, and their
// gradients.
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

/// LayerNorm and RMSNorm, with the residual add before them, and their gradients (norms.cuh).
llvm::Error emitNorm(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  std::string eps = formatDouble(*a.getFloat("eps"));
  e.uses("norms.cuh");
  switch (op.kind()) {
  case OpKind::LayerNorm:
  case OpKind::RMSNorm: {
    bool layer = op.kind() == OpKind::LayerNorm;
    int64_t d = outputType(op).dim(-1);
    int64_t rows = rowsOf(outputType(op));
    e.launch(0, layer ? "const float *x, const float *gamma, const float *beta, float *out"
                      : "const float *x, const float *gamma, float *out",
             normBlocks(rows, d),
             fmt::format("layerNorm<{}, {}, {}>(x, gamma, {}, out, {})", boolText(layer), d, rows,
                         layer ? "beta" : "nullptr", eps));
    return llvm::Error::success();
  }
  case OpKind::ResidualNorm: {
    // A warp per row (a block where rows are wider than 1024): the residual sum (the stream goes
    // on) and its normalisation.
    bool layer = isLayerNorm(a);
    int64_t d = outputType(op).dim(-1), rows = rowsOf(outputType(op));
    // y in BF16 where its product writes it so (CudaProgram::bf16Rounding).
    std::string y = fmt::format("const float *x, {} *y, const float *gamma, ", e.inputType(op.operand(1)));
    e.launch(0, y + (layer ? "const float *beta, float *sum, float *normed" : "float *sum, float *normed"),
             normBlocks(rows, d),
             fmt::format("residualNorm<{}, {}, {}>(x, y, gamma, {}, sum, normed, {})", boolText(layer), d, rows,
                         layer ? "beta" : "nullptr", eps));
    return llvm::Error::success();
  }
  case OpKind::LayerNormBackward:
  case OpKind::RMSNormBackward: {
    // Launch 0, a warp per row (a block where rows are wider than 1024): the rows' statistics.
    // Launch 1, a thread per feature (four where they are a multiple of four) over chunks of
    // rows: dx, and each chunk's dgamma (and dbeta). Launch 2: the chunks in order.
    bool layer = op.kind() == OpKind::LayerNormBackward;
    const TensorType &x = operandType(op, 1);
    int64_t d = x.dim(-1), rows = rowsOf(x);
    // Chunks of 64 rows where that leaves 256 blocks (a wave of two blocks a multiprocessor),
    // else of 32: at gpt2-124m's 16384 rows of 768, chunks of 64 made launch 1 one wave instead of
    // two and halved the partial sums launch 2 reads (a step 0.4% shorter on an H100).
    int64_t perThread = d % 4 == 0 ? 4 : 1, columnBlocks = (d + kThreads * perThread - 1) / (kThreads * perThread);
    const int64_t chunkRows = rows * columnBlocks >= 256 * 64 ? 64 : 32;
    int64_t chunks = (rows + chunkRows - 1) / chunkRows;
    bool accumulate = op.numOperands() > 3; // the residual gradient dres, added to dx
    bool sums = op.numResults() > 3;        // dx_sums: dx's column sums too
    // dy in BF16 where its product writes it so (CudaProgram::bf16Rounding).
    std::string params = fmt::format("{} *dy, const float *x, const float *gamma, ", e.inputType(op.operand(0))) +
                         (accumulate ? "const float *dres, " : "") +
                         (layer ? "float *dx, float *dgamma, float *dbeta" : "float *dx, float *dgamma") +
                         (sums ? ", float *dsums" : "") + ", float *scratch";
    e.launch(0, params, normBlocks(rows, d),
             fmt::format("normBackwardStats<{}, {}, {}>(dy, x, gamma, scratch, {})", boolText(layer), d, rows, eps));
    e.launch(1, params, chunks * columnBlocks,
             fmt::format("normBackwardTile<{}, {}, {}, {}, {}>(dy, x, gamma, {}, dx, scratch)", d, rows, chunkRows,
                         boolText(accumulate), boolText(sums), accumulate ? "dres" : "nullptr"));
    e.launch(2, params, columnTotalBlocks(d),
             fmt::format("normBackwardColumns<{}, {}, {}, {}, {}>(scratch, dgamma, {}, {})", boolText(layer), d, rows,
                         chunks, boolText(sums), layer ? "dbeta" : "(float *)nullptr",
                         sums ? "dsums" : "(float *)nullptr"));
    // Scratch: four doubles a row (its statistics), then two a feature for each chunk (three
    // with dx's sums).
    e.lowering.scratchFloats.push_back(8 * rows + (sums ? 6 : 4) * chunks * d);
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

} // namespace tgc
