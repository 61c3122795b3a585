// The loss family (loss.cuh): cross-entropy and NLL loss and their gradients.
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

/// Cross-entropy and NLL loss, and their gradients (loss.cuh).
llvm::Error emitLoss(const Op &op, Emitter &e) {
  e.uses("loss.cuh");
  switch (op.kind()) {
  case OpKind::CrossEntropy: {
    // Launch 0, one block per row: the row's loss, logsumexp - logit[target], into scratch
    // (and with dloss, the row's gradient). Launch 1, one block: the mean over rows in row order.
    int64_t vocab = operandType(op, 0).dim(-1), rows = operandType(op, 1).numElements();
    // Logits a GEMM wrote in BF16 (CudaProgram::bf16Rounding), or fp32.
    std::string logitsType = e.inputType(op.operand(0));
    if (op.numOperands() > 2) {
      std::string params = logitsType + " *logits, const int *targets, const float *dloss, float *loss, "
                           "float *dlogits, float *scratch";
      e.rowwise(0, params, rows,
                fmt::format("crossEntropyRowsWithGradient<{}, {}>(logits, targets, dloss, dlogits, scratch)", vocab,
                            rows));
      e.launch(1, params, 1, fmt::format("crossEntropyMean<{}>(loss, scratch)", rows));
      e.lowering.scratchFloats.push_back(2 * rows);
      return llvm::Error::success();
    }
    std::string params = logitsType + " *logits, const int *targets, float *loss, float *scratch";
    e.rowwise(0, params, rows, fmt::format("crossEntropyRows<{}>(logits, targets, scratch)", vocab));
    e.launch(1, params, 1, fmt::format("crossEntropyMean<{}>(loss, scratch)", rows));
    e.lowering.scratchFloats.push_back(2 * rows);
    return llvm::Error::success();
  }
  case OpKind::CrossEntropyBackward: {
    int64_t vocab = outputType(op).dim(-1), rows = operandType(op, 2).numElements();
    e.rowwise(0, fmt::format("const float *dloss, {} *logits, const int *targets, float *dlogits",
                             e.inputType(op.operand(1))),
              rows,
              fmt::format("crossEntropyBackward<{}, {}>(dloss, logits, targets, dlogits)", vocab, rows));
    return llvm::Error::success();
  }
  case OpKind::NLLLoss:
    e.rowwise(0, "const float *logp, const int *targets, float *loss", 1,
              fmt::format("nllLoss<{}, {}>(logp, targets, loss)", operandType(op, 0).dim(-1),
                          operandType(op, 1).numElements()));
    return llvm::Error::success();
  case OpKind::NLLLossBackward: {
    int64_t n = outputType(op).numElements();
    e.elementwise("const float *dloss, const float *logp, const int *targets, float *dlogp", n,
                  fmt::format("nllLossBackward<{}, {}, {}>(dloss, logp, targets, dlogp)", outputType(op).dim(-1),
                              operandType(op, 2).numElements(), n));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

} // namespace tgc
