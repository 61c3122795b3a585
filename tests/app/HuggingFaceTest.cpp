// Hugging Face model folders (app/HuggingFace.h) on fixtures the tests write: the layouts of
// GPT-2's Conv1D and Llama's separate q, k, v and gate, up tensors against tgc's, F16 and BF16
// tensors, shards, the round trip through export and import, the streamed checkpoint writer,
// fine-tuning from imported weights, and the configs and files refused by name.
#include "app/Generate.h"
#include "app/HuggingFace.h"
#include "app/SafeTensors.h"
#include "app/Trainer.h"
#include "support/Files.h"
#include "models/ProgramInterface.h"
#include "support/Numerics.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <cmath>
#include <fmt/format.h>

using namespace tgc;
using namespace tgc::test;

namespace {

std::string tempFolder(const char *name) {
  llvm::SmallString<128> path;
  llvm::sys::fs::createUniquePath(std::string("tgc-hf-%%%%%%-") + name, path, /*MakeAbsolute=*/true);
  llvm::sys::fs::create_directories(path);
  return path.str().str();
}
std::string inFolder(const std::string &folder, const char *file) {
  llvm::SmallString<256> path(folder);
  llvm::sys::path::append(path, file);
  return path.str().str();
}

/// A safetensors file of `tensors` (name -> shape and values) in `dtype` (F32, F16 or BF16).
void writeSafeTensors(const std::string &path, const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> &tensors,
                      const char *dtype = "F32") {
  int64_t bytes = safeTensorsElementBytes(dtype);
  std::string header = "{\"__metadata__\": {\"format\": \"pt\"}", data;
  for (const auto &[name, tensor] : tensors) {
    const auto &[shape, values] = tensor;
    header += fmt::format(", \"{}\": {{\"dtype\": \"{}\", \"shape\": [{}], \"data_offsets\": [{}, {}]}}", name, dtype,
                          fmt::join(shape, ", "), data.size(), data.size() + values.size() * bytes);
    for (float v : values) {
      if (bytes == 4) {
        data.append(reinterpret_cast<const char *>(&v), 4);
        continue;
      }
      uint16_t bits = floatToBf16(v); // (the fixtures' values are exact in both 16-bit forms)
      if (std::string(dtype) == "F16") { // v = m 2^e, small integers and halves: exact in F16
        int e = 0;
        float m = std::frexp(std::fabs(v), &e);
        bits = v == 0 ? 0 : uint16_t((v < 0 ? 0x8000 : 0) | ((e + 14) << 10) | uint16_t((m * 2 - 1) * 1024));
      }
      data.append(reinterpret_cast<const char *>(&bits), 2);
    }
  }
  header += "}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i)
    file[i] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  ASSERT_FALSE(bool(writeFileAtomically(path, file + header + data)));
}

/// Values whose (row, column) can be read back from them: 100 * row + column, for a tensor of
/// `rows` x `cols` (a vector: cols 1), plus `base` to tell tensors apart.
std::vector<float> indexed(int64_t rows, int64_t cols, float base) {
  std::vector<float> v;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v.push_back(base + float(100 * r + c));
  return v;
}

ModelConfig model(const char *file) {
  ModelConfig c = unwrap(loadModelConfig(sourcePath(file)));
  c.precision.recipe = Recipe::Fp32;
  return c;
}

std::map<std::string, Tensor> weightsOf(const Trainer &t) {
  std::map<std::string, Tensor> out;
  for (auto &[name, tensor] : unwrap(t.checkpoint()).tensors)
    if (!program::isOptimizerMoment(name))
      out.emplace(name, std::move(tensor));
  return out;
}

} // namespace

