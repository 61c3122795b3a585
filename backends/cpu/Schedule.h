// The learning-rate schedule: linear warmup, then cosine decay to min_lr, as the interpreter's
// lr_schedule computes it. The GPU's lrSchedule kernel (backends/cuda/kernels/optimizer.cuh)
// computes the same in double; the training tests compare the two.
#pragma once

#include "ir/Types.h"

#include <cmath>

namespace tgc {

/// lr at 1-based `step`, from the attributes lr, min_lr, warmup and steps.
inline double learningRate(double lr, double minLr, int64_t warmup, int64_t steps, int64_t step) {
  if (warmup > 0 && step <= warmup)
    return lr * double(step) / double(warmup);
  if (steps <= warmup)
    return lr;
  double progress = std::min(1.0, double(step - warmup) / double(steps - warmup));
  return minLr + 0.5 * (lr - minLr) * (1.0 + std::cos(M_PI * progress));
}

inline double learningRate(const AttrMap &attrs, int64_t step) {
  return learningRate(*attrs.getFloat("lr"), *attrs.getFloat("min_lr"), *attrs.getInt("warmup"),
                      *attrs.getInt("steps"), step);
}

} // namespace tgc
