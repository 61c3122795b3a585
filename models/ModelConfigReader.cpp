// The model file's reader: one YAML document into a ModelConfig, each key checked against the
// settings' ranges and choices (ModelConfig.cpp), every error naming its place in the file.
#include "models/ModelConfig.h"

#include "support/Error.h"
#include "support/Limits.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/GlobPattern.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/YAMLParser.h"

#include <charconv>
#include <cmath>
#include <fmt/format.h>
#include <type_traits>

namespace tgc {

namespace {

/// A YAML node copied out of LLVM's streaming parser, whose nodes cannot be visited twice.
struct YNode {
  enum Kind { Scalar, Mapping, Sequence, Other } kind = Other;
  llvm::SMLoc loc;
  std::string value;                            // Scalar
  std::vector<std::pair<YNode, YNode>> entries; // Mapping: (key, value) in file order
  std::vector<YNode> items;                     // Sequence
};

YNode materialize(llvm::yaml::Node *node) {
  YNode out;
  if (!node)
    return out;
  out.loc = node->getSourceRange().Start;
  if (auto *scalar = llvm::dyn_cast<llvm::yaml::ScalarNode>(node)) {
    llvm::SmallString<32> storage;
    out.kind = YNode::Scalar;
    out.value = scalar->getValue(storage).str();
  } else if (auto *map = llvm::dyn_cast<llvm::yaml::MappingNode>(node)) {
    out.kind = YNode::Mapping;
    for (auto &entry : *map)
      out.entries.emplace_back(materialize(entry.getKey()), materialize(entry.getValue()));
  } else if (auto *seq = llvm::dyn_cast<llvm::yaml::SequenceNode>(node)) {
    out.kind = YNode::Sequence;
    for (auto &item : *seq)
      out.items.push_back(materialize(&item));
  }
  return out;
}

/// Reads one YAML document into a ModelConfig. Every error carries the place it refers to.
class ConfigReader {
public:
  ConfigReader(llvm::StringRef text, llvm::StringRef file) : file_(file.str()) {
    buffer_ = llvm::MemoryBuffer::getMemBuffer(text, file, /*RequiresNullTerminator=*/false);
    // The YAML parser reports syntax errors through the SourceMgr; keep the first as one line.
    sm_.setDiagHandler(
        [](const llvm::SMDiagnostic &diag, void *context) {
          auto *self = static_cast<ConfigReader *>(context);
          if (self->error_.empty())
            self->error_ = fmt::format("{}:{}:{}: error: {}", self->file_, diag.getLineNo(), diag.getColumnNo() + 1,
                                       diag.getMessage().str());
        },
        this);
  }

  llvm::Expected<ModelConfig> read();

private:
  using Fields = llvm::StringMap<const YNode *>;
  // The sections of the description after `model`, each read where `top` has it.
  void readTrain(Fields &top, TrainConfig &t);
  void readData(Fields &top, ModelConfig &config);
  void readPrecision(Fields &top, PrecisionConfig &p);

  std::string where(llvm::SMLoc loc) const {
    if (!loc.isValid())
      return file_ + ": ";
    auto [line, col] = sm_.getLineAndColumn(loc);
    return fmt::format("{}:{}:{}: ", file_, line, col);
  }
  void fail(const YNode *node, const std::string &message) {
    if (error_.empty())
      error_ = where(node ? node->loc : llvm::SMLoc()) + "error: " + message;
  }
  bool failed() const { return !error_.empty(); }