TEST(HuggingFace, Gpt2sConv1DWeightsAreTransposedIntoTgcsLayout) {
  // A one-layer GPT-2 whose every value names its place: tgc's h0.attn.qkv.weight[j][i] is
  // c_attn.weight[i][j] (Conv1D computes x W, W [in, out]), the biases and norms as they are.
  const int64_t D = 4, F = 8, V = 6, T = 5;
  std::string folder = tempFolder("gpt2");
  ASSERT_FALSE(bool(writeFileAtomically(inFolder(folder, "config.json"),
                                        fmt::format("{{\"model_type\": \"gpt2\", \"vocab_size\": {}, \"n_positions\": {}, "
                                                    "\"n_embd\": {}, \"n_head\": 2, \"n_layer\": 1, \"n_inner\": {}}}",
                                                    V, T, D, F))));
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> t;
  auto put = [&](const std::string &name, std::vector<int64_t> shape, float base) {
    t[name] = {shape, indexed(shape[0], shape.size() > 1 ? shape[1] : 1, base)};
  };
  put("transformer.wte.weight", {V, D}, 0);
  put("transformer.wpe.weight", {T, D}, 0.5f);
  put("transformer.h.0.ln_1.weight", {D}, 1), put("transformer.h.0.ln_1.bias", {D}, 2);
  put("transformer.h.0.attn.c_attn.weight", {D, 3 * D}, 3), put("transformer.h.0.attn.c_attn.bias", {3 * D}, 4);
  put("transformer.h.0.attn.c_proj.weight", {D, D}, 5), put("transformer.h.0.attn.c_proj.bias", {D}, 6);
  put("transformer.h.0.ln_2.weight", {D}, 7), put("transformer.h.0.ln_2.bias", {D}, 8);
  put("transformer.h.0.mlp.c_fc.weight", {D, F}, 9), put("transformer.h.0.mlp.c_fc.bias", {F}, 10);
  put("transformer.h.0.mlp.c_proj.weight", {F, D}, 11), put("transformer.h.0.mlp.c_proj.bias", {D}, 12);
  put("transformer.ln_f.weight", {D}, 13), put("transformer.ln_f.bias", {D}, 14);
  put("transformer.h.0.attn.bias", {1, 1}, 0); // the causal mask buffer old checkpoints keep: ignored
  writeSafeTensors(inFolder(folder, "model.safetensors"), t);
  HfNotes notes;
  std::string checkpoint = inFolder(folder, "tgc.safetensors");
  ModelConfig m = unwrap(importHf(folder, checkpoint, "g", 0, notes));
  EXPECT_TRUE(m.tieEmbeddings && m.bias && m.norm == NormKind::LayerNorm && m.position == PositionKind::Learned);
  EXPECT_EQ(m.ffn, F);
  Checkpoint c = unwrap(readCheckpoint(checkpoint));
  EXPECT_EQ(c.tensors.size(), 16u); // wte, wpe, 12 of the layer, ln_f's two; the head is wte
  const Tensor &qkv = c.tensors.at("h0.attn.qkv.weight");
  ASSERT_EQ(qkv.type.shape, Shape({3 * D, D}));
  for (int64_t j = 0; j < 3 * D; ++j)
    for (int64_t i = 0; i < D; ++i)
      EXPECT_EQ(qkv.data[size_t(j * D + i)], 3 + float(100 * i + j)) << j << ", " << i;
  EXPECT_EQ(c.tensors.at("h0.mlp.fc2.weight").data[1], 11 + float(100 * 1 + 0)); // fc2 [D, F]: [0][1] is c_proj[1][0]
  EXPECT_EQ(c.tensors.at("h0.attn.qkv.bias").data, t.at("transformer.h.0.attn.c_attn.bias").second);
  EXPECT_EQ(c.tensors.at("wpe").data, t.at("transformer.wpe.weight").second);
  EXPECT_EQ(c.tensors.at("lnf.bias").data, t.at("transformer.ln_f.bias").second);
  llvm::sys::fs::remove_directories(folder);
}

