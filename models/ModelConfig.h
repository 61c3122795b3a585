// Model descriptions: the YAML files in models/, read with LLVM's YAML parser and checked with
// errors that name file:line:col.
#pragma once

#include "ir/Rope.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tgc {

enum class NormKind { LayerNorm, RMSNorm };
enum class ActivationKind { Gelu, SwiGLU };
/// Where positions come from: a learned table added to the token embeddings (GPT-2's wpe), or
/// rotary embeddings applied to each head's queries and keys (RoPE, Llama's).
enum class PositionKind { Learned, Rope };

struct TrainConfig {
  int64_t batch = 16;
  double lr = 1e-3;
  int64_t steps = 100;
  int64_t warmup = 10;
  double weightDecay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double gradClip = 1.0;
  double minLrRatio = 0.1;       // the cosine schedule ends at lr * min_lr_ratio
  bool decayEmbeddings = false;  // weight decay on wte/wpe too (never on norms and biases)
  /// The backward recomputes what a fused LayerNorm+Linear/MLP normalised and activated, and
  /// under FP8 the transposes of the inputs it keeps anyway (requantize-transposes): less
  /// memory, more time, instead of keeping the forward's values, as Transformer Engine keeps them.
  bool recompute = false;
  /// With recompute: the first this many layers (h0, h1, ...) recompute, the others keep what
  /// the forward made; -1: every layer and the head. `recompute: auto` (recomputeAuto) chooses
  /// the fewest whose plan fits the memory budget (app/RecomputeBudget.h).
  int64_t recomputeLayers = -1;
  bool recomputeAuto = false;
  double memoryBudgetGiB = 0; // recompute: auto's budget; 0: the GPU's memory
  /// Whether recompute applies to the layer numbered `layer` (none: the embeddings and head).
  bool recomputes(std::optional<int64_t> layer) const {
    return recompute && (recomputeLayers < 0 || (layer && *layer < recomputeLayers));
  }
  /// shard: optimizer (ZeRO-1) under data parallelism: each rank keeps AdamW's moments of its
  /// 1 / ranks of every parameter and updates only that part, from its part of the all-reduced
  /// gradients; the parameters are all-gathered after (transforms/training/AdamW.cpp).
  /// shard: gradients (ZeRO-2) sets shardGradients too: the gradients are reduce-scattered, each
  /// rank keeping its part of each (DataParallel.cpp), so no rank holds a whole gradient buffer.
  bool shardOptimizer = false, shardGradients = false;
  /// grad_reduce: bf16: the gradients cross the ranks in BF16 (half the bytes): each rank's
  /// rounded to BF16, the reduced values rounded again (DataParallel.cpp).
  bool bf16GradientReduce = false;
  uint64_t seed = 1234;
};

/// Arithmetic progressions token_i = (a + k*i) mod vocab with k in [minStep, maxStep].
struct DataConfig {
  int64_t minStep = 1;
  int64_t maxStep = 8;
};

/// The precision recipe of a program (a model file's precision.recipe, tgc's --precision). fp8 is
/// Transformer Engine's fp8_autocast: every linear layer FP8 where the rules allow it
/// (transforms/precision/Precision.h). auto is resolved by the device's policy
/// (backends/*/Pipeline.h) before any pass runs; on a GPU with FP8 it becomes fp8 with
/// fp8_layers chosen by measurement (app/PrecisionProbe.h).
enum class Recipe { Auto, Fp32, Bf16, Fp8 };
llvm::StringRef recipeName(Recipe recipe); // "auto", "fp32", "bf16", "fp8"
std::optional<Recipe> parseRecipe(llvm::StringRef name);

/// The FP8 formats of the fp8 recipe: hybrid (E4M3 forward, E5M2 gradients, as Transformer
/// Engine's Format.HYBRID) or E4M3 everywhere.
enum class Fp8Formats { Hybrid, E4M3 };
llvm::StringRef fp8FormatName(Fp8Formats formats); // "hybrid", "e4m3"

