// The sample op and argmax on the CPU: support/Sampling.h's definitions, row by row.
#include "backends/cpu/CpuKernels.h"
#include "support/Sampling.h"

namespace tgc::cpu {

llvm::Error evalSample(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &logits = *in[0], &counters = *in[1], &sampling = *in[2], &seed = *in[3];
  int64_t n = logits.type.dim(-1), stride = attrs.getInt("stride").value_or(0);
  const SamplingParams params = unpackSampling(sampling.data.data(), seed.ints.data());
  for (int64_t row = 0; row < out[0].size(); ++row)
    out[0].ints[row] = sampleRow(&logits.data[row * n], n, params, row, counters.ints[row] - row * stride);
  return llvm::Error::success();
}

llvm::Error evalArgmax(const AttrMap &, Operands in, Results out) {
  const Tensor &x = *in[0];
  int64_t n = x.type.dim(-1);
  for (int64_t row = 0; row < out[0].size(); ++row)
    out[0].ints[row] = firstLargest(&x.data[row * n], n);
  return llvm::Error::success();
}

} // namespace tgc::cpu