TEST(HuggingFace, LlamasSeparateProductsStackIntoTgcsFusedOnesInF16AndBf16AndShards) {
  // q, k, v rows one after another into qkv (grouped-query: k and v of 1 KV head), gate and up
  // into fc1 ([gate | up]: silu(gate) * up); read from F16 and BF16 files, the layer in a shard
  // of its own (model.safetensors.index.json).
  const int64_t D = 4, F = 6, V = 8, Dh = 2;
  for (const char *dtype : {"F16", "BF16"}) {
    SCOPED_TRACE(dtype);
    std::string folder = tempFolder("llama");
    ASSERT_FALSE(bool(writeFileAtomically(
        inFolder(folder, "config.json"),
        fmt::format("{{\"model_type\": \"llama\", \"vocab_size\": {}, \"max_position_embeddings\": 16, "
                    "\"hidden_size\": {}, \"intermediate_size\": {}, \"num_attention_heads\": 2, "
                    "\"num_key_value_heads\": 1, \"num_hidden_layers\": 1, \"rms_norm_eps\": 1e-05, "
                    "\"rope_theta\": 500000.0, \"rope_scaling\": {{\"rope_type\": \"llama3\", \"factor\": 32.0, "
                    "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}, "
                    "\"tie_word_embeddings\": false}}",
                    V, D, F))));
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> outer, layer;
    auto put = [&](auto &to, const std::string &name, std::vector<int64_t> shape, float base) {
      to[name] = {shape, indexed(shape[0], shape.size() > 1 ? shape[1] : 1, base)};
    };
    put(outer, "model.embed_tokens.weight", {V, D}, 0), put(outer, "model.norm.weight", {D}, 1);
    put(outer, "lm_head.weight", {V, D}, 2);
    std::string l = "model.layers.0.";
    put(layer, l + "input_layernorm.weight", {D}, 3), put(layer, l + "post_attention_layernorm.weight", {D}, 4);
    put(layer, l + "self_attn.q_proj.weight", {D, D}, 5), put(layer, l + "self_attn.k_proj.weight", {Dh, D}, 6);
    put(layer, l + "self_attn.v_proj.weight", {Dh, D}, 7), put(layer, l + "self_attn.o_proj.weight", {D, D}, 8);
    put(layer, l + "mlp.gate_proj.weight", {F, D}, 9), put(layer, l + "mlp.up_proj.weight", {F, D}, 10);
    put(layer, l + "mlp.down_proj.weight", {D, F}, 11);
    writeSafeTensors(inFolder(folder, "model-00001-of-00002.safetensors"), outer, dtype);
    writeSafeTensors(inFolder(folder, "model-00002-of-00002.safetensors"), layer, dtype);
    std::string index = "{\"metadata\": {}, \"weight_map\": {";
    for (auto [part, file] : {std::pair{&outer, "model-00001-of-00002"}, std::pair{&layer, "model-00002-of-00002"}})
      for (const auto &[name, tensor] : *part)
        index += fmt::format("{}\"{}\": \"{}.safetensors\"", index.back() == '{' ? "" : ", ", name, file);
    ASSERT_FALSE(bool(writeFileAtomically(inFolder(folder, "model.safetensors.index.json"), index + "}}")));
    HfNotes notes;
    std::string checkpoint = inFolder(folder, "tgc.safetensors");
    ModelConfig m = unwrap(importHf(folder, checkpoint, "l", 0, notes));
    EXPECT_EQ(m.kvHeadCount(), 1);
    ASSERT_TRUE(m.ropeScaling);
    EXPECT_EQ(m.ropeScaling->factor, 32.0);
    EXPECT_EQ(m.ropeTheta, 500000.0);
    Checkpoint c = unwrap(readCheckpoint(checkpoint));
    const Tensor &qkv = c.tensors.at("h0.attn.qkv.weight"), &fc1 = c.tensors.at("h0.mlp.fc1.weight");
    ASSERT_EQ(qkv.type.shape, Shape({D + 2 * Dh, D}));
    EXPECT_EQ(qkv.data[0], 5.0f);                      // q_proj[0][0]
    EXPECT_EQ(qkv.data[size_t(D * D + 1)], 6.0f + 1);  // k_proj[0][1]
    EXPECT_EQ(qkv.data[size_t((D + Dh + 1) * D)], 7.0f + 100); // v_proj[1][0]
    EXPECT_EQ(fc1.data[size_t(F * D)], 10.0f);           // up_proj[0][0], after the gate's F rows
    EXPECT_EQ(c.tensors.at("lm_head.weight").data[size_t(D + 2)], 2.0f + 102);
    llvm::sys::fs::remove_directories(folder);
  }
}

