// A model's settings: their ranges and choices, the recipes' names and the command line's
// overrides. The model file's reader is ModelConfigReader.cpp.
#include "models/ModelConfig.h"

#include "ir/Types.h"
#include "support/Error.h"

#include <fmt/format.h>
#include <type_traits>

namespace tgc {

int64_t ModelConfig::numParams() const {
  int64_t d = dModel, normParams = norm == NormKind::LayerNorm ? 2 * d : d;
  int64_t fc1Out = activation == ActivationKind::SwiGLU ? 2 * ffn : ffn;
  int64_t qkv = qkvWidth();
  int64_t perLayer = 2 * normParams + qkv * d + d * d + fc1Out * d + ffn * d;
  if (bias)
    perLayer += qkv + d + fc1Out + d;
  int64_t positions = position == PositionKind::Learned ? seqLen * d : 0;
  int64_t total = vocab * d + positions + layers * perLayer + normParams;
  if (!tieEmbeddings)
    total += vocab * d;
  return total;
}

namespace {

struct NumericSetting {
  const char *key;
  SettingRange range;
};
constexpr double kPow2(int n) { return double(int64_t(1) << n); }
const NumericSetting kNumericSettings[] = {
    {"vocab", {2, kPow2(20)}},        {"seq_len", {2, kPow2(16)}},
    {"d_model", {1, kPow2(16)}},      {"heads", {1, kPow2(10)}},
    {"layers", {1, kPow2(10)}},       {"ffn", {1, kPow2(20)}},
    {"norm_eps", {1e-12, 0.1}},       {"batch", {1, kPow2(16)}},
    {"lr", {1e-12, 10}},              {"steps", {0, kPow2(40)}},
    {"warmup", {0, kPow2(40)}},       {"weight_decay", {0, 10}},
    {"beta1", {0, 0.999999}},         {"beta2", {0, 0.999999999}},
    {"eps", {1e-30, 1}},              {"grad_clip", {0, 1e9}},
    {"min_lr_ratio", {0, 1}},         {"margin", {0, 64}},
    {"amax_history_len", {1, kPow2(16)}}, {"fp8_min_dim", {0, double(kMaxDim)}},
    {"kv_heads", {1, kPow2(10)}},     {"rope_theta", {1.0001, 1e9}},
    {"rope_factor", {1, 1024}},       {"rope_low_freq_factor", {1e-3, 1e3}},
    {"rope_high_freq_factor", {1e-3, 1e3}}, {"rope_original_length", {1, kPow2(24)}},
    {"recompute_layers", {0, kPow2(10)}}, {"memory_budget", {0.001, 1e6}},
};

struct ChoiceSetting {
  const char *key;
  std::vector<llvm::StringRef> choices;
};
const ChoiceSetting kChoiceSettings[] = {
    {"norm", {"layernorm", "rmsnorm"}},
    {"activation", {"gelu", "swiglu"}},
    {"position", {"learned", "rope"}},
    {"rope_scaling", {"llama3"}},
    {"recipe", {"auto", "fp32", "bf16", "fp8"}},
    {"fp8_format", {"hybrid", "e4m3"}},
    {"amax_compute_algo", {"max", "most_recent"}},
    {"fp8_scaling", {"delayed", "current", "mixed", "block"}},
    {"shard", {"none", "optimizer", "gradients"}},
    {"grad_reduce", {"fp32", "bf16"}},
};

} // namespace

llvm::StringRef recipeName(Recipe recipe) {
  switch (recipe) {
  case Recipe::Auto:
    return "auto";
  case Recipe::Fp32:
    return "fp32";
  case Recipe::Bf16:
    return "bf16";
  case Recipe::Fp8:
    return "fp8";
  }
  llvm_unreachable("a recipe without a name");
}

std::optional<Recipe> parseRecipe(llvm::StringRef name) {
  for (Recipe r : {Recipe::Auto, Recipe::Fp32, Recipe::Bf16, Recipe::Fp8})
    if (name == recipeName(r))
      return r;
  return std::nullopt;
}

llvm::StringRef fp8FormatName(Fp8Formats formats) { return formats == Fp8Formats::Hybrid ? "hybrid" : "e4m3"; }

llvm::StringRef fp8ScalingName(Fp8Scaling scaling) {
  switch (scaling) {
  case Fp8Scaling::Delayed:
    return "delayed";
  case Fp8Scaling::Current:
    return "current";
  case Fp8Scaling::Mixed:
    return "mixed";
  case Fp8Scaling::Block:
    return "block";
  }
  return "delayed";
}

std::optional<Fp8Scaling> parseFp8Scaling(llvm::StringRef name) {
  for (Fp8Scaling s : {Fp8Scaling::Delayed, Fp8Scaling::Current, Fp8Scaling::Mixed, Fp8Scaling::Block})
    if (name == fp8ScalingName(s))
      return s;
  return std::nullopt;
}

SettingRange settingRange(llvm::StringRef key) {
  for (const NumericSetting &s : kNumericSettings)
    if (key == s.key)
      return s.range;
  llvm_unreachable("a numeric setting without a range");
}

llvm::ArrayRef<llvm::StringRef> settingChoices(llvm::StringRef key) {
  for (const ChoiceSetting &s : kChoiceSettings)
    if (key == s.key)
      return s.choices;
  llvm_unreachable("a choice setting without choices");
}

namespace {

llvm::Error flagError(const std::string &message) { return stringError("error: " + message); }

/// `value` of the setting `key` set by --`flag`, checked against the table.
template <typename T>
llvm::Error overrideNumber(llvm::StringRef key, llvm::StringRef flag, const std::optional<T> &value, T &out) {
  if (!value)
    return llvm::Error::success();
  SettingRange range = settingRange(key);
  if (!(double(*value) >= range.min && double(*value) <= range.max)) {
    if constexpr (std::is_integral_v<T>)
      return flagError(fmt::format("--{} must be between {} and {}, got {}", flag.str(), int64_t(range.min),
                                   int64_t(range.max), *value));
    else
      return flagError(fmt::format("--{} must be between {} and {}, got {}", flag.str(), range.min, range.max, *value));
  }
  out = *value;
  return llvm::Error::success();
}

llvm::Error overrideChoice(llvm::StringRef key, llvm::StringRef flag, const std::optional<std::string> &value,
                           std::string &out) {
  if (!value)
    return llvm::Error::success();
  llvm::ArrayRef<llvm::StringRef> choices = settingChoices(key);
  if (!llvm::is_contained(choices, *value))
    return flagError(fmt::format("--{} must be {}, got '{}'", flag.str(), fmt::join(choices, " | "), *value));
  out = *value;
  return llvm::Error::success();
}

} // namespace

llvm::Error applyOverrides(ModelConfig &config, const ConfigOverrides &o) {
  TrainConfig &t = config.train;
  PrecisionConfig &p = config.precision;
  if (o.fp8LmHead) { // the head's product leaves keep_bf16, or joins it
    llvm::erase_value(p.keepBf16, "lm_head");
    if (!*o.fp8LmHead)
      p.keepBf16.push_back("lm_head");
  }
  if (auto err = overrideNumber("batch", "batch", o.batch, t.batch))
    return err;
  if (auto err = overrideNumber("steps", "steps", o.steps, t.steps))
    return err;
  if (auto err = overrideNumber("lr", "lr", o.lr, t.lr))
    return err;
  std::string recipe(recipeName(p.recipe)), format(fp8FormatName(p.fp8Format));
  if (auto err = overrideChoice("recipe", "precision", o.recipe, recipe))
    return err;
  if (auto err = overrideChoice("fp8_format", "fp8-format", o.fp8Format, format))
    return err;
  p.recipe = *parseRecipe(recipe);
  p.fp8Format = format == "hybrid" ? Fp8Formats::Hybrid : Fp8Formats::E4M3;
  if (auto err = overrideChoice("amax_compute_algo", "amax-compute-algo", o.amaxComputeAlgo, p.amaxComputeAlgo))
    return err;
  std::string scaling(fp8ScalingName(p.fp8Scaling));
  if (auto err = overrideChoice("fp8_scaling", "fp8-scaling", o.fp8Scaling, scaling))
    return err;
  p.fp8Scaling = parseFp8Scaling(scaling).value_or(p.fp8Scaling);
  if (auto err = overrideNumber("margin", "margin", o.margin, p.margin))
    return err;
  if (auto err = overrideNumber("fp8_min_dim", "fp8-min-dim", o.fp8MinDim, p.fp8MinDim))
    return err;
  if (auto err = overrideNumber("amax_history_len", "amax-history-len", o.amaxHistoryLen, p.amaxHistoryLen))
    return err;
  if (o.seed)
    t.seed = *o.seed;
  std::string shard = t.shardGradients ? "gradients" : t.shardOptimizer ? "optimizer" : "none";
  if (auto err = overrideChoice("shard", "shard", o.shard, shard))
    return err;
  t.shardOptimizer = shard != "none";
  t.shardGradients = shard == "gradients";
  std::string reduce = t.bf16GradientReduce ? "bf16" : "fp32";
  if (auto err = overrideChoice("grad_reduce", "grad-reduce", o.gradReduce, reduce))
    return err;
  t.bf16GradientReduce = reduce == "bf16";
  if (o.recompute)
    t.recompute = *o.recompute;
  if (auto err = overrideNumber("recompute_layers", "recompute-layers", o.recomputeLayers, t.recomputeLayers))
    return err;
  if (o.recomputeLayers && *o.recomputeLayers > config.layers) // (past them would quietly mean all of them)
    return flagError(fmt::format("--recompute-layers must be at most the model's layers ({}), got {}", config.layers,
                                 *o.recomputeLayers));
  if (auto err = overrideNumber("memory_budget", "memory-budget", o.memoryBudgetGiB, t.memoryBudgetGiB))
    return err;
  if (o.recomputeLayers) // the first N layers, chosen
    t.recompute = true, t.recomputeAuto = false;
  if (o.memoryBudgetGiB) // as few as fit the budget
    t.recompute = true, t.recomputeAuto = true;
  if (o.fp8Weights)
    p.fp8Weights = *o.fp8Weights;
  if (o.fp8Attention)
    p.fp8Attention = *o.fp8Attention;
  return llvm::Error::success();
}

} // namespace tgc
