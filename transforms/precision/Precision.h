// What the precision passes share: the scaling state of a quantized tensor, and the rule that
// picks FP8 or BF16 for each GEMM under the fp8 recipe.
#pragma once

#include "ir/Attributes.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"
#include "support/Numerics.h"

namespace tgc {

/// How quantize ops take their scale: from the scaling state (delayed), or from the tensor's own
/// amax (current: the op's {scaling="current", margin=M}), or from each block's (block: the op's
/// {scaling="block", block_rows=R}).
struct Fp8ScalingChoice {
  bool current = false;
  int64_t margin = 0;
  int64_t blockRows = 0; // block scaling's blocks: 1 (1 x 128) or 128 (128 x 128); 0: not block
};

/// Quantizes `x` to `format` with fresh scaling state named
/// `<prefix>.scale`, `.scale_inv` (f32[], start at 1), `.amax_history` (f32[L], zeros) and
/// `.saturations` (f32[], a running count). The fp8-update pass finds the state by these names
/// (under current scaling it still keeps the history and the count; the cast does not read the
/// scale). Returns the quantized tensor.
Value *quantizeWithState(Builder &b, Value *x, const std::string &prefix, Fp8Format format,
                         int64_t historyLength, Fp8ScalingChoice scaling);

/// The scaling state quantizeWithState makes, for a tensor quantized inside an op (FP8
/// attention's probabilities and dS): its scale and scale_inv.
std::pair<Value *, Value *> scalingState(Builder &b, const std::string &prefix, int64_t historyLength);

/// Why cuDNN's FP8 attention cannot take an attention of `heads` at head dimension `headDim`
/// (grouped-query heads, rope inside the op, a head dimension not a multiple of 16), or
/// nothing where it can.
std::optional<std::string> fp8AttentionRefusal(const AttentionHeads &heads, int64_t headDim);

/// Where the FP8 state of an attention is kept: "<layer>.attn.sdpa" ("h0.attn.context.flat"
/// -> "h0.attn.sdpa"), or its output's name followed by ".sdpa".
std::string attentionSite(const Op &attention);
/// The FP8 state prefix of an FP8 attention's `role`: "<site>.fp8.<role>", for q, k and v
/// ("qkv"), the probabilities ("s"), dout ("dout") and dS ("dp").
std::string attentionStatePrefix(llvm::StringRef site, llvm::StringRef role);

struct GemmChoice {
  bool fp8 = false;
  std::string reason;
};

/// Under the fp8 recipe, FP8 for the GEMM of `site` (M x K x N) where it is legal, as
/// Transformer Engine's fp8_autocast does: BF16 where a keep_bf16 pattern names it, K or N is not
/// a multiple of 16 (cuBLASLt's FP8 products), a training program's M is not (its weight
/// gradient contracts over the rows), K or N is below fp8_min_dim, or fp8_layers is set and names
/// no pattern for it. auto's choice is fp8_layers (with the times it measured as the reason).
/// M decides nothing in an inference program (forwardOnly): a layer keeps the precision it
/// trained in at any batch.
GemmChoice chooseGemmPrecision(const PrecisionConfig &config, llvm::StringRef site, int64_t m,
                               int64_t k, int64_t n);

/// Whether `site` matches one of the glob `patterns` (an invalid pattern matches nothing: the
/// model reader rejects them).
const std::string *matchingPattern(const std::vector<std::string> &patterns, llvm::StringRef site);

/// The prefix of an op's scaling state from its scale operand (a quantize's operand 1, FP8
/// attention's S and dP scales): a state named "<prefix>.scale" (assign-precision's,
/// program::fp8StatePrefix), or an error naming the op and `pass`.
llvm::Expected<std::string> scalingStatePrefix(const Op &op, llvm::StringRef pass, unsigned scaleOperand = 1);

/// The fp8_layers pattern that names every layer of `site`'s kind: h0.mlp.fc1 -> h*.mlp.fc1;
/// a site outside the blocks (lm_head) names itself.
std::string layerPattern(llvm::StringRef site);

/// The name the FP8 state of a linear layer is kept under, and keep_bf16 matches: its weight's
/// name without ".weight" (h0.attn.qkv); "lm_head" for the head, tied to wte or not.
std::string gemmSite(const Op &linear);

} // namespace tgc