  bool readMapping(const YNode *node, llvm::StringRef section, llvm::ArrayRef<llvm::StringRef> allowed, Fields &fields);
  std::optional<std::string> scalar(const YNode *node, llvm::StringRef key);
  /// Field `key`'s node and its single value, where the reader has not failed and the field is
  /// there (a field that is not a single value fails the reader).
  std::optional<std::pair<const YNode *, std::string>> field(const Fields &fields, llvm::StringRef key);
  void readInt(const Fields &fields, llvm::StringRef key, int64_t &out, bool required) {
    SettingRange range = settingRange(key);
    readInt(fields, key, out, int64_t(range.min), int64_t(range.max), required);
  }
  void readInt(const Fields &fields, llvm::StringRef key, int64_t &out, int64_t min, int64_t max, bool required);
  void readUInt(const Fields &fields, llvm::StringRef key, uint64_t &out);
  void readDouble(const Fields &fields, llvm::StringRef key, double &out) {
    readDouble(fields, key, out, settingRange(key).min, settingRange(key).max);
  }
  void readDouble(const Fields &fields, llvm::StringRef key, double &out, double min, double max);
  void readBool(const Fields &fields, llvm::StringRef key, bool &out);
  void readRecompute(const Fields &train, TrainConfig &t);
  void readChoice(const Fields &fields, llvm::StringRef key, std::string &out);
  void readPositions(const Fields &model, ModelConfig &config);
  void readRopeScaling(const Fields &model, ModelConfig &config);
  void readStrings(const Fields &fields, llvm::StringRef key, std::vector<std::string> &out);

  std::string file_;
  const YNode *section_ = nullptr; // the mapping being read, for "missing key" errors
  llvm::StringRef sectionName_;
  std::unique_ptr<llvm::MemoryBuffer> buffer_;
  llvm::SourceMgr sm_;
  std::string error_;
};

bool ConfigReader::readMapping(const YNode *node, llvm::StringRef section, llvm::ArrayRef<llvm::StringRef> allowed,
                               Fields &fields) {
  section_ = node;
  sectionName_ = section;
  if (node->kind != YNode::Mapping) {
    fail(node, fmt::format("'{}' must be a mapping of keys to values", section.str()));
    return false;
  }
  for (const auto &[keyNode, value] : node->entries) {
    if (keyNode.kind != YNode::Scalar) {
      fail(&keyNode, fmt::format("keys of '{}' must be plain names", section.str()));
      return false;
    }
    const std::string &key = keyNode.value;
    if (!llvm::is_contained(allowed, key)) {
      std::string list;
      for (llvm::StringRef a : allowed)
        list += (list.empty() ? "" : ", ") + a.str();
      fail(&keyNode, fmt::format("unknown key '{}' in '{}' (expected one of: {})", key, section.str(), list));
      return false;
    }
    if (fields.count(key)) {
      fail(&keyNode, fmt::format("key '{}' appears twice in '{}'", key, section.str()));
      return false;
    }
    fields[key] = &value;
  }
  return !failed();
}

std::optional<std::string> ConfigReader::scalar(const YNode *node, llvm::StringRef key) {
  if (node->kind != YNode::Scalar) {
    fail(node, fmt::format("'{}' must be a single value", key.str()));
    return std::nullopt;
  }
  return node->value;
}

std::optional<std::pair<const YNode *, std::string>> ConfigReader::field(const Fields &fields, llvm::StringRef key) {
  if (failed() || !fields.count(key))
    return std::nullopt;
  const YNode *node = fields.lookup(key);
  auto text = scalar(node, key);
  if (!text)
    return std::nullopt;
  return std::pair{node, *text};
}

void ConfigReader::readInt(const Fields &fields, llvm::StringRef key, int64_t &out, int64_t min, int64_t max,
                           bool required) {
  if (failed())
    return;
  auto it = fields.find(key);
  if (it == fields.end()) {
    if (required)
      fail(section_, fmt::format("missing required key '{}' in '{}'", key.str(), sectionName_.str()));
    return;
  }
  auto text = scalar(it->second, key);
  if (!text)
    return;
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec == std::errc::result_out_of_range ||
      (ec == std::errc() && ptr == text->data() + text->size() && (value < min || value > max))) {
    fail(it->second, fmt::format("{} ({}) must be between {} and {}", key.str(), *text, min, max));
    return;
  }
  if (ec != std::errc() || ptr != text->data() + text->size()) {
    fail(it->second, fmt::format("{} must be an integer, got '{}'", key.str(), *text));
    return;
  }
  out = value;
}

void ConfigReader::readUInt(const Fields &fields, llvm::StringRef key, uint64_t &out) {
  auto f = field(fields, key);
  if (!f)
    return;
  auto [node, text] = *f;
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    fail(node, fmt::format("{} must be a non-negative 64-bit integer, got '{}'", key.str(), text));
    return;
  }
  out = value;
}

