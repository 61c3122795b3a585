// Training on the CPU: the optimizer's arithmetic, bitwise determinism across runs and across
// save and resume, checkpoint errors, PyTorch parity, and the tiny model learning its task.
#include "ir/Parser.h"
#include "app/Checkpoint.h"
#include "app/Init.h"
#include "support/Random.h"
#include "app/Generate.h"
#include "backends/cpu/Interpreter.h"
#include "backends/cpu/Schedule.h"
#include "app/Trainer.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"

#include <cmath>
#include <fmt/format.h>
#include <fstream>

using namespace tgc;
using namespace tgc::test;

namespace {

ModelConfig parityConfig() {
  return unwrap(loadModelConfig(sourcePath("tests/reference/tiny-parity.yaml")));
}

std::vector<double> trainLosses(Trainer &t, int64_t steps) {
  std::vector<double> losses;
  for (int64_t i = 0; i < steps; ++i) {
    auto r = t.step();
    if (!r) {
      ADD_FAILURE() << llvm::toString(r.takeError());
      break;
    }
    losses.push_back(r->loss);
  }
  return losses;
}

std::string tempPath(const char *name) {
  llvm::SmallString<128> path;
  llvm::sys::fs::createUniquePath(std::string("tgc-test-%%%%%%-") + name, path, /*MakeAbsolute=*/true);
  return path.str().str();
}

TEST(Schedule, WarmupThenCosineToMinLr) {
  EXPECT_DOUBLE_EQ(learningRate(1.0, 0.1, 10, 110, 1), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(1.0, 0.1, 10, 110, 10), 1.0);
  EXPECT_NEAR(learningRate(1.0, 0.1, 10, 110, 60), 0.55, 1e-12); // halfway down the cosine
  EXPECT_DOUBLE_EQ(learningRate(1.0, 0.1, 10, 110, 110), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(1.0, 0.1, 10, 110, 500), 0.1);
  EXPECT_DOUBLE_EQ(learningRate(1.0, 0.1, 0, 0, 7), 1.0);
}

TEST(Optimizer, AdamWClipAndScheduleOpsFollowTorch) {
  auto g = unwrap(parseGraph(
      "graph @opt\n"
      "%p = param() {init=\"zeros\"} : f32[3]\n%m = state() {init=\"zeros\"} : f32[3]\n"
      "%v = state() {init=\"zeros\"} : f32[3]\n%grad = input() : f32[3]\n%step = input() : i32[]\n"
      "%ss = sum_squares(%grad) : f32[]\n%clip = clip_scale(%ss) {max_norm=1.0} : f32[]\n"
      "%lr = lr_schedule(%step) {lr=0.1, min_lr=0.01, steps=100, warmup=0} : f32[]\n"
      "%p2, %m2, %v2 = adamw(%p, %grad, %m, %v, %lr, %clip, %step) {beta1=0.9, beta2=0.95, "
      "eps=1e-08, weight_decay=0.5} : f32[3], f32[3], f32[3]\n"
      "assign(%p, %p2)\nassign(%m, %m2)\nassign(%v, %v2)\nreturn %clip, %lr\n",
      "opt.ir"));
  ASSERT_TRUE(g);
  Interpreter interp(*g);
  ASSERT_FALSE(bool(interp.bind("p", Tensor{TensorType(DType::F32, {3}), {1, -2, 3}, {}})));
  ASSERT_FALSE(bool(interp.bindAll({{"m", Tensor::zeros(TensorType(DType::F32, {3}))},
                                    {"v", Tensor::zeros(TensorType(DType::F32, {3}))}})));
  ASSERT_FALSE(bool(interp.bind("grad", Tensor{TensorType(DType::F32, {3}), {3, 0, -4}, {}})));
  ASSERT_FALSE(bool(interp.bind("step", Tensor{TensorType(DType::I32, {}), {}, {1}})));
  auto out = unwrap(interp.run());
  ASSERT_EQ(out.size(), 2u);
  double clip = 1.0 / (5.0 + 1e-6); // |grad| = 5
  EXPECT_FLOAT_EQ(out[0].data[0], float(clip));
  // No warmup: step 1 is already 1% into the cosine decay.
  EXPECT_FLOAT_EQ(out[1].data[0], float(learningRate(0.1, 0.01, 0, 100, 1)));
  float lr = out[1].data[0];
  // Step 1 of AdamW: m = 0.1 g, v = 0.05 g^2, bias-corrected m/sqrt(v) = sign(g).
  Tensor p = unwrap(interp.read("p")), m = unwrap(interp.read("m")), v = unwrap(interp.read("v"));
  float decay = 1 - lr * 0.5f;
  float want[3] = {1 * decay - lr, -2 * decay, 3 * decay + lr};
  for (int i = 0; i < 3; ++i) {
    float gi = float((i == 0 ? 3 : i == 1 ? 0 : -4) * clip);
    EXPECT_NEAR(p.data[i], want[i], 1e-6) << i;
    EXPECT_NEAR(m.data[i], 0.1f * gi, 1e-7);
    EXPECT_NEAR(v.data[i], 0.05f * gi * gi, 1e-7);
  }
}

// Parameters are drawn on all cores in chunks: the bits are those of one stream per tensor,
// drawn in order, whatever the chunking; zero leaves can be left out (the GPU's buffers start at
// zero).
TEST(Init, ParallelDrawsGiveTheSequentialStreamsBits) {
  Graph g("init");
  Builder b(g);
  int64_t n = (int64_t(1) << 21) + 12345; // a few chunks and a partial one
  b.param("w", TensorType(DType::F32, {n}), attrs({{"init", std::string("normal")}, {"std", 0.02}}));
  b.param("g", TensorType(DType::F32, {7}), attrs({{"init", std::string("ones")}}));
  b.state("m", TensorType(DType::F32, {5}), attrs({{"init", std::string("zeros")}}));
  ASSERT_FALSE(bool(b.takeError()));
  uint64_t seed = 99;
  auto all = initParams(g, seed);
  ASSERT_EQ(all.size(), 3u);
  Rng rng(mix64(seed) ^ hashName("w"));
  const std::vector<float> &w = all.at("w").data;
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(w[i], float(rng.normal() * 0.02)) << "element " << i;
  EXPECT_EQ(all.at("g").data, std::vector<float>(7, 1.0f));
  EXPECT_EQ(all.at("m").data, std::vector<float>(5, 0.0f));
  auto withoutZeros = initParams(g, seed, ZeroLeaves::Omit);
  EXPECT_EQ(withoutZeros.count("m"), 0u);
  EXPECT_EQ(withoutZeros.at("w").data, w);
}

TEST(Training, SameSeedSameLossesBitForBit) {
  auto a = unwrap(Trainer::create(parityConfig()));
  auto b = unwrap(Trainer::create(parityConfig()));
  ASSERT_TRUE(a && b);
  std::vector<double> la = trainLosses(*a, 5), lb = trainLosses(*b, 5);
  ASSERT_EQ(la.size(), 5u);
  EXPECT_EQ(la, lb);
  ModelConfig other = parityConfig();
  other.train.seed = 99;
  auto c = unwrap(Trainer::create(other));
  EXPECT_NE(trainLosses(*c, 1)[0], la[0]);
}

/// Three steps, a checkpoint, and three more from it in a fresh trainer (of another seed: the
/// checkpoint's wins) give the losses and the final state of six steps straight, bit for bit.
void expectResumeBitForBit(const ModelConfig &config) {
  auto straight = unwrap(Trainer::create(config));
  ASSERT_TRUE(straight);
  std::vector<double> all = trainLosses(*straight, 6);

  auto first = unwrap(Trainer::create(config));
  ASSERT_TRUE(first);
  trainLosses(*first, 3);
  std::string path = tempPath("resume.safetensors");
  ASSERT_FALSE(bool(writeCheckpoint(path, unwrap(first->checkpoint()))));
  ModelConfig differentSeed = config;
  differentSeed.train.seed = 5; // the checkpoint's seed wins: the stream continues
  auto second = unwrap(Trainer::create(differentSeed));
  ASSERT_TRUE(second);
  ASSERT_FALSE(bool(second->resume(unwrap(readCheckpoint(path)), path)));
  EXPECT_EQ(second->stepsDone(), 3);
  std::vector<double> rest = trainLosses(*second, 3);
  EXPECT_EQ(rest, std::vector<double>(all.begin() + 3, all.end()));
  Checkpoint a = unwrap(straight->checkpoint()), b = unwrap(second->checkpoint());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const auto &[name, t] : a.tensors)
    EXPECT_EQ(t.data, b.tensors.at(name).data) << name;
  llvm::sys::fs::remove(path);
}

