// The optimizer family (optimizer.cuh): clipping, the LR schedule and AdamW, one op at a time
// (OptimizerGroups.cpp groups them over the parameter layout).
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

/// Clipping, the LR schedule and AdamW (optimizer.cuh).
llvm::Error emitOptimizer(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  e.uses("optimizer.cuh");
  switch (op.kind()) {
  case OpKind::ClipScale: {
    double maxNorm = *a.getFloat("max_norm");
    e.single("const float *sumSquares, float *clip",
             fmt::format("clipScale<{}>(sumSquares, clip, {})", boolText(maxNorm > 0), formatDouble(maxNorm)));
    return llvm::Error::success();
  }
  case OpKind::LRSchedule:
    e.lowering.constants = {*a.getFloat("lr"), *a.getFloat("min_lr"), double(*a.getInt("warmup")),
                            double(*a.getInt("steps"))};
    e.single("const int *step, float *lr, const double *schedule", "lrSchedule(step, lr, schedule)");
    return llvm::Error::success();
  case OpKind::AdamW: {
    int64_t n = outputType(op).numElements();
    e.elementwise(kAdamWParams, n, adamwCall(a, n, n, *a.getFloat("weight_decay")));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

const char *const kAdamWParams =
    "const float *param, const float *grad, const float *m, const float *v, const float *lr, "
    "const float *clip, const int *step, float *newParam, float *newM, float *newV";
const char *const kAdamWCopyParams =
    "const float *param, const float *grad, const float *m, const float *v, const float *lr, "
    "const float *clip, const int *step, F32Bf16Out newParam, float *newM, float *newV";

std::string adamwCall(const AttrMap &a, int64_t count, int64_t decayed, double decay) {
  return fmt::format("adamw<{}, {}>(param, grad, m, v, lr, clip, step, newParam, newM, newV, {}, {}, {}, {})", count,
                     decayed, formatDouble(*a.getFloat("beta1")), formatDouble(*a.getFloat("beta2")),
                     lit(*a.getFloat("eps")), formatDouble(decay));
}

} // namespace tgc
