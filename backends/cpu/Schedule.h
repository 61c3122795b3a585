// The learning-rate schedule of lr_schedule's attributes: support/ScalarMath.h's learningRate,
// which the GPU's lrSchedule kernel (backends/cuda/kernels/optimizer.cuh) runs too.
#pragma once

#include "ir/Types.h"
#include "support/ScalarMath.h"

namespace tgc {

/// lr at 1-based `step`, from the attributes lr, min_lr, warmup and steps.
inline double learningRate(const AttrMap &attrs, int64_t step) {
  return learningRate(*attrs.getFloat("lr"), *attrs.getFloat("min_lr"), double(*attrs.getInt("warmup")),
                      double(*attrs.getInt("steps")), double(step));
}

} // namespace tgc
