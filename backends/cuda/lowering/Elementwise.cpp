// The elementwise family (elementwise.cuh; embedding.cuh's lookup): one launch over the
// elements, or two where gelu_backward also sums its columns into the bias gradient.
#include "backends/cuda/lowering/Families.h"
#include "ir/Rope.h"
#include "support/Error.h"

#include <cmath>
#include <fmt/format.h>

namespace tgc {

/// Elementwise ops (elementwise.cuh, embedding.cuh's lookup).
llvm::Error emitElementwise(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  int64_t n = outputType(op).numElements();
  e.uses(op.kind() == OpKind::Embedding ? "embedding.cuh" : "elementwise.cuh");
  switch (op.kind()) {
  case OpKind::Constant:
    e.elementwise("float *out", n, fmt::format("fill<{}>(out, {})", n, lit(*a.getFloat("value"))));
    break;
  case OpKind::Add:
  case OpKind::Mul:
    e.elementwise("const float *x, const float *y, float *out", n,
                  fmt::format("binary<{}, {}, {}>(x, y, out)", boolText(op.kind() == OpKind::Mul), n,
                              operandType(op, 1).numElements()));
    break;
  case OpKind::Scale:
    e.elementwise("const float *x, float *out", n,
                  fmt::format("scale<{}>(x, out, {})", n, lit(*a.getFloat("factor"))));
    break;
  case OpKind::Gelu:
    e.elementwise(std::string(e.inputType(op.operand(0))) + " *x, float *out", n, fmt::format("gelu<{}>(x, out)", n));
    break;
  case OpKind::Silu:
    e.elementwise("const float *x, float *out", n, fmt::format("silu<{}>(x, out)", n));
    break;
  case OpKind::GeluBackward:
    if (op.numResults() > 1) {
      // bias_grad: launch 0 writes dx and sums its columns over chunks of kChunk rows, as
      // reduce_to's first launch sums them (four columns a thread where they divide); launch 1
      // adds the chunks as reduce_to's second does: its bits.
      int64_t columns = outputType(op).dim(-1), rows = n / columns, chunks = (rows + kChunk - 1) / kChunk;
      int64_t per = columns % 4 == 0 ? 4 : 1, columnBlocks = (columns / per + kThreads - 1) / kThreads;
      e.uses("reduce.cuh");
      e.uses("elementwise.cuh"); // the op's header (the kernel-family tests)
      std::string params = fmt::format("const float *dy, {} *x, float *dx, float *dbias, float *scratch",
                                       e.inputType(op.operand(1)));
      e.launch(0, params, chunks * columnBlocks,
               fmt::format("geluBackwardColumnSums<{}, {}, {}, {}, {}>(dy, x, dx, scratch)", columns, rows, per,
                           columnBlocks, kChunk));
      e.launch(1, params, columnTotalBlocks(columns),
               fmt::format("columnSumTotals<{}, {}>(dbias, scratch)", columns, chunks));
      e.lowering.scratchFloats.push_back(2 * chunks * columns);
      break;
    }
    e.elementwise(fmt::format("const float *dy, {} *x, float *dx", e.inputType(op.operand(1))), n,
                  fmt::format("geluBackward<{}>(dy, x, dx)", n));
    break;
  case OpKind::SiluBackward:
    e.elementwise("const float *dy, const float *x, float *dx", n, fmt::format("siluBackward<{}>(dy, x, dx)", n));
    break;
  case OpKind::Swiglu: { // four outputs a thread where F divides by four
    int64_t f = outputType(op).dim(-1);
    e.elementwise(std::string(e.inputType(op.operand(0))) + " *h, float *out", f % 4 ? n : n / 4,
                  fmt::format("swiglu<{}, {}>(h, out)", n, f));
    break;
  }
  case OpKind::SwigluBackward: { // a thread per element of dy (four where F divides by four)
    int64_t f = outputType(op).dim(-1) / 2;
    e.elementwise(fmt::format("{} *dy, {} *h, float *dh", e.inputType(op.operand(0)), e.inputType(op.operand(1))),
                  f % 4 ? n / 2 : n / 8, fmt::format("swigluBackward<{}, {}>(dy, h, dh)", n / 2, f));
    break;
  }
  case OpKind::CausalMask:
    e.elementwise("const float *scores, float *out", n,
                  fmt::format("causalMask<{}, {}>(scores, out, {})", n, outputType(op).dim(-1),
                              lit(a.getFloat("fill").value_or(-HUGE_VAL))));
    break;
  case OpKind::Rope: {
    // Each pair of a row rotated by its position's cos and sin: the CPU's table (ir/Rope.h), as
    // the op's constants (doubles holding the floats exactly); at positions (a decode step's),
    // the table of the cache's length, each sequence's rows from its position.
    int64_t dh = outputType(op).dim(-1), rows = outputType(op).dim(-2);
    if (op.numOperands() > 1) {
      int64_t length = *a.getInt("length"), perSequence = n / dh / outputType(op).dim(0);
      std::vector<float> table = ropeTable(ropeOptions(a), length, dh);
      e.lowering.constants.assign(table.begin(), table.end());
      e.elementwise(std::string(e.inputType(op.operand(0))) + " *x, const int *positions, float *out, const double *table",
                    n / 2,
                    fmt::format("ropeAt<{}, {}, {}, {}, {}>(x, positions, out, table)", n / 2, dh / 2, rows, perSequence,
                                length));
      break;
    }
    std::vector<float> table = ropeTable(ropeOptions(a), rows, dh);
    e.lowering.constants.assign(table.begin(), table.end());
    e.elementwise(std::string(e.inputType(op.operand(0))) + " *x, float *out, const double *table", n / 2,
                  fmt::format("rope<{}, {}, {}>(x, out, table)", n / 2, dh / 2, rows));
    break;
  }
  case OpKind::Embedding:
    e.elementwise("const float *table, const int *ids, float *out", n,
                  fmt::format("embedding<{}, {}, {}>(table, ids, out)", n, operandType(op, 0).dim(0),
                              operandType(op, 0).dim(1)));
    break;
  default:
    return unsupported(op);
  }
  return llvm::Error::success();
}

} // namespace tgc