TEST(Training, SaveAndResumeContinuesBitForBit) { expectResumeBitForBit(parityConfig()); }

TEST(Training, SaveAndResumeContinuesBitForBitWithFp8Attention) {
  // The FP8 attention's scaling state (q, k and v's, S's, dout's and dP's) is checkpointed with
  // the rest and resumes where it was.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  c.precision.recipe = Recipe::Fp8;
  c.precision.fp8Attention = true;
  auto probe = unwrap(Trainer::create(c));
  ASSERT_TRUE(probe);
  trainLosses(*probe, 1);
  Checkpoint saved = unwrap(probe->checkpoint());
  ASSERT_TRUE(saved.tensors.count("h0.attn.sdpa.fp8.s.amax_history"));
  ASSERT_TRUE(saved.tensors.count("h1.attn.sdpa.fp8.dp.scale"));
  // The probabilities' amax (1: the first query's one key), rolled to the history's end, and the
  // scale it gives.
  EXPECT_EQ(saved.tensors.at("h0.attn.sdpa.fp8.s.amax_history").data.back(), 1.0f);
  EXPECT_EQ(saved.tensors.at("h0.attn.sdpa.fp8.s.scale").data[0], 448.0f);
  expectResumeBitForBit(c);
}

TEST(Checkpoint, RoundTripsTensorsAndMetadata) {
  Checkpoint c;
  c.tensors["w"] = Tensor{TensorType(DType::F32, {2, 3}), {1, 2, 3, 4, 5, -6.5f}, {}};
  c.tensors["b"] = Tensor{TensorType(DType::F32, {1}), {0.25f}, {}};
  c.meta["step"] = 7;
  std::string path = tempPath("rt.safetensors");
  ASSERT_FALSE(bool(writeCheckpoint(path, c)));
  Checkpoint back = unwrap(readCheckpoint(path));
  EXPECT_EQ(back.tensors.at("w").data, c.tensors.at("w").data);
  EXPECT_EQ(back.tensors.at("w").type, c.tensors.at("w").type);
  EXPECT_EQ(back.tensors.at("b").data, c.tensors.at("b").data);
  EXPECT_EQ(back.meta.getInteger("step"), 7);
  // Only what the reader wants is copied out.
  Checkpoint some = unwrap(readCheckpoint(path, [](llvm::StringRef name) { return name == "b"; }));
  EXPECT_EQ(some.tensors.size(), 1u);
  EXPECT_EQ(some.tensors.at("b").data, c.tensors.at("b").data);
  llvm::sys::fs::remove(path);
}

