// Autoregressive generation from trained weights, and the held-out evaluation of the arithmetic
// task built on it.
#pragma once

#include "app/Data.h"
#include "app/Trainer.h"
#include "backends/Executor.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"
#include "support/Random.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>

namespace tgc {

struct SamplingOptions {
  double temperature = 0; // 0: greedy (argmax, lowest id on ties)
  int64_t topK = 0;       // 0: the whole vocabulary
  double topP = 1;        // nucleus: the most likely tokens that hold this much probability
  uint64_t seed = 0;
};

/// What the last generate() did and how long it took: the prompts' forward pass (prefill,
/// which also gives the first new token) and the decode steps after it.
struct GenerationStats {
  int64_t sequences = 0, promptTokens = 0, generatedTokens = 0, decodeSteps = 0;
  int64_t prefillLength = 0; // the positions the prefill program ran (the longest prompt, rounded up)
  double prefillSeconds = 0, decodeSeconds = 0;
  bool cached = true; // false: past seq_len, the full program recomputed each window
  // Speculative decoding: the draft's tokens checked, those the target agreed with, and the
  // target's verify steps (each gives every sequence its accepted tokens and one of its own).
  int64_t draftedTokens = 0, acceptedTokens = 0, verifySteps = 0;

  /// Another batch's generation added to this one's (tgc generate --prompts).
  GenerationStats &operator+=(const GenerationStats &other) {
    sequences += other.sequences, promptTokens += other.promptTokens;
    generatedTokens += other.generatedTokens, decodeSteps += other.decodeSteps;
    prefillLength = std::max(prefillLength, other.prefillLength);
    prefillSeconds += other.prefillSeconds, decodeSeconds += other.decodeSeconds;
    cached = cached && other.cached;
    draftedTokens += other.draftedTokens, acceptedTokens += other.acceptedTokens;
    verifySteps += other.verifySteps;
    return *this;
  }
};

/// Called after each step with the step (0 for the first new token) and each sequence's token.
using TokenCallback = std::function<void(int64_t step, const std::vector<int32_t> &tokens)>;

class Generator {
public:
  /// Compiles the decode program (one token per sequence a step, keys and values kept in a KV
  /// cache; GPTOutput::Decode) for `batch` sequences on the device. Prefill programs are
  /// compiled when a prompt length first needs one.
  static llvm::Expected<std::unique_ptr<Generator>>
  create(const ModelConfig &config, const std::map<std::string, Tensor> &weights, int64_t batch,
         Device device = Device::cpu());
  const ModelConfig &config() const { return config_; }
  const Device &device() const { return device_; }
  std::string describe() const { return (decode_.executor ? decode_ : windowed_).executor->describe(); }
  int64_t batch() const { return batch_; }

  /// Continues each prompt (at most `batch` of them, of any lengths from 1 to seq_len) by
  /// `count` tokens. While every position fits in seq_len, the prompts run as one forward
  /// program over their positions (prefill: it fills the KV caches and gives the first token),
  /// then each step runs the decode program on one token per sequence at its own position.
  /// Past seq_len the context is the last seq_len tokens, recomputed each step by the full
  /// inference program (compiled then), whose positions after the context are padding that
  /// causal attention never reads. Tokens are chosen on the device, greedy or sampled (the
  /// sample op, support/Sampling.h: the same tokens on the CPU and the GPU for the same seed).
  llvm::Expected<std::vector<std::vector<int32_t>>>
  generate(const std::vector<std::vector<int32_t>> &prompts, int64_t count, const SamplingOptions &options,
           const TokenCallback &onTokens = {});

  /// Greedy/sampled continuation without the KV cache (the full program every step), for
  /// comparison.
  llvm::Expected<std::vector<std::vector<int32_t>>>
  generateWithoutCache(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                       const SamplingOptions &options, const TokenCallback &onTokens = {});

  /// The logits of every position of `prompt` (1 to seq_len tokens), [length, vocab], from the
  /// full inference program (no cache): what a framework's forward pass gives, to compare.
  llvm::Expected<Tensor> promptLogits(const std::vector<int32_t> &prompt);
  /// Every value the full inference program computes for `prompt` (in the first sequence, the
  /// others' tokens zero), by name in program order (Executor::setTracingValues): where two
  /// devices' runs of one checkpoint part.
  llvm::Expected<std::vector<std::pair<std::string, Tensor>>> promptValues(const std::vector<int32_t> &prompt);
  /// From now on the full inference program (promptLogits, promptValues) rounds to BF16 the
  /// values `device`'s rounds beyond their types (Executor::roundedValues: the GPU's storage
  /// rules), so that this generator (on the CPU) emulates that one's numerics.
  llvm::Error roundAs(Generator &device);