TEST(HuggingFace, ExportThenImportGivesTheSameWeightsAndTokens) {
  for (const char *file : {"models/tiny.yaml", "models/llama-tiny.yaml"}) {
    SCOPED_TRACE(file);
    ModelConfig c = model(file);
    auto trainer = unwrap(Trainer::create(c));
    ASSERT_TRUE(trainer);
    unwrap(trainer->step());
    Checkpoint trained = unwrap(trainer->checkpoint());
    std::string folder = tempFolder("roundtrip"), back = inFolder(folder, "back.safetensors");
    ASSERT_FALSE(bool(exportHf(c, trained, inFolder(folder, "hf"))));
    HfNotes notes;
    ModelConfig m = unwrap(importHf(inFolder(folder, "hf"), back, c.name, 0, notes));
    EXPECT_EQ(architectureDifference(m, c), "");
    Checkpoint imported = unwrap(readCheckpoint(back));
    std::map<std::string, Tensor> weights = weightsOf(*trainer);
    size_t params = 0;
    for (const auto &[name, tensor] : imported.tensors) {
      ASSERT_TRUE(weights.count(name)) << name;
      EXPECT_EQ(tensor.data, weights.at(name).data) << name;
      ++params;
    }
    EXPECT_EQ(params, size_t(c.layers * (c.bias ? 12 : 6) + (c.bias ? 4 : 2) + !c.tieEmbeddings));
    // The converted model generates the trained one's tokens, and its logits.
    std::vector<int32_t> prompt{3, 1, 4, 1, 5};
    auto a = unwrap(Generator::create(c, weights, 1)), b = unwrap(Generator::create(m, imported.tensors, 1));
    ASSERT_TRUE(a && b);
    EXPECT_EQ(unwrap(a->generate({prompt}, 8, {})), unwrap(b->generate({prompt}, 8, {})));
    EXPECT_EQ(unwrap(a->promptLogits(prompt)).data, unwrap(b->promptLogits(prompt)).data);
    // Fine-tuning starts from them: the optimizer afresh, the weights these.
    auto tuned = unwrap(Trainer::create(m));
    ASSERT_TRUE(tuned);
    ASSERT_FALSE(bool(tuned->initFrom(imported, back)));
    EXPECT_EQ(tuned->stepsDone(), 0);
    EXPECT_EQ(weightsOf(*tuned).at("h0.attn.qkv.weight").data, weights.at("h0.attn.qkv.weight").data);
    llvm::sys::fs::remove_directories(folder);
  }
}