void ConfigReader::readDouble(const Fields &fields, llvm::StringRef key, double &out, double min, double max) {
  auto f = field(fields, key);
  if (!f)
    return;
  auto [node, text] = *f;
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || !std::isfinite(value)) {
    fail(node, fmt::format("{} must be a number, got '{}'", key.str(), text));
    return;
  }
  if (value < min || value > max) {
    fail(node, fmt::format("{} ({}) must be between {} and {}", key.str(), text, min, max));
    return;
  }
  out = value;
}

void ConfigReader::readBool(const Fields &fields, llvm::StringRef key, bool &out) {
  auto f = field(fields, key);
  if (!f)
    return;
  auto [node, text] = *f;
  if (text == "true")
    out = true;
  else if (text == "false")
    out = false;
  else
    fail(node, fmt::format("{} must be true or false, got '{}'", key.str(), text));
}

/// recompute (true, false or auto), recompute_layers (the first N layers: recompute on) and
/// memory_budget (GiB, for auto).
void ConfigReader::readRecompute(const Fields &train, TrainConfig &t) {
  if (failed())
    return;
  if (train.count("recompute") && scalar(train.lookup("recompute"), "recompute") == std::optional<std::string>("auto"))
    t.recompute = t.recomputeAuto = true;
  else
    readBool(train, "recompute", t.recompute);
  if (train.count("recompute_layers")) {
    readInt(train, "recompute_layers", t.recomputeLayers, false);
    if (t.recomputeAuto)
      return fail(train.lookup("recompute_layers"), "recompute_layers chooses the layers, recompute: auto "
                                                    "chooses them from the memory: give one");
    t.recompute = true;
  }
  readDouble(train, "memory_budget", t.memoryBudgetGiB);
  if (!failed() && t.memoryBudgetGiB > 0 && !t.recomputeAuto)
    fail(train.lookup("memory_budget"), "memory_budget is recompute: auto's budget; set recompute: auto");
}

/// position, rope_theta and kv_heads (after heads and d_model are read and checked).
void ConfigReader::readPositions(const Fields &model, ModelConfig &config) {
  std::string position = "learned";
  readChoice(model, "position", position);
  config.position = position == "rope" ? PositionKind::Rope : PositionKind::Learned;
  readDouble(model, "rope_theta", config.ropeTheta);
  readInt(model, "kv_heads", config.kvHeads, false);
  if (failed())
    return;
  readRopeScaling(model, config);
  if (failed())
    return;
  if (model.count("rope_theta") && config.position != PositionKind::Rope)
    fail(model.lookup("rope_theta"), "rope_theta belongs to position: rope");
  else if (config.position == PositionKind::Rope && config.headDim() % 2 != 0)
    fail(model.lookup("position"),
         fmt::format("position: rope needs an even head dimension; d_model / heads is {}", config.headDim()));
  else if (model.count("kv_heads") && config.heads % config.kvHeads != 0)
    fail(model.lookup("kv_heads"), fmt::format("kv_heads ({}) must divide heads ({})", config.kvHeads, config.heads));
}

