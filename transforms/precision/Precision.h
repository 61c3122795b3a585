// What the precision passes share: the scaling state of a quantized tensor, and the rule that
// picks FP8 or BF16 for each GEMM under the fp8 recipe.
#pragma once

#include "ir/Graph.h"
#include "models/ModelConfig.h"
#include "support/Numerics.h"

namespace tgc {

/// How quantize ops take their scale: from the scaling state (delayed), or from the tensor's own
/// amax (current: the op's {scaling="current", margin=M}).
struct Fp8ScalingChoice {
  bool current = false;
  int64_t margin = 0;
};

/// Quantizes `x` to `format` with fresh scaling state named
/// `<prefix>.scale`, `.scale_inv` (f32[], start at 1), `.amax_history` (f32[L], zeros) and
/// `.saturations` (f32[], a running count). The fp8-update pass finds the state by these names
/// (under current scaling it still keeps the history and the count; the cast does not read the
/// scale). Returns the quantized tensor.
Value *quantizeWithState(Builder &b, Value *x, const std::string &prefix, Fp8Format format,
                         int64_t historyLength, Fp8ScalingChoice scaling);

struct GemmChoice {
  bool fp8 = false;
  std::string reason;
};

/// Under the fp8 recipe, FP8 for the GEMM of `site` (M x K x N) unless a keep_bf16 pattern
/// names it, a dimension is not a multiple of 16 (cuBLASLt's FP8 requirement), or K or N is
/// below fp8_min_dim. The default threshold, 2048, comes from fp8.md's H200 measurements: below
/// it the FP8 GEMM saves less time than a separate cast of its activation costs.
GemmChoice chooseGemmPrecision(const PrecisionConfig &config, llvm::StringRef site, int64_t m,
                               int64_t k, int64_t n);

/// The name the FP8 state of a linear layer is kept under, and keep_bf16 matches: its weight's
/// name without ".weight" (h0.attn.qkv); "lm_head" for the head, tied to wte or not.
std::string gemmSite(const Op &linear);

} // namespace tgc
