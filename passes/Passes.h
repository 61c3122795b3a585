// Constructors of the individual passes; the pipeline (Pass.h) names them.
#pragma once

#include "passes/Pass.h"

namespace tgc {

std::unique_ptr<Pass> createCommonSubexpressionEliminationPass();
std::unique_ptr<Pass> createDeadCodeEliminationPass();
std::unique_ptr<Pass> createAutodiffPass();
std::unique_ptr<Pass> createAdamWPass(const TrainConfig &config);

} // namespace tgc