TEST(HuggingFace, ConfigsTgcCannotExpressAreRefusedByName) {
  struct Bad {
    const char *config, *message;
  } bads[] = {
      {R"({"model_type": "bert"})", "model_type 'bert': tgc converts gpt2 and llama models"},
      {R"({"model_type": "gpt2", "vocab_size": 8, "n_positions": 4, "n_embd": 4, "n_head": 2, "n_layer": 1,
          "activation_function": "gelu"})",
       "activation_function 'gelu': tgc's GELU is the tanh approximation (gelu_new)"},
      {R"({"model_type": "gpt2", "vocab_size": 8, "n_positions": 4, "n_head": 2, "n_layer": 1})", "'n_embd' is missing"},
      {R"({"model_type": "gpt2", "vocab_size": "8", "n_positions": 4, "n_embd": 4, "n_head": 2, "n_layer": 1})",
       "'vocab_size' must be an integer"},
      {R"({"model_type": "gpt2", "vocab_size": 8, "n_positions": 4, "n_embd": 4, "n_head": 2, "n_layer": 1,
          "scale_attn_by_inverse_layer_idx": true})",
       "scale_attn_by_inverse_layer_idx true"},
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
          "rope_scaling": {"rope_type": "linear", "factor": 2.0}})",
       "rope_scaling type 'linear': tgc has Llama 3's (llama3) alone"},
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "attention_bias": true})",
       "attention_bias true"},
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "hidden_act": "gelu"})",
       "hidden_act 'gelu'"},
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "head_dim": 4})",
       "head_dim 4 is not hidden_size / num_attention_heads (2)"},
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 3, "num_hidden_layers": 1})",
       "config.json (as a tgc model)"}, // the model file's own checks: heads (3) does not divide d_model (4)
      {R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8, "hidden_size": 4,
          "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "num_key_value_heads": 0})",
       "'num_key_value_heads' (0) must be at least 1"}, // (tgc's 0 would mean as many as the heads)
  };
  for (const Bad &bad : bads) {
    auto json = llvm::json::parse(bad.config);
    ASSERT_TRUE(bool(json)) << bad.config;
    HfNotes notes;
    std::string message = errorOf(modelFromHfConfig(*json->getAsObject(), "m/config.json", "m", 0, notes));
    EXPECT_NE(message.find("m/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find(bad.message), std::string::npos) << message;
  }
  // What it cannot carry over but need not refuse is said.
  auto dropout = llvm::json::parse(R"({"model_type": "gpt2", "vocab_size": 8, "n_positions": 4, "n_embd": 4,
                                      "n_head": 2, "n_layer": 1, "resid_pdrop": 0.1})");
  HfNotes notes;
  EXPECT_TRUE(bool(unwrap(modelFromHfConfig(*dropout->getAsObject(), "c", "m", 0, notes)).layers));
  ASSERT_EQ(notes.lines.size(), 1u);
  EXPECT_EQ(notes.lines[0], "resid_pdrop 0.1: tgc trains without dropout");
  // transformers 5 keeps RoPE's settings in rope_parameters: its theta and its scaling.
  auto v5 = llvm::json::parse(R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8,
      "hidden_size": 4, "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}})");
  ModelConfig m = unwrap(modelFromHfConfig(*v5->getAsObject(), "c", "m", 0, notes));
  EXPECT_EQ(m.ropeTheta, 500000.0);
  ASSERT_TRUE(m.ropeScaling);
  EXPECT_EQ(m.ropeScaling->originalLength, 64.0);
  auto plain = llvm::json::parse(R"({"model_type": "llama", "vocab_size": 8, "max_position_embeddings": 8,
      "hidden_size": 4, "intermediate_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
      "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})");
  m = unwrap(modelFromHfConfig(*plain->getAsObject(), "c", "m", 0, notes));
  EXPECT_EQ(m.ropeTheta, 1000000.0);
  EXPECT_FALSE(m.ropeScaling);
}

