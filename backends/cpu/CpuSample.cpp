// The sample op on the CPU: support/Sampling.h's definition, row by row.
#include "backends/cpu/CpuKernels.h"
#include "support/Sampling.h"

namespace tgc::cpu {

llvm::Error evalSample(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &logits = *in[0], &counters = *in[1], &sampling = *in[2], &seed = *in[3];
  int64_t n = logits.type.dim(-1), stride = attrs.getInt("stride").value_or(0);
  SamplingParams params;
  params.temperature = sampling.data[0];
  params.topP = sampling.data[1];
  params.topK = int64_t(sampling.data[2]);
  params.seed = uint64_t(uint32_t(seed.ints[0])) | uint64_t(uint32_t(seed.ints[1])) << 32;
  for (int64_t row = 0; row < out[0].size(); ++row)
    out[0].ints[row] = sampleRow(&logits.data[row * n], n, params, row, counters.ints[row] - row * stride);
  return llvm::Error::success();
}

} // namespace tgc::cpu