/// rope_scaling: llama3 and its four numbers (Hugging Face's defaults for Llama 3.2 where left
/// out: factor 32, low 1, high 4, original length 8192); the numbers alone are an error.
void ConfigReader::readRopeScaling(const Fields &model, ModelConfig &config) {
  const char *keys[] = {"rope_factor", "rope_low_freq_factor", "rope_high_freq_factor", "rope_original_length"};
  if (!model.count("rope_scaling")) {
    for (const char *key : keys)
      if (model.count(key))
        fail(model.lookup(key), fmt::format("{} belongs to rope_scaling: llama3", key));
    return;
  }
  std::string type;
  readChoice(model, "rope_scaling", type);
  if (failed())
    return;
  if (config.position != PositionKind::Rope) {
    fail(model.lookup("rope_scaling"), "rope_scaling belongs to position: rope");
    return;
  }
  RopeScaling s{32.0, 1.0, 4.0, 8192.0};
  readDouble(model, "rope_factor", s.factor);
  readDouble(model, "rope_low_freq_factor", s.lowFreq);
  readDouble(model, "rope_high_freq_factor", s.highFreq);
  readDouble(model, "rope_original_length", s.originalLength);
  if (!failed() && !(s.highFreq > s.lowFreq))
    fail(model.count("rope_high_freq_factor") ? model.lookup("rope_high_freq_factor") : model.lookup("rope_scaling"),
         fmt::format("rope_high_freq_factor ({}) must exceed rope_low_freq_factor ({})", s.highFreq, s.lowFreq));
  config.ropeScaling = s;
}

void ConfigReader::readChoice(const Fields &fields, llvm::StringRef key, std::string &out) {
  llvm::ArrayRef<llvm::StringRef> choices = settingChoices(key);
  auto f = field(fields, key);
  if (!f)
    return;
  auto [node, text] = *f;
  if (!llvm::is_contained(choices, text)) {
    std::string list;
    for (llvm::StringRef c : choices)
      list += (list.empty() ? "" : " | ") + c.str();
    fail(node, fmt::format("{} must be one of {}, got '{}'", key.str(), list, text));
    return;
  }
  out = text;
}

void ConfigReader::readStrings(const Fields &fields, llvm::StringRef key, std::vector<std::string> &out) {
  if (failed() || !fields.count(key))
    return;
  const YNode *node = fields.lookup(key);
  if (node->kind != YNode::Sequence) {
    fail(node, fmt::format("{} must be a list, e.g. [lm_head, \"h0.*\"]", key.str()));
    return;
  }
  out.clear();
  for (const YNode &item : node->items) {
    if (item.kind != YNode::Scalar || item.value.empty()) {
      fail(&item, fmt::format("{} holds names or glob patterns", key.str()));
      return;
    }
    // Layer names and their patterns are single words: a space, a line break or a control
    // character is a list's commas or a quote gone missing (and would not read back the same).
    if (llvm::any_of(item.value, [](unsigned char ch) { return ch <= ' ' || ch == 0x7f; })) {
      fail(&item,
           fmt::format("'{}' in {} holds a space or a control character; names and glob patterns are "
                       "single words, separated by commas",
                       llvm::StringRef(item.value).take_until([](char ch) { return ch == '\n'; }).str(), key.str()));
      return;
    }
    if (auto glob = llvm::GlobPattern::create(item.value); !glob) {
      fail(&item, fmt::format("'{}' in {} is not a glob pattern: {}", item.value, key.str(),
                              llvm::toString(glob.takeError())));
      return;
    }
    out.push_back(item.value);
  }
}

void ConfigReader::readTrain(Fields &top, TrainConfig &t) {
  Fields train;
  if (top.count("train") && readMapping(top["train"], "train",
                                        {"batch", "lr", "steps", "warmup", "weight_decay", "beta1", "beta2", "eps",
                                         "grad_clip", "min_lr_ratio", "decay_embeddings", "recompute",
                                         "recompute_layers", "memory_budget", "shard", "grad_reduce", "seed"},
                                        train)) {
    readInt(train, "batch", t.batch, false);
    readDouble(train, "lr", t.lr);
    readInt(train, "steps", t.steps, false);
    readInt(train, "warmup", t.warmup, false);
    readDouble(train, "weight_decay", t.weightDecay);
    readDouble(train, "beta1", t.beta1);
    readDouble(train, "beta2", t.beta2);
    readDouble(train, "eps", t.eps);
    readDouble(train, "grad_clip", t.gradClip);
    readDouble(train, "min_lr_ratio", t.minLrRatio);
    readBool(train, "decay_embeddings", t.decayEmbeddings);
    readRecompute(train, t);
    std::string shard = "none";
    readChoice(train, "shard", shard);
    t.shardOptimizer = shard != "none";
    t.shardGradients = shard == "gradients";
    std::string reduce = "fp32";
    readChoice(train, "grad_reduce", reduce);
    t.bf16GradientReduce = reduce == "bf16";
    readUInt(train, "seed", t.seed);
  }
}

