#include "backends/cpu/Pipeline.h"

#include "transforms/Pass.h"

namespace tgc {

std::vector<std::string> cpuPipeline(bool training) {
  return training ? trainingPipeline() : forwardPipeline();
}

PrecisionConfig resolveRecipeForCpu(PrecisionConfig precision) {
  if (precision.recipe == Recipe::Auto)
    precision.recipe = Recipe::Fp32;
  return precision;
}

} // namespace tgc
