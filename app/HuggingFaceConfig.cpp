// transformers' config.json to and from tgc's model description: GPT2Config and LlamaConfig,
// each field tgc reads checked, each one it cannot express refused by its name.
#include "app/HuggingFace.h"

#include "support/Error.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace tgc {

namespace {

/// Reads config.json's fields, keeping the first error: a missing field without a default, or
/// one of another type.
class FieldReader {
public:
  FieldReader(const llvm::json::Object &config, llvm::StringRef path) : config_(config), path_(path) {}

  int64_t integer(llvm::StringRef key, std::optional<int64_t> fallback = std::nullopt) {
    const llvm::json::Value *v = config_.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback ? *fallback : missing(key);
    if (auto i = v->getAsInteger())
      return *i;
    fail(fmt::format("'{}' must be an integer", key.str()));
    return 0;
  }
  double number(llvm::StringRef key, std::optional<double> fallback = std::nullopt) {
    const llvm::json::Value *v = config_.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback ? *fallback : double(missing(key));
    if (auto d = v->getAsNumber())
      return *d;
    fail(fmt::format("'{}' must be a number", key.str()));
    return 0;
  }
  std::string text(llvm::StringRef key, std::optional<std::string> fallback = std::nullopt) {
    const llvm::json::Value *v = config_.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback ? *fallback : (missing(key), std::string());
    if (auto s = v->getAsString())
      return s->str();
    fail(fmt::format("'{}' must be a string", key.str()));
    return "";
  }
  bool flag(llvm::StringRef key, bool fallback) {
    const llvm::json::Value *v = config_.get(key);
    if (!v || v->kind() == llvm::json::Value::Null)
      return fallback;
    if (auto b = v->getAsBoolean())
      return *b;
    fail(fmt::format("'{}' must be true or false", key.str()));
    return fallback;
  }
  /// A field tgc has no way to express, unless it holds what tgc does.
  void require(bool ok, const std::string &what) {
    if (!ok)
      fail(what);
  }
  void fail(const std::string &what) {
    if (error_.empty())
      error_ = what;
  }
  llvm::Error takeError() const {
    return error_.empty() ? llvm::Error::success()
                          : stringError(escapeForMessage(fmt::format("{}: error: {}", path_, error_)));
  }

private:
  int64_t missing(llvm::StringRef key) {
    fail(fmt::format("'{}' is missing", key.str()));
    return 0;
  }
  const llvm::json::Object &config_;
  std::string path_, error_;
};

void readGpt2(FieldReader &f, ModelConfig &m, HfNotes &notes) {
  m.vocab = f.integer("vocab_size");
  m.seqLen = f.integer("n_positions");
  m.dModel = f.integer("n_embd");
  m.heads = f.integer("n_head");
  m.layers = f.integer("n_layer");
  m.ffn = f.integer("n_inner", 4 * m.dModel);
  m.normEps = f.number("layer_norm_epsilon", 1e-5);
  m.tieEmbeddings = f.flag("tie_word_embeddings", true);
  m.norm = NormKind::LayerNorm;
  m.activation = ActivationKind::Gelu;
  m.bias = true;
  m.position = PositionKind::Learned;
  std::string activation = f.text("activation_function", "gelu_new");
  f.require(activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast",
            fmt::format("activation_function '{}': tgc's GELU is the tanh approximation (gelu_new)", activation));
  f.require(f.flag("scale_attn_weights", true), "scale_attn_weights false: tgc scales the scores by 1/sqrt(head_dim)");
  f.require(!f.flag("scale_attn_by_inverse_layer_idx", false),
            "scale_attn_by_inverse_layer_idx true: tgc scales every layer's scores alike");
  f.require(!f.flag("add_cross_attention", false), "add_cross_attention true: tgc's decoder has no cross-attention");
  for (const char *dropout : {"attn_pdrop", "resid_pdrop", "embd_pdrop"})
    if (double p = f.number(dropout, 0.0); p > 0)
      notes.lines.push_back(fmt::format("{} {}: tgc trains without dropout", dropout, p));
}

void readLlama(FieldReader &f, ModelConfig &m, HfNotes &notes) {
  m.vocab = f.integer("vocab_size");
  m.seqLen = f.integer("max_position_embeddings");
  m.dModel = f.integer("hidden_size");
  m.heads = f.integer("num_attention_heads");
  m.kvHeads = f.integer("num_key_value_heads", m.heads);
  // (0 would read as tgc's "as many as the query heads": transformers divides by it.)
  f.require(m.kvHeads >= 1, fmt::format("'num_key_value_heads' ({}) must be at least 1", m.kvHeads));
  m.layers = f.integer("num_hidden_layers");
  m.ffn = f.integer("intermediate_size");
  m.normEps = f.number("rms_norm_eps", 1e-6);
  m.tieEmbeddings = f.flag("tie_word_embeddings", false);
  m.norm = NormKind::RMSNorm;
  m.activation = ActivationKind::SwiGLU;
  m.bias = false;
  m.position = PositionKind::Rope;
  m.ropeTheta = f.number("rope_theta", 10000.0);
  std::string act = f.text("hidden_act", "silu");
  f.require(act == "silu", fmt::format("hidden_act '{}': tgc's SwiGLU gates by silu", act));
  f.require(!f.flag("attention_bias", false), "attention_bias true: tgc's Llama layers have no biases");
  f.require(!f.flag("mlp_bias", false), "mlp_bias true: tgc's Llama layers have no biases");
  if (m.heads > 0 && m.dModel % m.heads == 0)
    f.require(f.integer("head_dim", m.dModel / m.heads) == m.dModel / m.heads,
              fmt::format("head_dim {} is not hidden_size / num_attention_heads ({}): tgc's heads split d_model",
                          f.integer("head_dim", 0), m.dModel / m.heads));
  if (double p = f.number("attention_dropout", 0.0); p > 0)
    notes.lines.push_back(fmt::format("attention_dropout {}: tgc trains without dropout", p));
}

void readRopeScalingObject(const llvm::json::Object &s, FieldReader &f, ModelConfig &m);

/// Llama 3's rope_scaling {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
/// "original_max_position_embeddings"}; any other type is refused by its name.
void readRopeScaling(const llvm::json::Object &config, FieldReader &f, ModelConfig &m) {
  // transformers 5 writes rope_parameters {"rope_theta", "rope_type", "factor", ...}; earlier
  // ones rope_theta and rope_scaling {"rope_type" (or "type"), "factor", ...} beside it.
  if (const llvm::json::Object *p = config.getObject("rope_parameters")) {
    FieldReader parameters(*p, "");
    m.ropeTheta = parameters.number("rope_theta", m.ropeTheta);
    std::string type = parameters.text("rope_type", "default");
    if (auto err = parameters.takeError())
      return f.fail("rope_parameters: " + llvm::toString(std::move(err)).substr(9));
    if (type == "default")
      return;
    return readRopeScalingObject(*p, f, m);
  }
  const llvm::json::Value *v = config.get("rope_scaling");
  if (!v || v->kind() == llvm::json::Value::Null)
    return;
  const llvm::json::Object *s = v->getAsObject();
  if (!s)
    return f.fail("'rope_scaling' must be an object or null");
  readRopeScalingObject(*s, f, m);
}

void readRopeScalingObject(const llvm::json::Object &s, FieldReader &f, ModelConfig &m) {
  FieldReader scaling(s, "");
  std::string type = scaling.text("rope_type", scaling.text("type", ""));
  if (type != "llama3")
    return f.fail(fmt::format("rope_scaling type '{}': tgc has Llama 3's (llama3) alone", type));
  RopeScaling r;
  r.factor = scaling.number("factor");
  r.lowFreq = scaling.number("low_freq_factor", 1.0);
  r.highFreq = scaling.number("high_freq_factor", 4.0);
  r.originalLength = scaling.number("original_max_position_embeddings", 8192.0);
  if (auto err = scaling.takeError())
    return f.fail("rope_scaling: " + llvm::toString(std::move(err)).substr(9));
  m.ropeScaling = r;
}

} // namespace