void ConfigReader::readData(Fields &top, ModelConfig &config) {
  Fields data;
  // The default progression steps fit the vocabulary (a step is at most vocab - 1), so that a
  // small vocabulary without a data section describes a model that also reads back.
  config.data.maxStep = std::min<int64_t>(config.data.maxStep, std::max<int64_t>(1, config.vocab - 1));
  config.data.minStep = std::min(config.data.minStep, config.data.maxStep);
  if (top.count("data") && readMapping(top["data"], "data", {"min_step", "max_step"}, data)) {
    readInt(data, "min_step", config.data.minStep, 1, config.vocab - 1, false);
    readInt(data, "max_step", config.data.maxStep, 1, config.vocab - 1, false);
    if (!failed() && config.data.maxStep < config.data.minStep)
      fail(data["max_step"],
           fmt::format("max_step ({}) is below min_step ({})", config.data.maxStep, config.data.minStep));
  }
}

void ConfigReader::readPrecision(Fields &top, PrecisionConfig &p) {
  Fields precision;
  if (top.count("precision") &&
      readMapping(top["precision"], "precision",
                  {"recipe", "fp8_format", "fp8_scaling", "margin", "amax_history_len", "amax_compute_algo",
                   "keep_bf16", "fp8_min_dim", "fp8_layers", "fp8_weights", "fp8_attention"},
                  precision)) {
    std::string recipe(recipeName(p.recipe)), format(fp8FormatName(p.fp8Format));
    readChoice(precision, "recipe", recipe);
    readChoice(precision, "fp8_format", format);
    p.recipe = parseRecipe(recipe).value_or(p.recipe);
    p.fp8Format = format == "hybrid" ? Fp8Formats::Hybrid : Fp8Formats::E4M3;
    readInt(precision, "margin", p.margin, false);
    readInt(precision, "amax_history_len", p.amaxHistoryLen, false);
    readChoice(precision, "amax_compute_algo", p.amaxComputeAlgo);
    std::string scaling(fp8ScalingName(p.fp8Scaling));
    readChoice(precision, "fp8_scaling", scaling);
    p.fp8Scaling = parseFp8Scaling(scaling).value_or(p.fp8Scaling);
    readStrings(precision, "keep_bf16", p.keepBf16);
    readInt(precision, "fp8_min_dim", p.fp8MinDim, false);
    if (precision.count("fp8_layers"))
      readStrings(precision, "fp8_layers", p.fp8Layers.emplace());
    readBool(precision, "fp8_weights", p.fp8Weights);
    readBool(precision, "fp8_attention", p.fp8Attention);
  }
}

