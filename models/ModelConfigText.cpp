// formatModelConfig: a config as the model file that reads back to it (checkpoints carry it,
// tgc compile and report print it).
#include "models/ModelConfig.h"
#include "ir/Types.h"

#include <fmt/format.h>

namespace tgc {

static std::string quotedList(const std::vector<std::string> &items) {
  std::string out;
  for (const std::string &item : items) {
    std::string quoted = "\"";
    for (char ch : item) {
      if (ch == '"' || ch == '\\')
        quoted += '\\';
      quoted += ch;
    }
    out += (out.empty() ? "" : ", ") + quoted + "\"";
  }
  return out;
}

/// The model file's rope_scaling lines, where there is a scaling.
static std::string ropeScalingText(const ModelConfig &c) {
  if (!c.ropeScaling)
    return "";
  const RopeScaling &s = *c.ropeScaling;
  return fmt::format("  rope_scaling: llama3\n  rope_factor: {}\n  rope_low_freq_factor: {}\n"
                     "  rope_high_freq_factor: {}\n  rope_original_length: {}\n",
                     formatDouble(s.factor), formatDouble(s.lowFreq), formatDouble(s.highFreq),
                     formatDouble(s.originalLength));
}

/// recompute_layers, memory_budget and shard where they are set.
static std::string recomputeText(const TrainConfig &t) {
  std::string text;
  if (t.recompute && !t.recomputeAuto && t.recomputeLayers >= 0)
    text += fmt::format("  recompute_layers: {}\n", t.recomputeLayers);
  if (t.recomputeAuto && t.memoryBudgetGiB > 0)
    text += fmt::format("  memory_budget: {}\n", t.memoryBudgetGiB);
  if (t.shardOptimizer)
    text += t.shardGradients ? "  shard: gradients\n" : "  shard: optimizer\n";
  if (t.bf16GradientReduce)
    text += "  grad_reduce: bf16\n";
  return text;
}

std::string formatModelConfig(const ModelConfig &c) {
  auto num = [](double v) { return formatDouble(v); };
  const TrainConfig &t = c.train;
  const PrecisionConfig &p = c.precision;
  return fmt::format(
      "name: {}\n"
      "model:\n  vocab: {}\n  seq_len: {}\n  d_model: {}\n  heads: {}\n  layers: {}\n"
      "  ffn: {}\n  norm: {}\n  activation: {}\n  bias: {}\n  tie_embeddings: {}\n"
      "  norm_eps: {}\n  position: {}\n{}{}"
      "train:\n  batch: {}\n  lr: {}\n  steps: {}\n  warmup: {}\n  weight_decay: {}\n"
      "  beta1: {}\n  beta2: {}\n  eps: {}\n  grad_clip: {}\n  min_lr_ratio: {}\n"
      "  decay_embeddings: {}\n  recompute: {}\n{}  seed: {}\n"
      "data:\n  min_step: {}\n  max_step: {}\n"
      "precision:\n  recipe: {}\n  fp8_format: {}\n  fp8_scaling: {}\n  margin: {}\n  amax_history_len: {}\n"
      "  amax_compute_algo: {}\n  keep_bf16: [{}]\n  fp8_min_dim: {}\n{}{}{}",
      c.name, c.vocab, c.seqLen, c.dModel, c.heads, c.layers, c.ffn,
      c.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm",
      c.activation == ActivationKind::Gelu ? "gelu" : "swiglu", c.bias, c.tieEmbeddings,
      num(c.normEps), c.position == PositionKind::Rope ? "rope" : "learned",
      c.position == PositionKind::Rope ? fmt::format("  rope_theta: {}\n", num(c.ropeTheta)) + ropeScalingText(c)
                                       : std::string(),
      c.kvHeads > 0 ? fmt::format("  kv_heads: {}\n", c.kvHeads) : std::string(), t.batch, num(t.lr), t.steps, t.warmup, num(t.weightDecay), num(t.beta1),
      num(t.beta2), num(t.eps), num(t.gradClip), num(t.minLrRatio), t.decayEmbeddings, t.recomputeAuto ? "auto" : t.recompute ? "true" : "false",
      recomputeText(t), t.seed,
      c.data.minStep, c.data.maxStep, recipeName(p.recipe).str(), fp8FormatName(p.fp8Format).str(), fp8ScalingName(p.fp8Scaling).str(), p.margin, p.amaxHistoryLen,
      p.amaxComputeAlgo, quotedList(p.keepBf16), p.fp8MinDim,
      p.fp8Layers ? fmt::format("  fp8_layers: [{}]\n", quotedList(*p.fp8Layers)) : std::string(),
      p.fp8Weights ? "  fp8_weights: true\n" : "", p.fp8Attention ? "  fp8_attention: true\n" : "");
}

} // namespace tgc
