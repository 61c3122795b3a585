#include "app/Generate.h"

#include "app/InferencePrograms.h"
#include "app/PrecisionProbe.h"
#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "support/Sampling.h"
#include "transforms/Pass.h"

#include "llvm/Support/MathExtras.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <fmt/format.h>

namespace tgc {

namespace {

/// The sample op's parameters of `options`.
SamplingParams samplingParams(const SamplingOptions &options) {
  SamplingParams params;
  params.temperature = float(options.temperature);
  params.topP = float(options.topP);
  params.topK = options.topK;
  params.seed = options.seed;
  return params;
}

llvm::Error checkSampling(const SamplingOptions &options, int64_t vocab) {
  if (!(options.temperature >= 0))
    return makeError("error: the temperature must be >= 0 (0 is greedy), got {}", options.temperature);
  if (!(options.topP > 0 && options.topP <= 1))
    return makeError("error: top-p must be in (0, 1], got {}", options.topP);
  if (options.topK < 0 || options.topK > vocab)
    return makeError("error: top-k must be in [0, {}] (0: every token), got {}", vocab, options.topK);
  return llvm::Error::success();
}

llvm::Error checkPrompts(const std::vector<std::vector<int32_t>> &prompts, int64_t batch, int64_t vocab) {
  if (prompts.empty() || int64_t(prompts.size()) > batch)
    return stringError(fmt::format("error: {} prompts for a batch of {}", prompts.size(), batch));
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      return stringError(fmt::format("error: prompt {} is empty", i + 1));
    for (int32_t id : prompts[i])
      if (id < 0 || id >= vocab)
        return stringError(fmt::format("error: prompt {} has token {}, outside the vocabulary [0, {})", i + 1,
                                       id, vocab));
  }
  return llvm::Error::success();
}

/// A generate call's prompts and sampling settings, checked before anything runs.
llvm::Error checkRequest(const std::vector<std::vector<int32_t>> &prompts, int64_t batch,
                         const SamplingOptions &options, int64_t vocab) {
  if (auto err = checkPrompts(prompts, batch, vocab))
    return err;
  return checkSampling(options, vocab);
}

} // namespace