TEST(Checkpoint, AChangedBitInATensorOrInTheMetadataIsRefusedByName) {
  // Each tensor's bytes and the metadata carry checksums: one bit flipped in a weight (the last
  // byte of the data: "w"'s, its tensors in name order), or the step edited, is an error that
  // names what changed; the metadata read back is what was written, without the checksums.
  Checkpoint c;
  c.tensors["b"] = Tensor{TensorType(DType::F32, {1}), {0.25f}, {}};
  c.tensors["w"] = Tensor{TensorType(DType::F32, {2, 3}), {1, 2, 3, 4, 5, -6.5f}, {}};
  c.meta["step"] = 7;
  std::string bytes = unwrap(formatCheckpoint(c, "c.st"));
  Checkpoint back = unwrap(parseCheckpoint(bytes, "c.st"));
  EXPECT_EQ(back.meta, c.meta);
  std::string flipped = bytes;
  flipped.back() ^= 0x01;
  EXPECT_EQ(errorOf(parseCheckpoint(flipped, "c.st")),
            "c.st: error: tensor 'w' does not match its checksum: its bytes were changed or damaged after the "
            "checkpoint was written");
  // A tensor the reader does not take is not read, nor checked.
  EXPECT_EQ(unwrap(parseCheckpoint(flipped, "c.st", [](llvm::StringRef n) { return n == "b"; })).tensors.size(), 1u);
  std::string edited = bytes;
  size_t at = edited.find("\\\"step\\\":7");
  ASSERT_NE(at, std::string::npos) << bytes.substr(0, 300);
  edited[at + 9] = '8'; // the 7
  EXPECT_EQ(errorOf(parseCheckpoint(edited, "c.st")),
            "c.st: error: the 'tgc' metadata does not match its checksum: it was changed or damaged after the "
            "checkpoint was written");
}

