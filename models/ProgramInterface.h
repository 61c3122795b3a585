// The program interface: the names by which a compiled program and the application exchange
// values. The GPT builder and the training passes give these names, the trainer, the
// generator, checkpoints and tgc inspect read them; this header is the one place they are
// written. Names are IR value names, so they show in every dump.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace tgc::program {

// Outputs (the IR's `return` list), read by name, never by position.
inline constexpr llvm::StringLiteral kLoss = "loss";                 // the training loss, f32[]
inline constexpr llvm::StringLiteral kLogits = "logits";             // the forward program's logits
inline constexpr llvm::StringLiteral kNext = "next"; // generation: each sequence's next token
inline constexpr llvm::StringLiteral kLearningRate = "lr";           // this step's learning rate
inline constexpr llvm::StringLiteral kGradNormSquared = "grad_norm.sumsq"; // before clipping

// Inputs the application binds each step.
inline constexpr llvm::StringLiteral kTokens = "tokens";
inline constexpr llvm::StringLiteral kTargets = "targets";
inline constexpr llvm::StringLiteral kStep = "step"; // the optimizer's step counter, from 1
// The decode step's: each sequence's position [B, 1] (the KV cache row it writes).
inline constexpr llvm::StringLiteral kPositions = "positions";
// The verify step's: the position of each of its tokens [B, S] (positions[b] + s).
inline constexpr llvm::StringLiteral kTokenPositions = "token_positions";
// The prefill's: where each sequence's last prompt token is among the batch's rows [B, 1].
inline constexpr llvm::StringLiteral kLastRows = "last_rows";
// Both's, bound once a generate() call: the sample op's (temperature, top_p, top_k) f32[3] and
// its seed's two words i32[2].
inline constexpr llvm::StringLiteral kSampling = "sampling";
inline constexpr llvm::StringLiteral kSampleSeed = "sample_seed";

/// The gradient of the value named `value` ("h0.attn.qkv.weight.grad").
inline std::string gradientOf(llvm::StringRef value) { return (value + ".grad").str(); }

/// AdamW's two moments of parameter `param` (state), and whether a name is one: what
/// generation and evaluation never read of a checkpoint.
inline std::string adamMomentOf(llvm::StringRef param, int which) {
  return (param + (which == 1 ? ".adam_m" : ".adam_v")).str();
}
inline bool isOptimizerMoment(llvm::StringRef name) {
  return name.ends_with(".adam_m") || name.ends_with(".adam_v");
}
/// The parameter whose moment `name` is (isOptimizerMoment's names).
inline llvm::StringRef parameterOfMoment(llvm::StringRef name) { return name.drop_back(llvm::StringRef(".adam_m").size()); }

/// The operands of an FP8 GEMM whose scaling state a program keeps.
enum class Fp8Role { Input, Weight, GradOutput };
inline llvm::StringRef fp8RoleName(Fp8Role role) {
  return role == Fp8Role::Input ? "input" : role == Fp8Role::Weight ? "weight" : "grad_output";
}
/// The prefix of the scaling state of `site`'s `role` operand: "<site>.fp8.<role>", followed by
/// ".scale", ".scale_inv", ".amax_history" and ".saturations".
inline std::string fp8StatePrefix(llvm::StringRef site, Fp8Role role) {
  return (site + ".fp8." + fp8RoleName(role)).str();
}
/// The roles of an FP8 attention's scaling state ("<layer>.attn.sdpa.fp8.<role>"): q, k and v,
/// the probabilities, dout, and dS.
inline constexpr llvm::StringLiteral kAttentionQkv = "qkv", kAttentionS = "s", kAttentionDout = "dout",
                                     kAttentionDs = "dp";
/// The marker that state names of FP8 scaling carry between site and role.
inline constexpr llvm::StringLiteral kFp8Marker = ".fp8.";
/// The GEMM site whose FP8 input scale `name` is ("h0.attn.qkv.fp8.input.scale" ->
/// "h0.attn.qkv"): a checkpoint holds one per layer its training ran in FP8.
inline std::optional<std::string> fp8SiteOfInputScale(llvm::StringRef name) {
  std::string suffix = fp8StatePrefix("", Fp8Role::Input) + ".scale";
  if (!name.consume_back(suffix) || name.empty())
    return std::nullopt;
  return name.str();
}

/// The KV cache of a layer's keys or values in the decode program ("h0.attn.k_cache").
inline constexpr llvm::StringLiteral kKeyCache = "k_cache", kValueCache = "v_cache";
inline bool isKvCache(llvm::StringRef name) {
  return name.ends_with((llvm::Twine(".") + kKeyCache).str()) ||
         name.ends_with((llvm::Twine(".") + kValueCache).str());
}

/// Where the output named `name` is among the program's outputs (and so in a run's results).
inline std::optional<size_t> outputIndex(const Graph &graph, llvm::StringRef name) {
  for (size_t i = 0; i < graph.outputs().size(); ++i)
    if (graph.outputs()[i]->name() == name)
      return i;
  return std::nullopt;
}

} // namespace tgc::program