llvm::Expected<ModelConfig> modelFromHfConfig(const llvm::json::Object &config, llvm::StringRef path,
                                              llvm::StringRef name, int64_t seqLen, HfNotes &notes) {
  FieldReader f(config, path);
  ModelConfig m;
  m.name = name.str();
  std::string type = f.text("model_type");
  if (auto err = f.takeError())
    return std::move(err);
  if (type == "gpt2") {
    readGpt2(f, m, notes);
  } else if (type == "llama") {
    readLlama(f, m, notes);
    readRopeScaling(config, f, m);
  } else {
    f.fail(fmt::format("model_type '{}': tgc converts gpt2 and llama models", type));
  }
  if (auto err = f.takeError())
    return std::move(err);
  if (seqLen > 0)
    m.seqLen = seqLen;
  m.data.maxStep = std::min<int64_t>(m.data.maxStep, m.vocab - 1); // (the arithmetic task's, which needs k < vocab)
  // Through the model file's reader, which checks every value as it checks a file's.
  auto checked = parseModelConfig(formatModelConfig(m), (path + " (as a tgc model)").str());
  if (!checked)
    return checked.takeError();
  checked->precision = PrecisionConfig{};
  return checked;
}

llvm::Expected<llvm::json::Object> hfConfigOf(const ModelConfig &m) {
  if (m.position == PositionKind::Learned && m.norm == NormKind::LayerNorm && m.activation == ActivationKind::Gelu &&
      m.bias && m.kvHeadCount() == m.heads)
    return llvm::json::Object{{"model_type", "gpt2"},
                              {"architectures", llvm::json::Array{"GPT2LMHeadModel"}},
                              {"vocab_size", m.vocab},
                              {"n_positions", m.seqLen},
                              {"n_ctx", m.seqLen},
                              {"n_embd", m.dModel},
                              {"n_head", m.heads},
                              {"n_layer", m.layers},
                              {"n_inner", m.ffn},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", m.normEps},
                              {"tie_word_embeddings", m.tieEmbeddings},
                              {"attn_pdrop", 0.0},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"torch_dtype", "float32"}};
  if (m.position == PositionKind::Rope && m.norm == NormKind::RMSNorm && m.activation == ActivationKind::SwiGLU &&
      !m.bias) {
    llvm::json::Object c{{"model_type", "llama"},
                         {"architectures", llvm::json::Array{"LlamaForCausalLM"}},
                         {"vocab_size", m.vocab},
                         {"max_position_embeddings", m.seqLen},
                         {"hidden_size", m.dModel},
                         {"intermediate_size", m.ffn},
                         {"num_attention_heads", m.heads},
                         {"num_key_value_heads", m.kvHeadCount()},
                         {"num_hidden_layers", m.layers},
                         {"head_dim", m.headDim()},
                         {"hidden_act", "silu"},
                         {"rms_norm_eps", m.normEps},
                         {"rope_theta", m.ropeTheta},
                         {"attention_bias", false},
                         {"mlp_bias", false},
                         {"tie_word_embeddings", m.tieEmbeddings},
                         {"torch_dtype", "float32"}};
    if (m.ropeScaling)
      c["rope_scaling"] = llvm::json::Object{{"rope_type", "llama3"},
                                             {"factor", m.ropeScaling->factor},
                                             {"low_freq_factor", m.ropeScaling->lowFreq},
                                             {"high_freq_factor", m.ropeScaling->highFreq},
                                             {"original_max_position_embeddings",
                                              int64_t(m.ropeScaling->originalLength)}};
    else
      c["rope_scaling"] = nullptr;
    return c;
  }
  return stringError(fmt::format("error: model '{}' is neither GPT-2's shape (learned positions, LayerNorm, GELU, "
                                 "biases) nor Llama's (RoPE, RMSNorm, SwiGLU, no biases): transformers has no "
                                 "class for it",
                                 m.name));
}

} // namespace tgc
