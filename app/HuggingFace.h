// Hugging Face model folders, as transformers' save_pretrained writes them (config.json, and
// model.safetensors or the shards model.safetensors.index.json lists), to and from tgc's model
// descriptions and checkpoints: GPT-2 (GPT2LMHeadModel) and Llama-style (LlamaForCausalLM)
// decoders. What a config.json says that a model file cannot express is refused by its name.
#pragma once

#include "app/Checkpoint.h"
#include "models/ModelConfig.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <map>
#include <string>
#include <vector>

namespace tgc {

/// What a conversion could not carry over and says instead (dropout, which tgc does not train
/// with, say).
struct HfNotes {
  std::vector<std::string> lines;
};

/// The model description of a transformers config.json (`path` names it in errors), named
/// `name`; `seqLen` > 0 replaces max_position_embeddings (n_positions) as the window.
llvm::Expected<ModelConfig> modelFromHfConfig(const llvm::json::Object &config, llvm::StringRef path,
                                              llvm::StringRef name, int64_t seqLen, HfNotes &notes);
/// config.json for `model`: the inverse of modelFromHfConfig.
llvm::Expected<llvm::json::Object> hfConfigOf(const ModelConfig &model);

/// Where a tgc parameter's values are in a Hugging Face checkpoint: the tensors `names`, their
/// rows one after another (a fused qkv of q, k and v; SwiGLU's [gate | up]), each transposed
/// first where `transposed` (GPT-2's Conv1D weights, [in, out]).
struct HfSource {
  std::vector<std::string> names;
  bool transposed = false;
};
/// Each parameter of `model`, by its tgc name, and where it is in Hugging Face's checkpoint.
std::map<std::string, HfSource> hfSourcesOf(const ModelConfig &model);

/// Converts the Hugging Face folder `folder` into the tgc checkpoint `checkpointPath` (step 0,
/// the weights alone: a model to evaluate, generate from or fine-tune with --init), reading a
/// tensor at a time from the mapped files and writing it as it goes. Returns the model.
llvm::Expected<ModelConfig> importHf(llvm::StringRef folder, llvm::StringRef checkpointPath, llvm::StringRef name,
                                     int64_t seqLen, HfNotes &notes);
/// Writes `model`'s weights from `checkpoint` as a Hugging Face folder: config.json and
/// model.safetensors (F32), each written atomically.
llvm::Error exportHf(const ModelConfig &model, const Checkpoint &checkpoint, llvm::StringRef folder);

} // namespace tgc
