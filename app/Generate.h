// Autoregressive generation from trained weights, and the held-out evaluation of the arithmetic
// task built on it.
#pragma once

#include "app/Data.h"
#include "app/Trainer.h"
#include "backends/Executor.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"

#include <map>
#include <memory>

namespace tgc {

struct SamplingOptions {
  double temperature = 0; // 0: greedy (argmax, lowest id on ties)
  int64_t topK = 0;       // 0: the whole vocabulary
  uint64_t seed = 0;
};

class Generator {
public:
  /// Compiles the decode program (one token per sequence a step, keys and values kept in a KV
  /// cache; GPTOutput::Decode) for `batch` sequences on the device.
  static llvm::Expected<std::unique_ptr<Generator>>
  create(const ModelConfig &config, const std::map<std::string, Tensor> &weights, int64_t batch,
         Device device = Device::cpu());
  std::string describe() const { return decode_.executor->describe(); }

  /// Continues each prompt (all of one length, at most `batch` of them) by `count` tokens.
  /// While every position fits in seq_len, each step runs the decode program on one token per
  /// sequence. Past seq_len the context is the last seq_len tokens, recomputed each step by
  /// the full inference program (compiled then), whose positions after the context are
  /// padding that causal attention never reads.
  llvm::Expected<std::vector<std::vector<int32_t>>>
  generate(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
           const SamplingOptions &options);

  /// Greedy/sampled continuation without the KV cache (the full program every step), for
  /// comparison.
  llvm::Expected<std::vector<std::vector<int32_t>>>
  generateWithoutCache(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                       const SamplingOptions &options);

private:
  llvm::Error ensureWindowed();

  ModelConfig config_;
  int64_t batch_ = 0;
  Device device_ = Device::cpu();
  std::map<std::string, Tensor> weights_; // for windowed_: the decode program's bound tensors
  CompiledProgram decode_, windowed_; // windowed_ compiled when first needed
  size_t decodeLogits_ = 0, windowedLogits_ = 0; // where their outputs hold the logits
};

struct EvalResult {
  int64_t sequences = 0;
  int64_t tokens = 0;
  int64_t correctTokens = 0;
  int64_t correctSequences = 0;
  double tokenAccuracy() const { return tokens ? double(correctTokens) / tokens : 0; }
  double sequenceAccuracy() const { return sequences ? double(correctSequences) / sequences : 0; }
};

/// Greedy continuations of held-out progressions: `promptLength` tokens in, the rest of the
/// window out, compared token by token with the true progression.
llvm::Expected<EvalResult> evaluateArithmetic(Generator &generator, const ModelConfig &config,
                                              int64_t sequences, int64_t promptLength,
                                              int64_t batch);

} // namespace tgc