TEST(Checkpoint, ATensorAddedAfterItWasWrittenIsRefusedBeforeAnyIsRead) {
  Checkpoint c;
  c.tensors["w"] = Tensor{TensorType(DType::F32, {2}), {1, 2}, {}};
  c.meta["step"] = 1;
  std::string bytes = unwrap(formatCheckpoint(c, "c.st"));
  // The header rewritten with one more tensor after w's bytes (safetensors' layout kept).
  uint64_t headerSize = 0;
  for (int i = 0; i < 8; ++i)
    headerSize |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  auto parsed = llvm::json::parse(llvm::StringRef(bytes).substr(8, headerSize));
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  llvm::json::Value header = std::move(*parsed);
  header.getAsObject()->try_emplace("extra", llvm::json::Object{{"dtype", "F32"},
                                                               {"shape", llvm::json::Array{3}},
                                                               {"data_offsets", llvm::json::Array{8, 20}}});
  std::string text;
  llvm::raw_string_ostream(text) << header;
  std::string added(8, '\0');
  for (int i = 0; i < 8; ++i)
    added[i] = char((text.size() >> (8 * i)) & 0xff);
  added += text + bytes.substr(8 + headerSize) + std::string(12, '\0');
  EXPECT_EQ(errorOf(parseCheckpoint(added, "c.st")),
            "c.st: error: tensor 'extra' has no checksum: it is not one the checkpoint was written with");
}