TEST(HuggingFace, MissingExtraAndMisshapenTensorsAreRefusedAndNothingIsWritten) {
  ModelConfig c = model("models/tiny.yaml");
  auto trainer = unwrap(Trainer::create(c));
  ASSERT_TRUE(trainer);
  std::string folder = tempFolder("bad"), hf = inFolder(folder, "hf"), out = inFolder(folder, "out.safetensors");
  ASSERT_FALSE(bool(exportHf(c, unwrap(trainer->checkpoint()), hf)));
  std::string weights = inFolder(hf, "model.safetensors");
  auto buffer = llvm::MemoryBuffer::getFile(weights);
  ASSERT_TRUE(bool(buffer));
  SafeTensorsHeader header = unwrap(parseSafeTensorsHeader((*buffer)->getBuffer(), weights));
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;
  for (const SafeTensorsEntry &e : header.entries)
    tensors[e.name] = {e.shape, safeTensorsFloats(e, (*buffer)->getBuffer().substr(header.dataOffset + e.begin,
                                                                                    e.end - e.begin))};
  auto expectRefused = [&](auto edit, const std::string &message) {
    auto changed = tensors;
    edit(changed);
    writeSafeTensors(weights, changed);
    HfNotes notes;
    std::string error = errorOf(importHf(hf, out, "m", 0, notes));
    EXPECT_NE(error.find(message), std::string::npos) << error;
    EXPECT_FALSE(llvm::sys::fs::exists(out)) << message;
  };
  expectRefused([](auto &t) { t.erase("transformer.h.1.mlp.c_fc.bias"); },
                "the checkpoint has no tensor 'transformer.h.1.mlp.c_fc.bias' (for tgc's h1.mlp.fc1.bias)");
  expectRefused([](auto &t) { t["transformer.h.2.ln_1.weight"] = {{64}, std::vector<float>(64, 1.0f)}; },
                "tensor 'transformer.h.2.ln_1.weight' is not part of a GPT-2 model as config.json describes it");
  expectRefused(
      [](auto &t) {
        auto &[shape, values] = t.at("transformer.h.0.attn.c_attn.weight");
        shape = {192, 64}; // tgc's [out, in], not Conv1D's [in, out]
      },
      "tensor 'transformer.h.0.attn.c_attn.weight' has shape [192, 64], where this config's model needs [64, 192]");
  llvm::sys::fs::remove_directories(folder);
}

TEST(HuggingFace, AStreamedCheckpointHasWriteCheckpointsBytes) {
  Checkpoint c;
  c.meta["model"] = "m";
  c.meta["step"] = 3;
  c.tensors["b"] = Tensor{TensorType(DType::F32, {2, 3}), {1, 2, 3, 4, 5, 6}, {}};
  c.tensors["a"] = Tensor{TensorType(DType::F32, {4}), {-1, 0.5f, 7, 8}, {}};
  std::string folder = tempFolder("stream"), path = inFolder(folder, "s.safetensors");
  std::vector<CheckpointEntry> entries{{"b", c.tensors["b"].type}, {"a", c.tensors["a"].type}};
  ASSERT_FALSE(bool(writeCheckpointStreamed(path, entries, c.meta, [&](const CheckpointEntry &e) {
    return llvm::Expected<std::vector<float>>(c.tensors.at(e.name).data);
  })));
  auto written = llvm::MemoryBuffer::getFile(path);
  ASSERT_TRUE(bool(written));
  EXPECT_EQ((*written)->getBuffer().str(), unwrap(formatCheckpoint(c, path)));
  // A producer's error leaves no file.
  std::string failed = inFolder(folder, "f.safetensors");
  EXPECT_TRUE(bool(writeCheckpointStreamed(failed, entries, c.meta, [](const CheckpointEntry &e) {
    return llvm::Expected<std::vector<float>>(stringError("no values for " + e.name));
  })));
  EXPECT_FALSE(llvm::sys::fs::exists(failed));
  llvm::sys::fs::remove_directories(folder);
}

TEST(HuggingFace, HalfPrecisionValuesWidenExactly) {
  EXPECT_EQ(halfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(halfToFloat(0xC000), -2.0f);
  EXPECT_EQ(halfToFloat(0x7BFF), 65504.0f);             // the largest
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24)); // the smallest subnormal
  EXPECT_EQ(halfToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(halfToFloat(0x3555), 1365.0f / 4096); // 0.333251953125
  EXPECT_TRUE(std::isinf(halfToFloat(0xFC00)) && halfToFloat(0xFC00) < 0);
  EXPECT_TRUE(std::isnan(halfToFloat(0x7E00)));
  EXPECT_EQ(std::signbit(halfToFloat(0x8000)), true);
}
