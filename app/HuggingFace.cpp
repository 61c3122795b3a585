// Hugging Face checkpoints to and from tgc's: the tensors' names and layouts (GPT-2's Conv1D
// weights transposed, Llama's q, k, v and gate, up stacked into tgc's fused products), read a
// tensor at a time from the mapped files.
#include "app/HuggingFace.h"

#include "app/SafeTensors.h"
#include "app/Tokenizer.h"
#include "app/Trainer.h"
#include "models/GPTBuilder.h"
#include "support/Error.h"
#include "support/Files.h"
#include "support/Limits.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <set>

namespace tgc {

namespace {

// transformers keeps these buffers in some checkpoints; they are not weights (the causal mask,
// RoPE's inverse frequencies), and tgc makes its own.
bool isBuffer(llvm::StringRef name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") || name.ends_with("rotary_emb.inv_freq");
}

llvm::Expected<llvm::json::Object> readJsonFile(llvm::StringRef path, llvm::StringRef what) {
  auto text = readFileAtMost(path, 16 << 20, what);
  if (!text)
    return text.takeError();
  if (findDeepNesting((*text)->getBuffer(), kMaxJsonDepth))
    return fileContentError(path, "nested deeper than {} levels", kMaxJsonDepth);
  auto json = llvm::json::parse((*text)->getBuffer());
  if (!json)
    return fileContentError(path, "not JSON: {}", llvm::toString(json.takeError()));
  if (!json->getAsObject())
    return fileContentError(path, "not a JSON object");
  return std::move(*json->getAsObject());
}

/// A model folder's safetensors files, mapped, and where each tensor is.
class HfTensors {
public:
  llvm::Error open(llvm::StringRef folder) {
    llvm::SmallString<256> single(folder), index(folder);
    llvm::sys::path::append(single, "model.safetensors");
    llvm::sys::path::append(index, "model.safetensors.index.json");
    std::vector<std::string> files;
    if (llvm::sys::fs::exists(single)) {
      files.push_back(single.str().str());
    } else if (llvm::sys::fs::exists(index)) {
      auto json = readJsonFile(index, "a safetensors index");
      if (!json)
        return json.takeError();
      const llvm::json::Object *map = json->getObject("weight_map");
      if (!map)
        return fileContentError(index, "no 'weight_map' object: not a safetensors index");
      std::set<std::string> shards;
      for (const auto &[name, file] : *map) {
        auto shard = file.getAsString();
        if (!shard || shard->contains('/') || shard->starts_with("."))
          return fileContentError(index, "tensor '{}': its file is not a name in the folder", name.str());
        shards.insert(shard->str());
      }
      for (const std::string &shard : shards) {
        llvm::SmallString<256> path(folder);
        llvm::sys::path::append(path, shard);
        files.push_back(path.str().str());
      }
    } else {
      return fileContentError(folder,
                              "no model.safetensors or model.safetensors.index.json: not a Hugging Face model folder");
    }
    for (const std::string &path : files) {
      auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
      if (!buffer)
        return fileContentError(path, "cannot read: {}", buffer.getError().message());
      auto header = parseSafeTensorsHeader((*buffer)->getBuffer(), path);
      if (!header)
        return header.takeError();
      for (const SafeTensorsEntry &e : header->entries)
        if (!where_.try_emplace(e.name, Place{files_.size(), e}).second)
          return fileContentError(path, "tensor '{}' is in two of the checkpoint's files", e.name);
      files_.push_back({path, std::move(*buffer), std::move(*header)});
    }
    return llvm::Error::success();
  }

