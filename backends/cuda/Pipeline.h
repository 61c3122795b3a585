// What the GPU backend compiles, and its recipe policy (tgc info, --precision auto): FP8 from
// compute capability 8.9 (FP8 tensor cores), BF16 from 8.0, fp32 below.
#pragma once

#include "models/ModelConfig.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace tgc {

/// The passes of the GPU's training (or inference) program under `recipe`: the default
/// pipelines with the fusions the GPU lowers (attention under bf16 and fp8 only), then
/// expand-layernorm-fused (LayerNorm+Linear/MLP as the norm kernels and cuBLASLt GEMMs the GPU
/// runs them as), fuse-residual-norm again for the norms that exposes, and legalize-fp8-gemm.
/// Under block scaling the quantizes stay unfused (the GPU's block-scaled cast reads x alone)
/// and the FP8 products add no bias in their epilogue.
std::vector<std::string> gpuPipeline(bool training, Recipe recipe, Fp8Scaling scaling = Fp8Scaling::Delayed);

/// The compute capability (major*10+minor) a recipe needs on the GPU: 89 for fp8, 80 for bf16,
/// 0 for fp32.
int recipeCapability(Recipe recipe);
/// What --precision auto picks on a GPU of compute capability major*10+minor: the most compact
/// recipe it runs.
Recipe gpuRecipeFor(int computeCapability);
/// An error naming what the recipe needs when a GPU of that compute capability cannot run it.
llvm::Error checkGpuRecipe(Recipe recipe, int computeCapability);

} // namespace tgc
