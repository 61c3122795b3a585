#include "backends/cpu/Pipeline.h"

#include "transforms/Pass.h"

namespace tgc {

std::vector<std::string> cpuPipeline(bool training, const PrecisionConfig &precision) {
  std::vector<std::string> passes = training ? trainingPipeline() : forwardPipeline();
  // Block scaling's wgrad reads its operands quantized along the rows (their own 1 x 128
  // blocks), which the transposes legalize-fp8-gemm makes are: the program the GPU would run.
  // Per-tensor scaling's transposes change no bit, so the CPU leaves them out.
  if (training && precision.recipe == Recipe::Fp8 && precision.fp8Scaling == Fp8Scaling::Block)
    passes.insert(passes.end() - 1, "legalize-fp8-gemm");
  // FP8 weights between steps: the weights' quantizes after AdamW (after the transposes, which
  // they then make too).
  if (training)
    passes.insert(passes.end() - 1, "fp8-weights");
  return passes;
}

PrecisionConfig resolveRecipeForCpu(PrecisionConfig precision) {
  if (precision.recipe == Recipe::Auto)
    precision.recipe = Recipe::Fp32;
  return precision;
}

} // namespace tgc
