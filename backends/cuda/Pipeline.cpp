#include "backends/cuda/Pipeline.h"
#include "support/Error.h"

#include "transforms/Pass.h"

#include <fmt/format.h>

namespace tgc {

std::vector<std::string> gpuPipeline(bool training, Recipe recipe, Fp8Scaling scaling) {
  // The fusions whose fused ops (and their gradients) the GPU backend lowers. Attention is
  // fused where its GEMMs run in BF16 (the bf16 and fp8 recipes: tensor-core kernels); in fp32
  // cuBLASLt's GEMMs and the softmax kernels are faster than the fused op's fp32 kernels (a
  // thread per row), so fp32 leaves it unfused.
  std::vector<std::string> lowered = {"fuse-softmax",       "fuse-layernorm-mlp",   "fuse-swiglu",
                                      "fuse-layernorm-linear", "fuse-residual-norm",
                                      "fuse-bias-activation", "fuse-bias", "fuse-cross-entropy"};
  if (recipe != Recipe::Fp32)
    lowered.push_back("fuse-attention");
  std::vector<std::string> passes;
  for (const std::string &p : training ? trainingPipeline() : forwardPipeline())
    if (!llvm::is_contained(fusionPasses(), p) || llvm::is_contained(lowered, p))
      passes.push_back(p);
  // Before the final dce: LayerNorm+Linear/MLP become their norm and GEMM ops (and their
  // gradients' norm gradients and GEMMs), and each norm then takes the residual add before it
  // (the LayerNorm fusions ran first and left those adds alone), each norm gradient the
  // residual gradient's add after it and the bias gradient that sums its dx, a BF16 GELU
  // gradient the product before it (fuse-dgelu), each other GELU gradient the bias gradient
  // before it, the loss its gradient; the attention keeps its head-major operands for its gradient; FP8 GEMMs go into
  // cuBLASLt's TN layout. In a decode step, the cache ops rotate the qkv they read (instead of rope ops
  // before them), the attention writes the caches it reads, and the
  // GEMV of one row normalises its own input (and applies the GELU after it), or, past one
  // row, applies the GELU after it; a BF16 fc1 of many rows that no gradient reads the h of (a
  // prompt, a recomputed layer) applies the GELU in its epilogue; an FP8 product adds its bias in its epilogue, and fc2's
  // quantize applies the GELU before it; a cast-transpose of a gradient sums its columns where
  // a bias gradient sums the same gradient, and an FP8 head's output gradient is made by the
  // quantize that reads the logits for the loss; with fp8_weights each weight's cast-transpose moves
  // after AdamW, its bytes kept as state; with --recompute a forward cast-transpose whose
  // input the backward keeps makes its transpose again in the backward instead of keeping it; a transpose that moves only dimensions of size 1
  // (a decode step's per-head ones around RoPE) becomes a reshape.
  passes.insert(passes.end() - 1, {"expand-layernorm-fused", "fuse-residual-norm", "fuse-norm-grad-add",
                                   "fuse-norm-bias-grad", "fuse-dgelu", "fuse-gelu-bias-grad", "fuse-cross-entropy-grad", "keep-attention-heads",
                                   "fuse-cache-rope", "fuse-kv-write", "fuse-residual-norm-gemv", "fuse-gemv-gelu",
                                   "fuse-gelu-epilogue", "legalize-fp8-gemm", "fuse-fp8-bias", "fuse-gelu-quantize",
                                   "fuse-quantize-bias-grad", "fuse-cross-entropy-quantize", "fp8-weights",
                                   "requantize-transposes", "unit-transposes"});
  // Block scaling's cast applies a GELU or SwiGLU (and their gradients) as it reads, sums a
  // bias gradient's columns and makes the loss's gradient, as the per-tensor casts do; its
  // transposes are quantized along their own rows, not requantized copies.
  if (recipe == Recipe::Fp8 && scaling == Fp8Scaling::Block)
    llvm::erase_if(passes, [](const std::string &p) { return p == "requantize-transposes"; });
  return passes;
}

int recipeCapability(Recipe recipe) { return recipe == Recipe::Fp8 ? 89 : recipe == Recipe::Bf16 ? 80 : 0; }

Recipe gpuRecipeFor(int computeCapability) {
  for (Recipe recipe : {Recipe::Fp8, Recipe::Bf16})
    if (computeCapability >= recipeCapability(recipe))
      return recipe;
  return Recipe::Fp32;
}

llvm::Error checkGpuRecipe(Recipe recipe, int computeCapability) {
  int cc = computeCapability, needed = recipeCapability(recipe);
  if (cc < needed)
    return stringError(fmt::format("error: the {} recipe needs a GPU of compute capability {}.{} or later; this "
                                   "one is {}.{} (--precision fp32, or --device cpu to emulate it)",
                                   recipeName(recipe).str(), needed / 10, needed % 10, cc / 10, cc % 10));
  return llvm::Error::success();
}

} // namespace tgc