llvm::Expected<std::vector<int32_t>> nextTokens(Executor &executor, size_t count) {
  auto next = executor.read(program::kNext);
  if (!next)
    return next.takeError();
  return std::vector<int32_t>(next->ints.begin(), next->ints.begin() + int64_t(count));
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

llvm::Error bindSampling(Executor &executor, const SamplingOptions &options) {
  Tensor sampling = Tensor::zeros(TensorType(DType::F32, {3})), seed = Tensor::zeros(TensorType(DType::I32, {2}));
  packSampling(samplingParams(options), sampling.data.data(), seed.ints.data());
  if (auto err = executor.bind(program::kSampling, sampling))
    return err;
  return executor.bind(program::kSampleSeed, seed);
}

llvm::Expected<unsigned> launchAndReadNext(Executor &executor) {
  if (auto err = executor.launch())
    return std::move(err);
  return executor.readLater(program::kNext);
}

llvm::Expected<CompiledProgram> compileInference(const ModelConfig &config,
                                                 const std::map<std::string, Tensor> &weights,
                                                 int64_t batch, Device device, GPTOutput output,
                                                 int64_t length, Executor *regionsOf) {
  auto graph = buildGPT(config, batch, output, length);
  if (!graph)
    return graph.takeError();
  auto program = compileForDevice(std::move(*graph), config, device, /*training=*/false, nullptr, regionsOf);
  if (!program)
    return program.takeError();
  for (const Op *op : program->graph->ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    llvm::StringRef name = op->result()->name();
    if (program->executor->borrowsLeaf(name))
      continue;
    auto it = weights.find(name.str());
    if (it == weights.end() && program::isKvCache(name)) {
      // The interpreter needs every leaf bound; the GPU's state starts zeroed (gpt2-124m's
      // caches at batch 32 are 2.4 GB of host zeros not made and copied).
      if (device == Device::Cpu)
        if (auto err = program->executor->bind(name, Tensor::zeros(op->result()->type())))
          return std::move(err);
      continue;
    }
    if (it == weights.end())
      return stringError(fmt::format("error: the checkpoint has no tensor '{}'", name.str()));
    if (auto err = program->executor->bind(it->first, it->second))
      return std::move(err);
  }
  if (!program::outputIndex(*program->graph, program::kLogits))
    return stringError("error: the generation program has no output %logits");
  return program;
}

llvm::Expected<std::unique_ptr<Generator>>
Generator::create(const ModelConfig &config, const std::map<std::string, Tensor> &weights,
                  int64_t batch, Device device) {
  auto generator = std::unique_ptr<Generator>(new Generator());
  generator->config_ = config;
  generator->batch_ = batch;
  generator->device_ = device;
  // Under fp8 every program runs in FP8 the layers the weights hold FP8 scaling state for (those
  // training ran in FP8), at any batch, with the scales training left: frozen, as delayed scaling
  // freezes them, also after current scaling, so that a sequence's tokens do not depend on the
  // others in its batch and the cached decode gives the tokens of the full window.
  PrecisionConfig &precision = generator->config_.precision;
  if (resolveRecipe(precision, device).recipe == Recipe::Fp8) {
    precision.fp8Layers = fp8LayersOf(weights);
    precision.fp8Scaling = Fp8Scaling::Delayed;
  }
  // What the other programs bind: the weights and every FP8 scaling state, not the optimizer's
  // moments.
  for (const auto &[name, tensor] : weights)
    if (!program::isOptimizerMoment(name))
      generator->weights_.emplace(name, tensor);
  auto decode = compileInference(generator->config_, weights, batch, device, GPTOutput::Decode);
  if (!decode)
    return decode.takeError();
  generator->decode_ = std::move(*decode);
  for (const Op *op : generator->decode_.graph->ops())
    if ((op->kind() == OpKind::Param || op->kind() == OpKind::State) && program::isKvCache(op->result()->name()))
      generator->caches_.push_back(op->result()->name());
  return generator;
}

int64_t Generator::prefillLength(int64_t length) const {
  int64_t positions = int64_t(llvm::alignTo(uint64_t(std::max<int64_t>(length, 1)), kPrefillGranule));
  return std::min(positions, config_.seqLen);
}

llvm::Expected<Generator::Prefill *> Generator::prefillProgram(int64_t positions) {
  auto it = prefill_.find(positions);
  if (it != prefill_.end()) {
    it->second.lastUse = ++prefillUses_;
    return &it->second;
  }
  if (prefill_.size() >= kKeptPrefills) { // the least recently used goes, with its memory
    auto oldest = prefill_.begin();
    for (auto i = prefill_.begin(); i != prefill_.end(); ++i)
      if (i->second.lastUse < oldest->second.lastUse)
        oldest = i;
    prefill_.erase(oldest);
  }
  auto program =
      compileInference(config_, weights_, batch_, device_, GPTOutput::Prefill, positions, decode_.executor.get());
  if (!program)
    return program.takeError();
  // On one GPU the prefill writes straight into the decode program's caches; elsewhere they
  // are copied after each prefill.
  Prefill prefill{std::move(*program), true, ++prefillUses_};
  for (const std::string &cache : caches_) {
    auto sharing = prefill.program.executor->shareLeaf(cache, *decode_.executor);
    if (!sharing)
      return sharing.takeError();
    prefill.sharesCaches = prefill.sharesCaches && *sharing;
  }
  return &prefill_.emplace(positions, std::move(prefill)).first->second;
}

llvm::Error Generator::ensureWindowed() {
  if (windowed_.executor)
    return llvm::Error::success();
  auto windowed = compileInference(config_, weights_, batch_, device_, GPTOutput::Logits, 0, decode_.executor.get());
  if (!windowed)
    return windowed.takeError();
  windowed_ = std::move(*windowed);
  return llvm::Error::success();
}

llvm::Expected<std::vector<int32_t>> Generator::runPrefill(const std::vector<std::vector<int32_t>> &prompts,
                                                           int64_t longest, const SamplingOptions &options) {
  const int64_t P = prefillLength(longest);
  auto prefill = prefillProgram(P);
  if (!prefill)
    return prefill.takeError();
  Executor &first = *(*prefill)->program.executor;
  stats_.prefillLength = P;
  std::vector<int32_t> tokens(batch_ * P, 0), lastRows(batch_);
  for (int64_t b = 0; b < batch_; ++b) {
    lastRows[b] = int32_t(b * P);
    if (b < int64_t(prompts.size())) {
      std::copy(prompts[b].begin(), prompts[b].end(), tokens.begin() + b * P);
      lastRows[b] += int32_t(prompts[b].size() - 1);
      stats_.promptTokens += int64_t(prompts[b].size());
    }
  }
  TensorType column(DType::I32, {batch_, 1});
  if (auto err = first.bind(program::kTokens, Tensor{TensorType(DType::I32, {batch_, P}), {}, tokens}))
    return std::move(err);
  if (auto err = first.bind(program::kLastRows, Tensor{column, {}, lastRows}))
    return std::move(err);
  if (auto err = bindSampling(first, options))
    return std::move(err);
  if (auto err = first.step())
    return std::move(err);
  auto next = nextTokens(first, prompts.size());
  if (!next)
    return next.takeError();
  if (!(*prefill)->sharesCaches)
    for (const std::string &cache : caches_)
      if (auto err = decode_.executor->copyLeafFrom(cache, first))
        return std::move(err);
  return next;
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::generate(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                    const SamplingOptions &options, const TokenCallback &onTokens) {
  const int64_t T = config_.seqLen, V = config_.vocab;
  if (auto err = checkRequest(prompts, batch_, options, V))
    return std::move(err);
  size_t longest = 0;
  for (const auto &p : prompts)
    longest = std::max(longest, p.size());
  // Positions fed: each prompt's, then every generated token but the last.
  if (count < 1 || int64_t(longest) + count - 1 > T || !decode_.executor)
    return generateWithoutCache(prompts, count, options, onTokens);
  if (draft_ && options.temperature == 0 && int64_t(longest) <= draft_->config_.seqLen)
    return generateSpeculative(prompts, count, onTokens);
  auto start = std::chrono::steady_clock::now();
  stats_ = GenerationStats{};
  stats_.sequences = int64_t(prompts.size());
  auto next = runPrefill(prompts, int64_t(longest), options);
  if (!next)
    return next.takeError();
  Executor &executor = *decode_.executor;
  if (auto err = bindSampling(executor, options))
    return std::move(err);
  TensorType column(DType::I32, {batch_, 1});
  std::vector<std::vector<int32_t>> generated(prompts.size());
  auto take = [&](int64_t step, const std::vector<int32_t> &picked) {
    for (size_t b = 0; b < prompts.size(); ++b)
      generated[b].push_back(picked[b]);
    stats_.generatedTokens += int64_t(prompts.size());
    if (onTokens)
      onTokens(step, picked);
  };
  take(0, *next);
  stats_.prefillSeconds = secondsSince(start);
  start = std::chrono::steady_clock::now();
  // Decode: each step feeds the last new token of each sequence at its own position.
  std::vector<int32_t> feed(batch_, 0), positions(batch_, 0);
  auto bindPositions = [&](int64_t step) {
    for (size_t b = 0; b < prompts.size(); ++b)
      positions[b] = int32_t(prompts[b].size()) + int32_t(step) - 1;
    return executor.bind(program::kPositions, Tensor{column, {}, positions});
  };
  for (size_t b = 0; b < prompts.size(); ++b)
    feed[b] = generated[b].back();
  if (auto err = executor.bind(program::kTokens, Tensor{column, {}, feed}))
    return std::move(err);
  // Each step's tokens (%next, chosen on the device) are the next step's input on the
  // device, and the host takes them one step late: it queues step s + 1 before it waits for
  // step s's copy, so the device goes from step to step without waiting for the host.
  std::optional<unsigned> waiting; // the ticket of the last step's tokens
  auto takeWaiting = [&](int64_t step) -> llvm::Error {
    auto picked = executor.collect(*waiting);
    if (!picked)
      return picked.takeError();
    take(step, std::vector<int32_t>(picked->ints.begin(), picked->ints.begin() + prompts.size()));
    return llvm::Error::success();
  };
  for (int64_t step = 1; step < count; ++step) {
    if (step > 1)
      if (auto err = executor.feed(program::kNext, program::kTokens))
        return std::move(err);
    if (auto err = bindPositions(step))
      return std::move(err);
    auto ticket = launchAndReadNext(executor);
    if (!ticket)
      return ticket.takeError();
    if (waiting)
      if (auto err = takeWaiting(step - 1))
        return std::move(err);
    waiting = *ticket;
    ++stats_.decodeSteps;
  }
  if (waiting)
    if (auto err = takeWaiting(count - 1))
      return std::move(err);
  stats_.decodeSeconds = secondsSince(start);
  return generated;
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::generateWithoutCache(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                                const SamplingOptions &options, const TokenCallback &onTokens) {
  const int64_t T = config_.seqLen, V = config_.vocab;
  if (auto err = checkRequest(prompts, batch_, options, V))
    return std::move(err);
  if (auto err = ensureWindowed())
    return std::move(err);
  auto start = std::chrono::steady_clock::now();
  stats_ = GenerationStats{};
  stats_.sequences = int64_t(prompts.size());
  stats_.cached = false;
  for (const auto &p : prompts)
    stats_.promptTokens += int64_t(p.size());
  const SamplingParams params = samplingParams(options);
  std::vector<std::vector<int32_t>> sequences = prompts, generated(prompts.size());
  for (int64_t n = 0; n < count; ++n) {
    std::vector<int32_t> tokens(batch_ * T, 0), windows(prompts.size());
    for (size_t b = 0; b < sequences.size(); ++b) { // each sequence's last T tokens
      int64_t length = int64_t(sequences[b].size());
      windows[b] = int32_t(std::min(length, T));
      std::copy(sequences[b].end() - windows[b], sequences[b].end(), tokens.begin() + b * T);
    }
    auto logits = runWindowed(tokens);
    if (!logits)
      return logits.takeError();
    std::vector<int32_t> picked(sequences.size());
    for (size_t b = 0; b < sequences.size(); ++b) {
      // The sample op's draw, on the host: the counter is the last token's position in the
      // sequence, as the cached decode's.
      picked[b] = sampleRow(&logits->data[(b * T + windows[b] - 1) * V], V, params, int64_t(b),
                            int64_t(sequences[b].size()) - 1);
      sequences[b].push_back(picked[b]);
      generated[b].push_back(picked[b]);
    }
    stats_.generatedTokens += int64_t(sequences.size());
    if (onTokens)
      onTokens(n, picked);
  }
  stats_.decodeSteps = count;
  stats_.decodeSeconds = secondsSince(start);
  return generated;
}

llvm::Expected<Tensor> Generator::runWindowed(const std::vector<int32_t> &tokens) {
  Executor &executor = *windowed_.executor;
  if (auto err = executor.bind(program::kTokens, Tensor{TensorType(DType::I32, {batch_, config_.seqLen}), {}, tokens}))
    return std::move(err);
  if (auto err = executor.step())
    return std::move(err);
  return executor.read(program::kLogits);
}

llvm::Expected<std::vector<int32_t>> Generator::windowOf(const std::vector<int32_t> &prompt) {
  const int64_t T = config_.seqLen;
  if (int64_t(prompt.size()) > T)
    return makeError("the prompt has {} tokens, more than the model's window of {}", prompt.size(), T);
  if (auto err = checkPrompts({prompt}, batch_, config_.vocab))
    return std::move(err);
  if (auto err = ensureWindowed())
    return std::move(err);
  std::vector<int32_t> tokens(batch_ * T, 0);
  std::copy(prompt.begin(), prompt.end(), tokens.begin());
  return tokens;
}

llvm::Expected<Tensor> Generator::promptLogits(const std::vector<int32_t> &prompt) {
  const int64_t V = config_.vocab, length = int64_t(prompt.size());
  auto tokens = windowOf(prompt);
  if (!tokens)
    return tokens.takeError();
  auto logits = runWindowed(*tokens);
  if (!logits)
    return logits.takeError();
  Tensor out = Tensor::zeros(TensorType(DType::F32, {length, V}));
  std::copy(logits->data.begin(), logits->data.begin() + length * V, out.data.begin());
  return out;
}

llvm::Expected<std::vector<std::pair<std::string, Tensor>>>
Generator::promptValues(const std::vector<int32_t> &prompt) {
  auto tokens = windowOf(prompt);
  if (!tokens)
    return tokens.takeError();
  Executor &executor = *windowed_.executor;
  executor.setTracingValues(true);
  auto logits = runWindowed(*tokens);
  executor.setTracingValues(false);
  if (!logits)
    return logits.takeError();
  return executor.tracedValues();
}

llvm::Error Generator::roundAs(Generator &device) {
  if (auto err = ensureWindowed())
    return err;
  if (auto err = device.ensureWindowed())
    return err;
  if (!windowed_.executor->setRoundedValues(device.windowed_.executor->roundedValues()))
    return makeError("error: {} does not round values as another device does", describe());
  return llvm::Error::success();
}

llvm::Expected<EvalResult> evaluateArithmetic(Generator &generator, const ModelConfig &config,
                                              int64_t sequences, int64_t promptLength,
                                              int64_t batch) {
  ArithmeticData data(config.vocab, config.seqLen, config.data, config.train.seed);
  auto pairs = data.evalPairs(sequences);
  int64_t count = config.seqLen - promptLength;
  EvalResult result;
  for (size_t first = 0; first < pairs.size(); first += batch) {
    std::vector<std::vector<int32_t>> prompts, truth;
    for (size_t i = first; i < std::min(pairs.size(), first + size_t(batch)); ++i) {
      std::vector<int32_t> seq = data.sequence(pairs[i].first, pairs[i].second, config.seqLen);
      prompts.emplace_back(seq.begin(), seq.begin() + promptLength);
      truth.emplace_back(seq.begin() + promptLength, seq.end());
    }
    auto out = generator.generate(prompts, count, {});
    if (!out)
      return out.takeError();
    for (size_t i = 0; i < prompts.size(); ++i) {
      int64_t right = 0;
      for (int64_t t = 0; t < count; ++t)
        right += (*out)[i][t] == truth[i][t];
      result.tokens += count;
      result.correctTokens += right;
      result.correctSequences += right == count;
      ++result.sequences;
    }
  }
  return result;
}

} // namespace tgc
