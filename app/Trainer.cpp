#include "app/Trainer.h"

#include "app/Init.h"
#include "app/PrecisionProbe.h"
#include "app/Tokenizer.h"
#include "backends/Prologue.h"
#include "driver/RecomputeBudget.h"
#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Pass.h"

#include "llvm/Support/SHA256.h"

#include <chrono>
#include <cmath>
#include <fmt/format.h>

namespace tgc {

namespace {

/// The SHA-256 of `text`, in hex.
std::string sha256Hex(llvm::StringRef text) {
  std::string hex;
  for (uint8_t byte : llvm::SHA256::hash(llvm::arrayRefFromStringRef(text)))
    hex += fmt::format("{:02x}", byte);
  return hex;
}

} // namespace

llvm::Expected<std::unique_ptr<Trainer>> Trainer::create(const ModelConfig &config,
                                                         llvm::StringRef dataPath, Device device,
                                                         Communicator *communicator) {
  auto trainer = std::unique_ptr<Trainer>(new Trainer());
  trainer->config_ = config;
  trainer->dataPath_ = dataPath.str();
  if (communicator) {
    trainer->rank_ = communicator->rank();
    trainer->ranks_ = communicator->ranks();
    trainer->communicator_ = communicator;
  }
  if (config.train.batch % trainer->ranks_ != 0)
    return stringError(fmt::format("error: the batch of {} sequences does not split evenly over {} ranks",
                                   config.train.batch, trainer->ranks_));
  auto graph = buildGPT(config, config.train.batch / trainer->ranks_);
  if (!graph)
    return graph.takeError();
  Communicator *ranks = trainer->ranks_ > 1 ? communicator : nullptr;
  auto precision = choosePrecision(config, device, ranks); // auto's FP8 layers, measured
  if (!precision)
    return precision.takeError();
  ModelConfig chosen = config;
  chosen.precision = std::move(*precision);
  // recompute: auto: as few layers recomputed as fit the GPU's memory (or memory_budget).
  auto resolved = resolveRecompute(chosen, config.train.batch / trainer->ranks_, device, trainer->ranks_,
                                   &trainer->recomputeNote_);
  if (!resolved)
    return resolved.takeError();
  trainer->config_.train = resolved->train;
  auto program = compileForDevice(std::move(*graph), *resolved, device, /*training=*/true,
                                  trainer->ranks_ > 1 ? communicator : nullptr);
  if (!program)
    return program.takeError();
  trainer->config_.precision = program->precision;
  trainer->program_ = std::move(program->graph);
  // The outputs the trainer reads, found by name (models/ProgramInterface.h).
  for (auto [name, index] : {std::pair{program::kLoss, &trainer->outputs_.loss},
                             std::pair{program::kLearningRate, &trainer->outputs_.learningRate},
                             std::pair{program::kGradNormSquared, &trainer->outputs_.gradNormSquared}}) {
    auto at = program::outputIndex(*trainer->program_, name);
    if (!at)
      return stringError(fmt::format("error: the training program has no output %{}", name.str()));
    *index = *at;
  }
  trainer->executor_ = std::move(program->executor);
  // On the GPU every buffer starts at zero, so the leaves initialised to zeros (AdamW's moments,
  // most of the FP8 state: twice the parameters' bytes) are neither made nor copied.
  ZeroLeaves zeros = device == Device::Cuda ? ZeroLeaves::Omit : ZeroLeaves::Include;
  if (auto err = initLeaves(*trainer->executor_, *trainer->program_, config.train.seed, zeros))
    return std::move(err);
  if (auto err = trainer->executor_->runPrologue()) // the FP8 weights of the initial ones
    return std::move(err);
  if (dataPath.empty()) {
    trainer->data_ = std::make_unique<ArithmeticData>(config.vocab, config.seqLen, config.data,
                                                      config.train.seed);
  } else {
    auto data = TokenFileData::open(dataPath, config.vocab, config.seqLen, config.train.seed);
    if (!data)
      return data.takeError();
    trainer->data_ = std::move(*data);
  }
  return trainer;
}

llvm::Expected<StepRecord> Trainer::step() {
  auto batch = nextBatch();
  if (!batch)
    return batch.takeError();
  return step(std::move(*batch));
}

llvm::Expected<StepRecord> Trainer::step(Batch b) {
  const int64_t batch = config_.train.batch / ranks_, seqLen = config_.seqLen;
  if (ranks_ > 1) { // this rank's rows of the global batch
    auto rows = [&](std::vector<int32_t> &all) {
      all.erase(all.begin(), all.begin() + rank_ * batch * seqLen);
      all.resize(size_t(batch * seqLen));
    };
    rows(b.tokens);
    rows(b.targets);
  }
  TensorType ids(DType::I32, {batch, seqLen});
  StepRecord record;
  record.step = stepsDone_ + 1;
  if (auto err = executor_->bind(program::kTokens, Tensor{ids, {}, std::move(b.tokens)}))
    return std::move(err);
  if (auto err = executor_->bind(program::kTargets, Tensor{ids, {}, std::move(b.targets)}))
    return std::move(err);
  if (auto err = executor_->bind(program::kStep, Tensor{TensorType(DType::I32, {}), {}, {int32_t(record.step)}}))
    return std::move(err);
  auto start = std::chrono::steady_clock::now();
  auto outputs = executor_->run();
  if (!outputs)
    return outputs.takeError();
  record.stepMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  record.loss = (*outputs)[outputs_.loss].data[0];
  record.lr = (*outputs)[outputs_.learningRate].data[0];
  record.gradNorm = std::sqrt(double((*outputs)[outputs_.gradNormSquared].data[0]));
  // A loss or gradient that is not finite is the caller's to count (StepRecord::notFinite):
  // where the gradients are not, the program skipped the update itself.
  ++stepsDone_;
  return record;
}

llvm::Expected<Checkpoint> Trainer::checkpoint() const {
  Checkpoint checkpoint;
  for (const Op *op : program_->ops()) {
    // (The FP8 weights between steps are made again from the master weights on resume.)
    if ((op->kind() != OpKind::Param && op->kind() != OpKind::State) || isPrologueLeaf(*op))
      continue;
    auto tensor = executor_->read(op->result()->name());
    if (!tensor)
      return tensor.takeError();
    if (auto type = wholeOf(*op)) { // every rank's shard, in the whole's shape
      auto whole = gatherShards(*tensor, *type);
      if (!whole)
        return whole.takeError();
      tensor = std::move(*whole);
    }
    checkpoint.tensors.emplace(op->result()->name(), std::move(*tensor));
  }
  checkpoint.meta = checkpointMetadata(config_, stepsDone_, data_->describe(), dataPath_);
  if (!tokenizer_.empty())
    checkpoint.meta[kTokenizerMeta] = tokenizer_;
  if (std::string digest = data_->digest(); !digest.empty())
    checkpoint.meta.getObject("data")->try_emplace("xxh64", digest);
  return checkpoint;
}

llvm::json::Object checkpointMetadata(const ModelConfig &config, int64_t step, llvm::StringRef dataSource,
                                      llvm::StringRef dataPath) {
  std::string model = formatModelConfig(config);
  return llvm::json::Object{
      {"format", 1},
      {"model", model},
      {"model_sha256", sha256Hex(model)},
      {"step", step},
      {"seed", std::to_string(config.train.seed)}, // u64 does not fit JSON's int64
      {"data", llvm::json::Object{{"source", dataSource.str()}, {"path", dataPath.str()}, {"position", step}}},
      {"precision", recipeName(config.precision.recipe).str()}};
}

llvm::Expected<std::map<std::string, Tensor>> Trainer::fp8State() const {
  std::map<std::string, Tensor> state;
  for (const Op *op : program_->ops()) {
    const std::string &name = op->kind() == OpKind::State && !isPrologueLeaf(*op) ? op->result()->name() : "";
    if (name.find(program::kFp8Marker.str()) == std::string::npos)
      continue;
    auto tensor = executor_->read(name);
    if (!tensor)
      return tensor.takeError();
    state.emplace(name, std::move(*tensor));
  }
  return state;
}

llvm::Expected<ModelConfig> checkpointModel(const Checkpoint &checkpoint, llvm::StringRef path) {
  auto text = checkpoint.meta.getString("model");
  if (!text)
    return stringError(path.str() + ": error: the checkpoint metadata has no model description");
  // An edited description (another head count over tensors of the same shapes would run another
  // model without a word) no longer matches the digest written with it. (Older checkpoints
  // have none.)
  if (auto digest = checkpoint.meta.getString("model_sha256"); digest && *digest != sha256Hex(*text))
    return stringError(path.str() + ": error: the model description in the metadata was changed after the "
                                    "checkpoint was written (its SHA-256 differs)");
  return parseModelConfig(*text, (path + ":model").str());
}

std::string architectureDifference(const ModelConfig &a, const ModelConfig &b) {
  auto differ = [](const char *field, auto x, auto y) -> std::string {
    return x == y ? "" : fmt::format("{} {} vs {}", field, x, y);
  };
  for (const std::string &d :
       {differ("vocab", a.vocab, b.vocab), differ("seq_len", a.seqLen, b.seqLen),
        differ("d_model", a.dModel, b.dModel), differ("heads", a.heads, b.heads),
        differ("layers", a.layers, b.layers), differ("ffn", a.ffn, b.ffn),
        differ("norm", a.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm",
               b.norm == NormKind::LayerNorm ? "layernorm" : "rmsnorm"),
        differ("activation", a.activation == ActivationKind::Gelu ? "gelu" : "swiglu",
               b.activation == ActivationKind::Gelu ? "gelu" : "swiglu"),
        differ("bias", a.bias, b.bias), differ("tie_embeddings", a.tieEmbeddings, b.tieEmbeddings),
        differ("norm_eps", a.normEps, b.normEps),
        differ("position", a.position == PositionKind::Rope ? "rope" : "learned",
               b.position == PositionKind::Rope ? "rope" : "learned"),
        differ("rope_theta", a.ropeTheta, b.ropeTheta), differ("kv_heads", a.kvHeadCount(), b.kvHeadCount()),
        differ("rope_scaling", a.ropeScaling.has_value(), b.ropeScaling.has_value()),
        differ("rope_factor", a.ropeScaling ? a.ropeScaling->factor : 0.0, b.ropeScaling ? b.ropeScaling->factor : 0.0),
        differ("rope_low_freq_factor", a.ropeScaling ? a.ropeScaling->lowFreq : 0.0,
               b.ropeScaling ? b.ropeScaling->lowFreq : 0.0),
        differ("rope_high_freq_factor", a.ropeScaling ? a.ropeScaling->highFreq : 0.0,
               b.ropeScaling ? b.ropeScaling->highFreq : 0.0),
        differ("rope_original_length", a.ropeScaling ? a.ropeScaling->originalLength : 0.0,
               b.ropeScaling ? b.ropeScaling->originalLength : 0.0)})
    if (!d.empty())
      return d;
  return "";
}

llvm::Error Trainer::bindFrom(const Checkpoint &checkpoint, llvm::StringRef path, bool withState) {
  for (const Op *op : program_->ops()) {
    bool wanted = op->kind() == OpKind::Param || (withState && op->kind() == OpKind::State && !isPrologueLeaf(*op));
    if (!wanted)
      continue;
    const std::string &name = op->result()->name();
    auto it = checkpoint.tensors.find(name);
    if (it == checkpoint.tensors.end())
      return stringError(fmt::format("{}: error: the checkpoint has no tensor '{}'", path.str(), name));
    Tensor value = it->second;
    if (auto whole = wholeOf(*op)) { // this rank's shard of the whole
      if (value.type != *whole)
        return stringError(fmt::format("{}: error: the checkpoint's '{}' is {}, not {} as its parameter", path.str(),
                                       name, value.type.str(), whole->str()));
      value = shardOf(value, op->result()->type());
    }
    if (auto err = executor_->bind(name, std::move(value)))
      return stringError(fmt::format("{}: error: {}", path.str(), llvm::toString(std::move(err))));
  }
  return llvm::Error::success();
}

std::optional<TensorType> Trainer::wholeOf(const Op &op) const {
  if (op.kind() == OpKind::Param)
    return shardedParamWhole(op);
  llvm::StringRef name = op.result()->name();
  if (op.kind() != OpKind::State || !program::isOptimizerMoment(name))
    return std::nullopt;
  const Value *param = program_->lookup(program::parameterOfMoment(name));
  if (!param)
    return std::nullopt;
  if (auto whole = shardedParamWhole(*param->def()))
    return whole;
  return param->type() != op.result()->type() ? std::optional(param->type()) : std::nullopt;
}

Tensor Trainer::shardOf(const Tensor &whole, const TensorType &shard) const {
  Tensor part = Tensor::zeros(shard);
  int64_t n = shard.numElements(), first = rank_ * n, total = int64_t(whole.data.size());
  for (int64_t i = 0; i < n && first + i < total; ++i)
    part.data[i] = whole.data[first + i];
  return part;
}

llvm::Expected<Tensor> Trainer::gatherShards(const Tensor &shard, const TensorType &whole) const {
  if (!communicator_)
    return stringError("error: a sharded optimizer state needs the ranks' communicator to be saved");
  std::vector<float> all(shard.data.size() * size_t(ranks_));
  if (auto err = communicator_->allGatherHost(shard.data.data(), all.data(), all.size()))
    return std::move(err);
  Tensor t = Tensor::zeros(whole);
  std::copy(all.begin(), all.begin() + int64_t(t.data.size()), t.data.begin());
  return t;
}

llvm::Expected<ModelConfig> Trainer::fittingModel(const Checkpoint &checkpoint, llvm::StringRef path,
                                                  const char *message) const {
  auto saved = checkpointModel(checkpoint, path);
  if (!saved)
    return saved.takeError();
  std::string difference = architectureDifference(*saved, config_);
  if (difference.empty())
    return saved;
  return stringError(fmt::format("{}: error: {}", path.str(),
                                 fmt::format(fmt::runtime(message), saved->name, config_.name, difference)));
}

llvm::Error Trainer::initFrom(const Checkpoint &checkpoint, llvm::StringRef path) {
  if (auto saved = fittingModel(checkpoint, path, "the weights of model '{}' do not fit model '{}' ({})"); !saved)
    return saved.takeError();
  if (auto err = bindFrom(checkpoint, path, /*withState=*/false))
    return err;
  return executor_->runPrologue(); // the FP8 weights of these ones
}

llvm::Error Trainer::resume(const Checkpoint &checkpoint, llvm::StringRef path) {
  auto saved = fittingModel(checkpoint, path, "checkpoint of model '{}' does not fit model '{}' ({})");
  if (!saved)
    return saved.takeError();
  auto step = checkpoint.meta.getInteger("step");
  if (!step || *step < 0)
    return stringError(path.str() + ": error: the checkpoint metadata has no step");
  // What a resumed run would otherwise change without a word: refused, naming the checkpoint's.
  if (auto saved = checkpoint.meta.getString("precision"); saved && *saved != recipeName(config_.precision.recipe))
    return stringError(fmt::format("{}: error: the checkpoint was trained in {}, this run is {}: resume it with "
                                   "--precision {}",
                                   path.str(), saved->str(), recipeName(config_.precision.recipe).str(), saved->str()));
  // FP8 attention keeps scaling state of its own: the run resumes with it as it was trained.
  if (config_.precision.recipe == Recipe::Fp8 && saved->precision.fp8Attention != config_.precision.fp8Attention)
    return stringError(fmt::format("{}: error: the checkpoint was trained with {} attention, this run has {}: resume it "
                                   "{} --fp8-attention",
                                   path.str(), saved->precision.fp8Attention ? "FP8" : "BF16",
                                   config_.precision.fp8Attention ? "FP8" : "BF16",
                                   saved->precision.fp8Attention ? "with" : "without"));
  // The arithmetic task's steps: another range is another task (the data stream differs).
  if (dataPath_.empty() && (saved->data.minStep != config_.data.minStep || saved->data.maxStep != config_.data.maxStep))
    return stringError(fmt::format("{}: error: the checkpoint was trained on steps k in [{}, {}], this run's model file "
                                   "says [{}, {}]: resume it with the same data: section",
                                   path.str(), saved->data.minStep, saved->data.maxStep, config_.data.minStep,
                                   config_.data.maxStep));
  if (const llvm::json::Object *data = checkpoint.meta.getObject("data")) {
    auto savedPath = data->getString("path");
    auto savedSource = data->getString("source");
    bool savedFromFile = savedPath && !savedPath->empty();
    // A file's description is "PATH (N tokens, KIND)": the same file may be spelled otherwise.
    auto sizeAndKind = [](llvm::StringRef description) { return description.substr(description.rfind(" (")); };
    bool differs = savedFromFile != !dataPath_.empty() ||
                   (savedFromFile && savedSource && sizeAndKind(*savedSource) != sizeAndKind(data_->describe()));
    if (differs)
      return stringError(fmt::format("{}: error: the checkpoint was trained on {}, this run reads {}: resume it "
                                     "with the same data ({})",
                                     path.str(), savedSource ? savedSource->str() : "other data",
                                     data_->describe(), savedFromFile ? "--data " + savedPath->str() : "no --data"));
    // Same size, other bytes: another file (checkpoints written before the digest have none).
    auto savedDigest = data->getString("xxh64");
    if (savedFromFile && savedDigest && *savedDigest != data_->digest())
      return stringError(fmt::format("{}: error: the checkpoint was trained on a file of other bytes than {} (xxHash64 "
                                     "{}, this one {}): resume it with the same data (--data {})",
                                     path.str(), dataPath_, savedDigest->str(), data_->digest(), savedPath->str()));
  }
  if (auto err = bindFrom(checkpoint, path, /*withState=*/true))
    return err;
  // The data stream continues where it stopped: same seed, same position.
  auto seedText = checkpoint.meta.getString("seed");
  uint64_t seed = 0;
  if (!seedText || seedText->getAsInteger(10, seed))
    return stringError(path.str() + ": error: the checkpoint metadata has no seed");
  if (seed != config_.train.seed) {
    config_.train.seed = seed;
    if (dataPath_.empty()) {
      data_ = std::make_unique<ArithmeticData>(config_.vocab, config_.seqLen, config_.data, seed);
    } else {
      auto data = TokenFileData::open(dataPath_, config_.vocab, config_.seqLen, seed);
      if (!data)
        return data.takeError();
      data_ = std::move(*data);
    }
  }
  stepsDone_ = *step;
  // What the restored weights and scales make of the FP8 weights: the bytes the saved step's
  // end made.
  return executor_->runPrologue();
}

} // namespace tgc