TEST(Checkpoint, BadFilesAreClearErrors) {
  auto trainer = unwrap(Trainer::create(parityConfig()));
  ASSERT_TRUE(trainer);
  std::string good = tempPath("good.safetensors");
  ASSERT_FALSE(bool(writeCheckpoint(good, unwrap(trainer->checkpoint()))));
  auto bytes = llvm::MemoryBuffer::getFile(good);
  ASSERT_TRUE(bool(bytes));
  std::string text = (*bytes)->getBuffer().str();
  auto write = [](const std::string &path, const std::string &contents) {
    std::ofstream(path, std::ios::binary) << contents;
  };
  std::string bad = tempPath("bad.safetensors");
  struct Case {
    std::string contents, message;
  };
  for (const Case &c :
       {Case{text.substr(0, text.size() / 2), "truncated"}, Case{"", "shorter than the 8-byte header"},
        Case{std::string("\x10\0\0\0\0\0\0\0", 8) + "{not json at all", "malformed safetensors header"},
        Case{std::string(64, '\xff'), "not a safetensors checkpoint"}}) {
    write(bad, c.contents);
    std::string m = errorOf(readCheckpoint(bad));
    EXPECT_NE(m.find(bad + ": error: "), std::string::npos) << m;
    EXPECT_NE(m.find(c.message), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_NE(errorOf(readCheckpoint("/nonexistent/x.safetensors")).find("cannot read"), std::string::npos);

  // A checkpoint of another model does not fit.
  ModelConfig wider = parityConfig();
  wider.dModel = 128;
  auto other = unwrap(Trainer::create(wider));
  ASSERT_TRUE(other);
  std::string m = errorOf(other->resume(unwrap(readCheckpoint(good)), good));
  EXPECT_NE(m.find("checkpoint of model 'tiny-parity' does not fit model 'tiny-parity' (d_model 64 vs 128)"),
            std::string::npos) << m;
  llvm::sys::fs::remove(good);
  llvm::sys::fs::remove(bad);
}

/// A safetensors file of `header` (JSON, padded to 8 bytes unless `headerSize` says another
/// length) and `data` bytes.
std::string safetensors(std::string header, size_t dataBytes, int64_t headerSizeDelta = 0) {
  while ((8 + header.size()) % 8)
    header += ' ';
  uint64_t size = uint64_t(int64_t(header.size()) + headerSizeDelta);
  std::string file;
  for (int i = 0; i < 8; ++i)
    file += char((size >> (8 * i)) & 0xff);
  return file + header + std::string(dataBytes, '\0');
}

TEST(Checkpoint, TheSafetensorsLayoutIsCheckedStrictly) {
  const std::string meta = R"("__metadata__": {"format": "pt", "tgc": "{\"step\": 1}"})";
  auto tensor = [](const char *name, int n, int begin) {
    return fmt::format(R"("{}": {{"dtype": "F32", "shape": [{}], "data_offsets": [{}, {}]}})", name, n, begin,
                       begin + 4 * n);
  };
  std::string path = tempPath("layout.safetensors");
  auto check = [&](const std::string &contents, const char *message) {
    std::ofstream(path, std::ios::binary) << contents;
    std::string m = errorOf(readCheckpoint(path));
    EXPECT_NE(m.find(path + ": error: "), std::string::npos) << m;
    EXPECT_NE(m.find(message), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  };
  // Well formed: two tensors back to back.
  std::ofstream(path, std::ios::binary) << safetensors("{" + meta + ", " + tensor("a", 2, 0) + ", " +
                                                       tensor("b", 3, 8) + "}", 20);
  EXPECT_EQ(unwrap(readCheckpoint(path)).tensors.size(), 2u);
  check(safetensors("{" + meta + ", " + tensor("a", 2, 0) + ", " + tensor("b", 3, 4) + "}", 20),
        "tensor 'b': its data starts at byte 4 of the data, where 8 was expected (it overlaps");
  check(safetensors("{" + meta + ", " + tensor("a", 2, 0) + ", " + tensor("b", 3, 12) + "}", 24),
        "where 8 was expected (a gap before it)");
  check(safetensors("{" + meta + ", " + tensor("a", 2, 0) + "}", 12), "4 bytes after the last tensor's data");
  check(safetensors("{" + meta + ", " + tensor("a", 2, 0) + ", " + tensor("a", 2, 8) + "}", 16),
        "tensor 'a' appears twice in the header");
  // A flipped brace ('{' to 'z', one bit) is malformed JSON, whatever keys it moves.
  for (const char *flipped : {"a", "b"}) {
    std::string header = "{" + meta + ", " + tensor("a", 2, 0) + ", " + tensor("b", 3, 8) + "}";
    size_t brace = header.find('{', header.find(fmt::format("\"{}\":", flipped)));
    header[brace] = 'z';
    check(safetensors(header, 20), "malformed safetensors header");
  }
  // A header length a byte short still parses (its padding is spaces) but shifts the data.
  check(safetensors("{" + meta + ", " + tensor("a", 2, 0) + "}", 8, -1), "1 bytes after the last tensor's data");
  // Nesting a recursive parser would not survive: refused before parsing.
  check(safetensors("{\"x\": " + std::string(50000, '[') + "}", 0), "nested deeper than 64 levels");
  check(safetensors("{\"x\": \"" + std::string(50000, '[') + "\", " + meta + "}", 0),
        "tensor 'x': entry is not an object"); // brackets inside a string are text, not nesting
  llvm::sys::fs::remove(path);
}

TEST(Checkpoint, NonFiniteWeightsAreNamed) {
  Checkpoint c;
  c.tensors["w"] = Tensor{TensorType(DType::F32, {4}), {1, NAN, INFINITY, 2}, {}};
  c.tensors["b"] = Tensor{TensorType(DType::F32, {1}), {0.5f}, {}};
  EXPECT_EQ(errorOf(checkFinite(c, "x.st")),
            "x.st: error: 1 tensor holds NaN or Inf ('w': 2 of 4): the run that wrote it diverged; "
            "--allow-nonfinite reads it anyway");
  c.tensors["w"].data = {1, 2, 3, 4};
  EXPECT_FALSE(bool(checkFinite(c, "x.st")));
}

TEST(Checkpoint, AnEditedModelDescriptionIsRefused) {
  auto trainer = unwrap(Trainer::create(parityConfig()));
  ASSERT_TRUE(trainer);
  Checkpoint c = unwrap(trainer->checkpoint());
  EXPECT_EQ(unwrap(checkpointModel(c, "x.st")).heads, 4);
  // Two heads instead of four: the same tensor shapes, another model.
  std::string text = c.meta.getString("model")->str();
  size_t at = text.find("heads: 4");
  ASSERT_NE(at, std::string::npos);
  c.meta["model"] = text.replace(at, 8, "heads: 2");
  EXPECT_EQ(errorOf(checkpointModel(c, "x.st")),
            "x.st: error: the model description in the metadata was changed after the checkpoint was written (its "
            "SHA-256 differs)");
  // A checkpoint written before the digest existed is read as it is.
  c.meta.erase("model_sha256");
  EXPECT_EQ(unwrap(checkpointModel(c, "x.st")).heads, 2);
}

// tests/reference/parity.py trained the same model from the same initial weights on the same
// batches with torch.optim.AdamW; `golden` holds its per-step losses.
void expectPyTorchLosses(const std::string &model, const std::string &golden) {
  auto parsed = llvm::json::parse(golden);
  ASSERT_TRUE(bool(parsed)) << llvm::toString(parsed.takeError());
  const llvm::json::Array *losses = parsed->getAsObject()->getArray("losses");
  ASSERT_TRUE(losses);
  ASSERT_EQ(losses->size(), 20u);
  auto trainer =
      unwrap(Trainer::create(unwrap(loadModelConfig(sourcePath(fmt::format("tests/reference/{}.yaml", model))))));
  ASSERT_TRUE(trainer);
  std::vector<double> ours = trainLosses(*trainer, 20);
  ASSERT_EQ(ours.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    double want = *(*losses)[i].getAsNumber();
    EXPECT_NEAR(ours[i], want, 1e-4 * want) << "step " << i + 1;
  }
}

TEST(Training, MatchesPyTorchLosses) {
  expectPyTorchLosses("tiny-parity", readSource("tests/reference/tiny-parity-losses.json"));
}

TEST(Training, ResumeNamesAnotherRopeScaling) {
  // A checkpoint of Llama-3.2-1B's shape does not resume under another rope_factor, nor
  // without the scaling: the field is named.
  ModelConfig c = unwrap(loadModelConfig(sourcePath("models/llama-3.2-1b.yaml")));
  ModelConfig other = c;
  other.ropeScaling->factor = 8.0;
  EXPECT_NE(architectureDifference(c, other).find("rope_factor 32 vs 8"), std::string::npos)
      << architectureDifference(c, other);
  other.ropeScaling.reset();
  EXPECT_NE(architectureDifference(c, other).find("rope_scaling true vs false"), std::string::npos)
      << architectureDifference(c, other);
  EXPECT_EQ(architectureDifference(c, c), "");
}

TEST(Training, LlamaBlockMatchesPyTorchLosses) {
  // The Llama block (RMSNorm, SwiGLU, RoPE, two KV heads for four query heads) against PyTorch's
  // losses from the same initial weights (tests/reference/run-parity.sh wrote them).
  expectPyTorchLosses("llama-tiny-parity", readSource("tests/reference/llama-tiny-parity-losses.json"));
}

// The tiny model trained to the end (it learns the task): Fp8Training's
// TinyModelLearnsTheTaskInFp32AndInFp8WithinTenPercentOfIt, which trains it in fp32 and fp8.

// A step whose gradients are not finite changes nothing: clip_scale gives 0 and adamw keeps every
// weight and moment as it was (tests/filecheck/inputs/overflow.safetensors: the micro model
// with an LM head of 3e38, whose logits overflow); the step still counts.
TEST(Training, AStepWhoseGradientsAreNotFiniteChangesNoWeight) {
  ModelConfig config = unwrap(loadModelConfig(sourcePath("tests/models/micro.yaml")));
  config.train.steps = 3;
  auto trainer = unwrap(Trainer::create(config, ""));
  ASSERT_TRUE(trainer);
  std::string path = sourcePath("tests/filecheck/inputs/overflow.safetensors");
  ASSERT_FALSE(bool(trainer->resume(unwrap(readCheckpoint(path)), path)));
  Checkpoint before = unwrap(trainer->checkpoint());
  for (int i = 0; i < 2; ++i) {
    StepRecord record = unwrap(trainer->step());
    EXPECT_TRUE(record.notFinite());
    EXPECT_FALSE(std::isfinite(record.gradNorm));
  }
  Checkpoint after = unwrap(trainer->checkpoint());
  EXPECT_EQ(*after.meta.getInteger("step"), *before.meta.getInteger("step") + 2);
  ASSERT_EQ(before.tensors.size(), after.tensors.size());
  int weights = 0;
  for (const auto &[name, tensor] : before.tensors) {
    if (name == "step") // the step counter moves on
      continue;
    ASSERT_TRUE(after.tensors.count(name)) << name;
    EXPECT_EQ(tensor.data, after.tensors.at(name).data) << name;
    weights += name.find("adam") == std::string::npos;
  }
  EXPECT_GT(weights, 10);
  EXPECT_EQ(before.tensors.at("lm_head.weight").data[0], 3e38f);
}

} // namespace

TEST(CheckpointsAtOnce, CountTheSaveBeingWrittenAndTheOnesStillThere) {
  EXPECT_EQ(checkpointsAtOnce(0, 3, 0, 1), 1);   // one save, at the end
  EXPECT_EQ(checkpointsAtOnce(0, 3, 5, 1), 1);   // --save-every past the run: still one
  EXPECT_EQ(checkpointsAtOnce(0, 10, 5, 1), 2);  // steps 5 and 10: the second beside the first
  EXPECT_EQ(checkpointsAtOnce(0, 3, 1, 3), 3);   // three saves, each kept: two kept and one written
  EXPECT_EQ(checkpointsAtOnce(0, 100, 1, 3), 4); // three kept and one written
  EXPECT_EQ(checkpointsAtOnce(8, 10, 5, 4), 1);  // resumed at 8: only the last save is left
  EXPECT_EQ(checkpointsAtOnce(4, 10, 5, 4), 2);  // resumed at 4: steps 5 and 10
}
