// Host tensors of the CPU reference interpreter: fp32 storage for floating types, int32 for i32.
#pragma once

#include "ir/Types.h"

#include <vector>

namespace tgc {

struct Tensor {
  TensorType type;
  std::vector<float> data;     // floating-point element types
  std::vector<int32_t> ints;   // i32

  static Tensor zeros(const TensorType &type) {
    Tensor t;
    t.type = type;
    if (isFloat(type.dtype))
      t.data.assign(type.numElements(), 0.0f);
    else
      t.ints.assign(type.numElements(), 0);
    return t;
  }
  int64_t size() const { return type.numElements(); }
};

} // namespace tgc
