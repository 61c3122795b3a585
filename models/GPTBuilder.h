// Expands a model description into forward IR with the loss: token and position embeddings,
// pre-norm blocks, final norm, LM head, cross-entropy. Plain ops only; fusion is the passes' job.
#pragma once

#include "ir/Graph.h"
#include "models/ModelConfig.h"

namespace tgc {

enum class GPTOutput {
  Loss,   // inputs %tokens, %targets (i32[batch, seq_len]); returns %loss (training)
  Logits, // input %tokens; returns %logits [batch, seq_len, vocab] (generation)
  // One token per sequence with a KV cache: inputs %tokens and %positions (i32[batch, 1]) and
  // %pos (i32[], the position written); state %h<l>.attn.k_cache and .v_cache
  // (f32[batch, seq_len, d_model], written at pos); returns %logits [batch, 1, vocab].
  Decode,
};

/// Parameter names follow PyTorch conventions (h0.attn.qkv.weight, lm_head.weight, ...).
llvm::Expected<std::unique_ptr<Graph>> buildGPT(const ModelConfig &config, int64_t batch,
                                                GPTOutput output = GPTOutput::Loss);

} // namespace tgc