  /// Speculative decoding: from now on greedy generate() has `draft` (a smaller model of the same
  /// vocabulary, created for the same batch and device) propose `lookahead` tokens a sequence,
  /// which this model checks in one step (GPTOutput::Verify over its KV cache), keeping those it
  /// agrees with and its own next token: plain greedy decoding's tokens, in fewer steps of this
  /// model where the draft guesses well. Sampling runs without the draft. A null draft turns it
  /// off.
  llvm::Error setDraft(std::unique_ptr<Generator> draft, int64_t lookahead);
  int64_t lookahead() const { return draft_ ? lookahead_ : 0; }

  const GenerationStats &stats() const { return stats_; }
  /// The positions of the prefill program that runs prompts of up to `length` tokens: `length`
  /// rounded up to a multiple of kPrefillGranule, at most seq_len (not to a power of two, which
  /// would pad a prompt of 520 tokens to 1024 positions: nearly twice the work).
  int64_t prefillLength(int64_t length) const;
  static constexpr int64_t kPrefillGranule = 16;
  /// The prefill programs kept compiled (each with its own activations' memory): the least
  /// recently used goes when another length needs one.
  static constexpr size_t kKeptPrefills = 4;
  /// The prefill programs compiled now.
  size_t prefillPrograms() const { return prefill_.size(); }

private:
  /// A prefill program, and whether its KV caches are the decode program's memory (else they
  /// are copied after each prefill).
  struct Prefill {
    CompiledProgram program;
    bool sharesCaches = false;
    int64_t lastUse = 0; // prefillUses_ when it last ran
  };
  llvm::Error ensureWindowed();
  /// `prompt` checked (1 to seq_len tokens of the vocabulary) as the windowed program's tokens
  /// [batch, seq_len]: the first sequence's, the others zero; the program compiled if needed.
  llvm::Expected<std::vector<int32_t>> windowOf(const std::vector<int32_t> &prompt);
  /// The windowed program's logits [batch, seq_len, vocab] of `tokens` [batch, seq_len].
  llvm::Expected<Tensor> runWindowed(const std::vector<int32_t> &tokens);
  /// The prefill program of `positions` (a prefillLength), compiled when first needed.
  llvm::Expected<Prefill *> prefillProgram(int64_t positions);
  /// The prompts (the longest `longest` tokens) through the prefill program, padded to its
  /// positions, in one forward pass; the KV caches it wrote handed to the decode step. Returns
  /// each sequence's first new token.
  llvm::Expected<std::vector<int32_t>> runPrefill(const std::vector<std::vector<int32_t>> &prompts, int64_t longest,
                                                  const SamplingOptions &options);

  /// Greedy generate() with the draft (app/Speculative.cpp): prefill both models, then rounds
  /// of the draft's proposals and one verify step of this model, until `count` tokens; where a
  /// round's positions would pass seq_len, plain decode steps finish.
  llvm::Expected<std::vector<std::vector<int32_t>>> generateSpeculative(const std::vector<std::vector<int32_t>> &prompts,
                                                                        int64_t count, const TokenCallback &onTokens);
  /// The draft's `lookahead_` tokens after each sequence's last token ([lookahead][batch]): its
  /// decode steps, fed on the device. Finished sequences (`active` false) run at position 0.
  llvm::Expected<std::vector<std::vector<int32_t>>> draftTokens(const std::vector<std::vector<int32_t>> &sequences,
                                                                const std::vector<bool> &active);
  /// The verify step over each active sequence's last token and the draft's: this model's next
  /// token after each ([batch][lookahead + 1]).
  llvm::Expected<std::vector<std::vector<int32_t>>> verifyTokens(const std::vector<std::vector<int32_t>> &sequences,
                                                                 const std::vector<bool> &active,
                                                                 const std::vector<std::vector<int32_t>> &proposals);
  /// The draft's step that runs each active sequence's token before its last, where a round kept
  /// all of some sequence's proposals (the draft never ran the last of them).
  llvm::Error catchUpDraft(const std::vector<std::vector<int32_t>> &sequences, const std::vector<bool> &active);
  /// One plain decode step of this model over each active sequence's last token.
  llvm::Expected<std::vector<int32_t>> decodeOnce(const std::vector<std::vector<int32_t>> &sequences,
                                                  const std::vector<bool> &active);

  ModelConfig config_;
  int64_t batch_ = 0;
  Device device_ = Device::cpu();
  std::map<std::string, Tensor> weights_; // the weights and FP8 scaling state the programs bind
  CompiledProgram decode_, windowed_; // windowed_ compiled when first needed
  std::map<int64_t, Prefill> prefill_; // by prompt positions
  int64_t prefillUses_ = 0;
  std::vector<std::string> caches_;            // the KV caches' names
  std::unique_ptr<Generator> draft_;           // speculative decoding's draft model, if any
  int64_t lookahead_ = 0;                      // the draft's tokens a verify step checks
  CompiledProgram verify_;                     // GPTOutput::Verify of lookahead_ + 1 tokens
  bool verifySharesCaches_ = false;            // the verify program's caches are decode_'s memory
  GenerationStats stats_;
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
