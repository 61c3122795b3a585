// What the CPU interpreter runs: the default pipelines (every fusion: the interpreter has a
// kernel for every op), and its recipe policy.
#pragma once

#include "models/ModelConfig.h"

#include <string>
#include <vector>

namespace tgc {

/// The passes the interpreter's training (or inference) program comes from under `precision`.
std::vector<std::string> cpuPipeline(bool training, const PrecisionConfig &precision);

/// The recipe a model file's "auto" means on the CPU interpreter: fp32. Explicit recipes stay;
/// the interpreter emulates BF16 and FP8 exactly.
PrecisionConfig resolveRecipeForCpu(PrecisionConfig precision);

} // namespace tgc
