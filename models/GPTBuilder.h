// Expands a model description into forward IR with the loss: token and position embeddings,
// pre-norm blocks, final norm, LM head, cross-entropy. Plain ops only; fusion is the passes' job.
#pragma once

#include "ir/Graph.h"
#include "models/ModelConfig.h"

namespace tgc {

enum class GPTOutput {
  Loss,   // inputs %tokens, %targets (i32[batch, seq_len]); returns %loss (training)
  Logits, // input %tokens; returns %logits [batch, seq_len, vocab] (generation)
  // A prompt into the KV cache: input %tokens (i32[batch, length]) and %last_rows (i32[batch, 1]:
  // b * length + the index of sequence b's last prompt token); state %h<l>.attn.k_cache and
  // .v_cache (f32[batch, seq_len, d_model], rows 0..length-1 written); returns %logits
  // [batch, 1, vocab] at each sequence's last row and %next (i32[batch, 1], their argmax).
  Prefill,
  // One token per sequence with a KV cache: inputs %tokens and %positions (i32[batch, 1]); the
  // same state, written at each sequence's position; returns %logits [batch, 1, vocab] and %next.
  Decode,
  // `length` tokens per sequence with a KV cache (speculative decoding's check of a draft's
  // tokens): inputs %tokens (i32[batch, length]), %positions (i32[batch, 1], where each
  // sequence's first token goes) and %token_positions (i32[batch, length], positions[b] + s);
  // the caches written at those rows; returns %logits [batch, length, vocab] and %next (each
  // token's successor, i32[batch, length]).
  Verify,
};

/// Parameter names follow PyTorch conventions (h0.attn.qkv.weight, lm_head.weight, ...).
/// `length` is the prefill program's prompt length, or the verify program's tokens a sequence
/// (1..seq_len; 0: seq_len).

llvm::Expected<std::unique_ptr<Graph>> buildGPT(const ModelConfig &config, int64_t batch,
                                                GPTOutput output = GPTOutput::Loss, int64_t length = 0);

} // namespace tgc