/// Where a quantized tensor's scale comes from: Delayed (Transformer Engine's DelayedScaling:
/// the amax history of earlier steps) or Current (its Float8CurrentScaling: the tensor's own
/// amax, taken before it is cast: no lag, so no saturation, one more read). Mixed: current for
/// the weights and the output gradients, delayed for the activations (the layers' inputs). A
/// gradient's amax grows while the learning rate warms up, so its delayed scale lags and
/// saturates it, and at the first step (scale 1) most of a large batch's gradients and a small
/// weight's values are below FP8's smallest; an activation's amax is steady (BENCHMARKS.md,
/// sessions 13 and 32). Block: Transformer Engine's Float8BlockScaling (DeepSeek-V3's): a
/// power-of-two scale for each 1 x 128 block of the inputs and gradients and each 128 x 128
/// block of the weights, from the block's own amax.
enum class Fp8Scaling { Delayed, Current, Mixed, Block };
llvm::StringRef fp8ScalingName(Fp8Scaling scaling); // "delayed", "current", "mixed", "block"
std::optional<Fp8Scaling> parseFp8Scaling(llvm::StringRef name);

/// One kind of linear layer as --precision auto timed it: the median training step of a
/// probe of the model (at most four blocks) with every kind FP8 may run in FP8 (fp8Ms), and the same with
/// this kind in BF16 (bf16Ms), casts and transposes included; `chosen`: FP8 in auto's choice
/// (the fastest set of kinds timed, app/PrecisionProbe.h).
struct GemmMeasurement {
  std::string site; // the probed layer (h0.mlp.fc1); every layer of its kind follows it
  int64_t m = 0, k = 0, n = 0;
  double bf16Ms = 0, fp8Ms = 0;
  bool cached = false; // read from the kernel cache folder, not timed in this process
  bool chosen = false;
  bool fp8() const { return chosen; }
};

struct PrecisionConfig {
  Recipe recipe = Recipe::Auto;
  Fp8Formats fp8Format = Fp8Formats::Hybrid;
  int64_t margin = 0;
  int64_t amaxHistoryLen = 1024;
  std::string amaxComputeAlgo = "max"; // max | most_recent
  Fp8Scaling fp8Scaling = Fp8Scaling::Delayed;
  /// GEMM sites (glob patterns: lm_head, h0.*) that stay in BF16 under the fp8 and auto
  /// recipes. None by default: the LM head too runs in FP8 where it is legal (its gradient made
  /// by the loss's quantize, fuse-cross-entropy-quantize), as measured faster and converging at
  /// gpt2-124m (BENCHMARKS.md, session 24).
  std::vector<std::string> keepBf16;
  /// FP8 only for GEMMs whose K and N are at least this (see transforms/precision/Precision.h).
  int64_t fp8MinDim = 0;
  /// When set, only the GEMM sites these glob patterns name may run in FP8 (h*.mlp.fc1); an
  /// empty list keeps every one in BF16. --precision auto sets it to what it measured.
  std::optional<std::vector<std::string>> fp8Layers;
  /// FP8-only weights between steps (Transformer Engine's quantized_model_init): each FP8
  /// layer's weight, and its transpose, are kept in FP8 from one step to the next, made after
  /// AdamW updates the master weights (the fp8-weights pass); checkpoints keep the masters.
  bool fp8Weights = false;
  /// FP8 attention (Transformer Engine's fp8_dpa): each eligible attention (one KV head a query
  /// head, no rope) runs cuDNN's FP8 fused attention, q, k, v and dout quantized with scaling
  /// state of their own, the probabilities and dS at S's and dP's (assign-precision).
  bool fp8Attention = false;
  /// Set for inference programs: no weight gradient contracts over the rows, so a product of
  /// any number of rows runs in FP8 (training needs them a multiple of 16).
  bool forwardOnly = false;
  /// What auto measured on the GPU behind fp8Layers (not part of a model file), and a line
  /// on the probe steps of the sets it timed.
  std::vector<GemmMeasurement> measured;
  std::string measuredSummary;
};