llvm::Expected<ModelConfig> ConfigReader::read() {
  auto fromError = [&]() { return stringError(escapeForMessage(error_)); };
  ModelConfig config;
  // Bounded before LLVM's parser (recursive in the nesting) runs.
  llvm::StringRef text = buffer_->getBuffer();
  if (text.size() > kMaxModelFileBytes) {
    error_ = fmt::format("{}: error: {} bytes: larger than the {} MiB a model description may be", file_, text.size(),
                         kMaxModelFileBytes >> 20);
    return fromError();
  }
  if (auto deep = findDeepNesting(text, kMaxYamlDepth, /*yaml=*/true)) {
    auto [line, column] = lineAndColumn(text, *deep);
    error_ = fmt::format("{}:{}:{}: error: nested deeper than {} levels (a model description nests two)", file_, line,
                         column, kMaxYamlDepth);
    return fromError();
  }
  llvm::yaml::Stream stream(buffer_->getMemBufferRef(), sm_, /*ShowColors=*/false);
  auto doc = stream.begin();
  if (failed())
    return fromError();
  if (doc == stream.end() || !doc->getRoot() || llvm::isa<llvm::yaml::NullNode>(doc->getRoot())) {
    error_ = file_ + ":1:1: error: empty model description (expected keys name, model, ...)";
    return fromError();
  }
  YNode root = materialize(doc->getRoot());
  // Read the rest of the stream so that syntax errors anywhere in the file are reported.
  for (++doc; doc != stream.end() && !failed(); ++doc)
    fail(nullptr, "only one YAML document is allowed");
  if (!failed() && stream.failed())
    error_ = file_ + ": error: malformed YAML";
  if (failed())
    return fromError();
  Fields top, model;
  if (!readMapping(&root, "the model description", {"name", "model", "train", "data", "precision"}, top))
    return fromError();
  if (!top.count("model")) {
    error_ = file_ + ":1:1: error: missing required section 'model'";
    return fromError();
  }
  if (top.count("name")) {
    if (auto name = scalar(top["name"], "name"))
      config.name = *name;
    bool valid = !config.name.empty() &&
                 llvm::all_of(config.name, [](char c) { return llvm::isAlnum(c) || c == '_' || c == '-' || c == '.'; });
    if (!failed() && !valid)
      fail(top["name"], "name must be letters, digits, '_', '-' or '.'");
  } else {
    config.name = llvm::sys::path::stem(file_).str();
  }
  readMapping(top["model"], "model",
              {"vocab", "seq_len", "d_model", "heads", "layers", "ffn", "norm", "activation", "bias", "tie_embeddings",
               "norm_eps", "position", "rope_theta", "rope_scaling", "rope_factor", "rope_low_freq_factor",
               "rope_high_freq_factor", "rope_original_length", "kv_heads"},
              model);
  readInt(model, "vocab", config.vocab, true);
  readInt(model, "seq_len", config.seqLen, true);
  readInt(model, "d_model", config.dModel, true);
  readInt(model, "heads", config.heads, true);
  readInt(model, "layers", config.layers, true);
  readInt(model, "ffn", config.ffn, true);
  std::string norm = "layernorm", activation = "gelu";
  readChoice(model, "norm", norm);
  readChoice(model, "activation", activation);
  config.norm = norm == "layernorm" ? NormKind::LayerNorm : NormKind::RMSNorm;
  config.activation = activation == "gelu" ? ActivationKind::Gelu : ActivationKind::SwiGLU;
  readBool(model, "bias", config.bias);
  readBool(model, "tie_embeddings", config.tieEmbeddings);
  readDouble(model, "norm_eps", config.normEps);
  if (!failed() && config.dModel % config.heads != 0)
    fail(model["heads"], fmt::format("heads ({}) does not divide d_model ({})", config.heads, config.dModel));
  readPositions(model, config);

  readTrain(top, config.train);
  readData(top, config);
  readPrecision(top, config.precision);
  if (failed())
    return fromError();

  constexpr int64_t kMaxParams = int64_t(1) << 37; // 137 billion: far beyond any target here
  // Dimensions are each bounded above, so this product cannot overflow int64.
  if (config.numParams() > kMaxParams) {
    error_ = fmt::format("{}: error: model has {} parameters, more than the limit of {}", file_, config.numParams(),
                         kMaxParams);
    return fromError();
  }
  return config;
}

} // namespace

llvm::Expected<ModelConfig> parseModelConfig(llvm::StringRef text, llvm::StringRef file) {
  return ConfigReader(text, file).read();
}

llvm::Expected<ModelConfig> loadModelConfig(llvm::StringRef path) {
  auto buffer = readFileAtMost(path, kMaxModelFileBytes, "a model file");
  if (!buffer)
    return buffer.takeError();
  return parseModelConfig((*buffer)->getBuffer(), path);
}

} // namespace tgc
