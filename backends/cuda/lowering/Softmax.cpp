// The softmax family (softmax.cuh): softmax, log-softmax, the causal softmax of scaled scores
// and their gradients.
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

/// Softmax, log-softmax and the causal softmax of scaled scores, and their gradients
/// (softmax.cuh).
llvm::Error emitSoftmax(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  const TensorType &out = outputType(op);
  int64_t d = out.dim(-1), rows = rowsOf(out);
  e.uses("softmax.cuh");
  switch (op.kind()) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
    e.rowwise(0, "const float *x, float *out", rows,
              fmt::format("softmax<{}, {}>(x, out)", boolText(op.kind() == OpKind::LogSoftmax), d));
    return llvm::Error::success();
  case OpKind::MaskedSoftmax:
    e.rowwise(0, "const float *x, float *out", rows,
              fmt::format("maskedSoftmax<{}>(x, out, {})", d, lit(*a.getFloat("scale"))));
    return llvm::Error::success();
  case OpKind::SoftmaxBackward:
  case OpKind::LogSoftmaxBackward:
  case OpKind::MaskedSoftmaxBackward: {
    bool masked = op.kind() == OpKind::MaskedSoftmaxBackward;
    e.rowwise(0, "const float *dy, const float *y, float *dx", rows,
              fmt::format("softmaxBackward<{}, {}, {}>(dy, y, dx, {})",
                          boolText(op.kind() == OpKind::LogSoftmaxBackward), boolText(masked), d,
                          masked ? lit(*a.getFloat("scale")) : "1.0f"));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

} // namespace tgc