struct ModelConfig {
  std::string name;
  int64_t vocab = 0;
  int64_t seqLen = 0;
  int64_t dModel = 0;
  int64_t heads = 0;
  int64_t layers = 0;
  int64_t ffn = 0;
  NormKind norm = NormKind::LayerNorm;
  ActivationKind activation = ActivationKind::Gelu;
  bool bias = true;
  bool tieEmbeddings = false;
  double normEps = 1e-5;
  PositionKind position = PositionKind::Learned;
  double ropeTheta = 10000.0; // RoPE's base (Llama 2: 10000, Llama 3: 500000)
  /// rope_scaling: llama3 (Llama 3.1/3.2's long-context frequencies, ir/Rope.h), or none.
  std::optional<RopeScaling> ropeScaling;
  /// Heads of keys and values (grouped-query attention: each serves heads / kvHeads query
  /// heads; 1 is multi-query attention); 0, a file without kv_heads: as many as heads.
  int64_t kvHeads = 0;
  TrainConfig train;
  DataConfig data;
  PrecisionConfig precision;
  /// Passes the compiled programs skip (tgc's --disable-pass; not part of the model file).
  std::vector<std::string> disabledPasses;

  int64_t headDim() const { return dModel / heads; }
  int64_t kvHeadCount() const { return kvHeads > 0 ? kvHeads : heads; }
  /// The qkv projection's width: the queries' d_model, then the keys' and values' heads.
  int64_t qkvWidth() const { return dModel + 2 * kvHeadCount() * headDim(); }
  /// Number of trainable parameters of the GPT this describes.
  int64_t numParams() const;
};

/// The range of a numeric setting, by its model-file key ("batch", "margin", "lr", ...): the
/// model file reader and the command line's overrides check against this one table.
struct SettingRange {
  double min, max;
};
SettingRange settingRange(llvm::StringRef key);
/// The values a choice setting takes ("recipe": auto | fp32 | bf16 | fp8, ...).
llvm::ArrayRef<llvm::StringRef> settingChoices(llvm::StringRef key);

/// What the command line may change in a model file's settings (tgc's --batch, --precision,
/// ...); unset fields leave the file's value.
struct ConfigOverrides {
  std::optional<int64_t> batch, steps, margin, amaxHistoryLen, fp8MinDim;
  std::optional<double> lr;
  std::optional<uint64_t> seed;
  std::optional<bool> recompute;
  std::optional<int64_t> recomputeLayers; // --recompute-layers N
  std::optional<double> memoryBudgetGiB;  // --memory-budget GIB: recompute: auto
  std::optional<bool> fp8LmHead; // --fp8-lm-head: the LM head out of keep_bf16
  std::optional<bool> fp8Weights, fp8Attention;
  std::optional<std::string> recipe, fp8Format, amaxComputeAlgo, fp8Scaling;
  std::optional<std::string> shard; // --shard none | optimizer | gradients
  std::optional<std::string> gradReduce; // --grad-reduce fp32 | bf16
};
/// Applies `overrides`, each checked as the model file's key is; an error names the flag
/// ("--batch must be between 1 and 65536, got 0").
llvm::Error applyOverrides(ModelConfig &config, const ConfigOverrides &overrides);

/// Parses and checks a model description; `file` names it in errors.
llvm::Expected<ModelConfig> parseModelConfig(llvm::StringRef text, llvm::StringRef file);
llvm::Expected<ModelConfig> loadModelConfig(llvm::StringRef path);
/// The description as a model file that parseModelConfig reads back to the same config.
std::string formatModelConfig(const ModelConfig &config);

} // namespace tgc