  const SafeTensorsEntry *find(llvm::StringRef name) const {
    auto it = where_.find(name.str());
    return it == where_.end() ? nullptr : &it->second.entry;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto &[name, place] : where_)
      out.push_back(name);
    return out;
  }
  std::string fileOf(llvm::StringRef name) const { return files_[where_.at(name.str()).file].path; }
  std::vector<float> read(llvm::StringRef name) const {
    const Place &p = where_.at(name.str());
    const File &f = files_[p.file];
    llvm::StringRef bytes = f.buffer->getBuffer().substr(f.header.dataOffset + p.entry.begin,
                                                         p.entry.end - p.entry.begin);
    return safeTensorsFloats(p.entry, bytes);
  }

private:
  struct File {
    std::string path;
    std::unique_ptr<llvm::MemoryBuffer> buffer;
    SafeTensorsHeader header;
  };
  struct Place {
    size_t file;
    SafeTensorsEntry entry;
  };
  std::vector<File> files_;
  std::map<std::string, Place> where_;
};

/// `rows` x `cols` values transposed.
std::vector<float> transposed(const std::vector<float> &x, int64_t rows, int64_t cols) {
  std::vector<float> out(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  return out;
}

/// The shape tgc's `type` has, as a Hugging Face source's part of it: `rows` of its rows (all
/// but 1-D tensors), transposed where the source is.
std::vector<int64_t> hfShape(const TensorType &type, int64_t rows, bool transpose) {
  if (type.rank() == 1)
    return {rows};
  std::vector<int64_t> shape{rows, type.dim(1)};
  if (transpose)
    std::swap(shape[0], shape[1]);
  return shape;
}

/// The rows each source of `source` gives `param` of `model`: a fused qkv's q, k and v heads, a
/// SwiGLU fc1's gate and up halves, or the whole.
std::vector<int64_t> sourceRows(const ModelConfig &model, llvm::StringRef param, const HfSource &source,
                                const TensorType &type) {
  if (source.names.size() == 1)
    return {type.dim(0)};
  if (param.ends_with(".attn.qkv.weight"))
    return {model.dModel, model.kvHeadCount() * model.headDim(), model.kvHeadCount() * model.headDim()};
  return {model.ffn, model.ffn}; // [gate | up]
}

/// The tgc parameters of `model`: their names and types, as the builder makes them.
llvm::Expected<std::vector<CheckpointEntry>> modelParams(const ModelConfig &model) {
  auto graph = buildGPT(model, 1);
  if (!graph)
    return graph.takeError();
  std::vector<CheckpointEntry> params;
  for (const Op *op : (*graph)->ops())
    if (op->kind() == OpKind::Param)
      params.push_back({op->result()->name(), op->result()->type()});
  return params;
}

} // namespace

std::map<std::string, HfSource> hfSourcesOf(const ModelConfig &m) {
  std::map<std::string, HfSource> out;
  bool gpt2 = m.position == PositionKind::Learned;
  std::string top = gpt2 ? "transformer." : "model.";
  out["wte"] = {{top + (gpt2 ? "wte.weight" : "embed_tokens.weight")}};
  if (gpt2)
    out["wpe"] = {{"transformer.wpe.weight"}};
  for (int64_t i = 0; i < m.layers; ++i) {
    std::string t = fmt::format("h{}.", i), h = gpt2 ? fmt::format("transformer.h.{}.", i) : fmt::format("model.layers.{}.", i);
    auto norm = [&](const char *tgc, const char *gpt, const char *llama) {
      out[t + tgc + ".weight"] = {{h + (gpt2 ? gpt : llama) + ".weight"}};
      if (m.norm == NormKind::LayerNorm)
        out[t + tgc + ".bias"] = {{h + gpt + ".bias"}};
    };
    norm("ln1", "ln_1", "input_layernorm");
    norm("ln2", "ln_2", "post_attention_layernorm");
    if (gpt2) { // Conv1D: x @ W with W [in, out], tgc's [out, in]
      for (auto [tgc, hf] : {std::pair{"attn.qkv", "attn.c_attn"}, std::pair{"attn.proj", "attn.c_proj"},
                             std::pair{"mlp.fc1", "mlp.c_fc"}, std::pair{"mlp.fc2", "mlp.c_proj"}}) {
        out[t + tgc + ".weight"] = {{h + hf + ".weight"}, true};
        out[t + tgc + ".bias"] = {{h + hf + ".bias"}};
      }
      continue;
    }
    // Llama: q and k rows as transformers keeps them, rotate-half pairs (i, i + Dh/2), which is
    // tgc's rope's pairing: no permutation (Meta's own files interleave them; transformers'
    // converter has already undone that).
    out[t + "attn.qkv.weight"] = {{h + "self_attn.q_proj.weight", h + "self_attn.k_proj.weight",
                                   h + "self_attn.v_proj.weight"}};
    out[t + "attn.proj.weight"] = {{h + "self_attn.o_proj.weight"}};
    out[t + "mlp.fc1.weight"] = {{h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"}};
    out[t + "mlp.fc2.weight"] = {{h + "mlp.down_proj.weight"}};
  }
  out["lnf.weight"] = {{top + (gpt2 ? "ln_f.weight" : "norm.weight")}};
  if (gpt2)
    out["lnf.bias"] = {{"transformer.ln_f.bias"}};
  if (!m.tieEmbeddings)
    out["lm_head.weight"] = {{"lm_head.weight"}};
  return out;
}

namespace {

/// The values of tgc's `param` (of `type`) from its Hugging Face sources, checked against the
/// shapes they must have.
llvm::Expected<std::vector<float>> gatherParam(const ModelConfig &model, const HfTensors &tensors,
                                               const CheckpointEntry &param, const HfSource &source) {
  std::vector<int64_t> rows = sourceRows(model, param.name, source, param.type);
  std::vector<float> out;
  out.reserve(size_t(param.type.numElements()));
  for (size_t k = 0; k < source.names.size(); ++k) {
    const std::string &name = source.names[k];
    const SafeTensorsEntry *e = tensors.find(name);
    std::vector<int64_t> want = hfShape(param.type, rows[k], source.transposed);
    if (e->shape != want)
      return fileContentError(tensors.fileOf(name), "tensor '{}' has shape [{}], where this config's model needs [{}]",
                              name, fmt::join(e->shape, ", "), fmt::join(want, ", "));
    std::vector<float> values = tensors.read(name);
    if (source.transposed)
      values = transposed(values, want[0], want[1]);
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

} // namespace

llvm::Expected<ModelConfig> importHf(llvm::StringRef folder, llvm::StringRef checkpointPath, llvm::StringRef name,
                                     int64_t seqLen, HfNotes &notes) {
  llvm::SmallString<256> configPath(folder);
  llvm::sys::path::append(configPath, "config.json");
  auto config = readJsonFile(configPath, "a transformers config");
  if (!config)
    return config.takeError();
  auto model = modelFromHfConfig(*config, configPath, name, seqLen, notes);
  if (!model)
    return model.takeError();
  HfTensors tensors;
  if (auto err = tensors.open(folder))
    return std::move(err);
  auto params = modelParams(*model);
  if (!params)
    return params.takeError();
  std::map<std::string, HfSource> sources = hfSourcesOf(*model);
  // Every tensor tgc needs is there, and every one there is used: a checkpoint of another shape
  // of model is an error, not a model quietly missing a part.
  std::set<std::string> used;
  for (const CheckpointEntry &p : *params)
    for (std::string &hf : sources.at(p.name).names) {
      if (!tensors.find(hf) && hf.rfind("transformer.", 0) == 0 && tensors.find(hf.substr(12)))
        hf = hf.substr(12); // (GPT2Model's names, without GPT2LMHeadModel's "transformer.")
      if (!tensors.find(hf))
        return fileContentError(folder, "the checkpoint has no tensor '{}' (for tgc's {})", hf, p.name);
      used.insert(hf);
    }
  for (const std::string &hf : tensors.names()) {
    if (used.count(hf) || isBuffer(hf))
      continue;
    if (hf == "lm_head.weight" && model->tieEmbeddings) { // a tied head saved anyway: the same values
      if (tensors.read(hf) != tensors.read(sources.at("wte").names[0]))
        return fileContentError(tensors.fileOf(hf), "lm_head.weight differs from the embedding it is tied to "
                                                    "(tie_word_embeddings): which is the head?");
      continue;
    }
    return fileContentError(tensors.fileOf(hf), "tensor '{}' is not part of a {} model as config.json describes it", hf,
                            model->position == PositionKind::Learned ? "GPT-2" : "Llama");
  }
  llvm::json::Object meta = checkpointMetadata(*model, 0, fmt::format("none: converted from {}", folder.str()), "");
  // The folder's tokenizer travels in the checkpoint, where tgc reads it.
  llvm::SmallString<256> tokenizerPath(folder);
  llvm::sys::path::append(tokenizerPath, "tokenizer.json");
  if (llvm::sys::fs::exists(tokenizerPath)) {
    auto tokenizer = loadTokenizer(tokenizerPath);
    if (!tokenizer) {
      notes.lines.push_back("tokenizer.json not carried: " + llvm::toString(tokenizer.takeError()));
    } else if ((*tokenizer)->vocabSize() > model->vocab) {
      notes.lines.push_back(fmt::format("tokenizer.json not carried: its {} tokens are more than vocab_size {}",
                                        (*tokenizer)->vocabSize(), model->vocab));
    } else {
      meta[kTokenizerMeta] = (*tokenizer)->source();
      notes.lines.push_back("tokenizer.json carried in the checkpoint: " + (*tokenizer)->describe());
    }
  }
  auto produce = [&](const CheckpointEntry &p) { return gatherParam(*model, tensors, p, sources.at(p.name)); };
  if (auto err = writeCheckpointStreamed(checkpointPath, *params, meta, produce))
    return std::move(err);
  return model;
}

llvm::Error exportHf(const ModelConfig &model, const Checkpoint &checkpoint, llvm::StringRef folder) {
  auto config = hfConfigOf(model);
  if (!config)
    return config.takeError();
  // Each Hugging Face tensor: the tgc parameter it is part of, and its rows there.
  struct Part {
    std::string param;
    int64_t firstRow, rows;
    bool transposed;
  };
  std::map<std::string, Part> parts;
  for (const auto &[param, source] : hfSourcesOf(model)) {
    auto it = checkpoint.tensors.find(param);
    if (it == checkpoint.tensors.end())
      return stringError(fmt::format("error: the checkpoint has no tensor '{}'", param));
    std::vector<int64_t> rows = sourceRows(model, param, source, it->second.type);
    int64_t first = 0;
    for (size_t k = 0; k < source.names.size(); ++k) {
      parts[source.names[k]] = {param, first, rows[k], source.transposed};
      first += rows[k];
    }
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto &[name, part] : parts)
    shapes.emplace_back(name, hfShape(checkpoint.tensors.at(part.param).type, part.rows, part.transposed));
  std::string header = formatSafeTensorsHeader(shapes, {{"format", "pt"}});
  if (auto err = llvm::sys::fs::create_directories(folder))
    return fileContentError(folder, "cannot create the folder: {}", err.message());
  llvm::SmallString<256> weights(folder), configPath(folder);
  llvm::sys::path::append(weights, "model.safetensors");
  llvm::sys::path::append(configPath, "config.json");
  auto write = [&](llvm::raw_pwrite_stream &os) -> llvm::Error {
    os << header;
    for (const auto &[name, part] : parts) {
      const Tensor &t = checkpoint.tensors.at(part.param);
      int64_t cols = t.type.rank() == 1 ? 1 : t.type.dim(1);
      std::vector<float> rows(t.data.begin() + part.firstRow * cols, t.data.begin() + (part.firstRow + part.rows) * cols);
      if (part.transposed)
        rows = transposed(rows, part.rows, cols);
      os.write(reinterpret_cast<const char *>(rows.data()), rows.size() * 4);
    }
    return llvm::Error::success();
  };
  if (auto err = writeFileAtomicallyWith(weights, write))
    return err;
  std::string text;
  llvm::raw_string_ostream(text) << llvm::formatv("{0:2}", llvm::json::Value(std::move(*config))) << "\n";
  return writeFileAtomically(configPath, text);
}

} // namespace tgc
