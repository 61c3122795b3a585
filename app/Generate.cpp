#include "app/Generate.h"

#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "support/Random.h"
#include "transforms/Pass.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <numeric>

namespace tgc {

namespace {

/// The next token from one row of logits.
int32_t pick(const float *logits, int64_t vocab, const SamplingOptions &options, Rng &rng) {
  if (options.temperature <= 0)
    return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = options.topK > 0 ? std::min(options.topK, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  double max = logits[order[0]], total = 0;
  std::vector<double> weights(keep);
  for (int64_t i = 0; i < keep; ++i)
    total += weights[i] = std::exp((logits[order[i]] - max) / options.temperature);
  double u = rng.uniform() * total;
  for (int64_t i = 0; i < keep; ++i)
    if ((u -= weights[i]) < 0)
      return order[i];
  return order[keep - 1];
}

/// Compiles `output`'s program of `config` for `batch` sequences and binds the weights (and
/// FP8 scaling state) from `weights`; KV caches start at zero.
llvm::Expected<CompiledProgram> compileInference(const ModelConfig &config,
                                                 const std::map<std::string, Tensor> &weights,
                                                 int64_t batch, Device device, GPTOutput output) {
  auto graph = buildGPT(config, batch, output);
  if (!graph)
    return graph.takeError();
  auto program = compileForDevice(std::move(*graph), config, device, /*training=*/false);
  if (!program)
    return program.takeError();
  for (const Op *op : program->graph->ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    llvm::StringRef name = op->result()->name();
    auto it = weights.find(name.str());
    if (it == weights.end() && program::isKvCache(name)) {
      if (auto err = program->executor->bind(name, Tensor::zeros(op->result()->type())))
        return std::move(err);
      continue;
    }
    if (it == weights.end())
      return stringError(fmt::format("error: the checkpoint has no tensor '{}'", name.str()));
    if (auto err = program->executor->bind(it->first, it->second))
      return std::move(err);
  }
  return program;
}

llvm::Error checkPrompts(const std::vector<std::vector<int32_t>> &prompts, int64_t batch, int64_t vocab) {
  if (prompts.empty() || int64_t(prompts.size()) > batch)
    return stringError(fmt::format("error: {} prompts for a batch of {}", prompts.size(), batch));
  for (const auto &p : prompts) {
    if (p.empty() || p.size() != prompts[0].size())
      return stringError("error: prompts must be non-empty and of one length");
    for (int32_t id : p)
      if (id < 0 || id >= vocab)
        return stringError(fmt::format("error: prompt token {} is outside the vocabulary [0, {})", id, vocab));
  }
  return llvm::Error::success();
}
} // namespace

namespace {
/// Where a generation program's logits are among its outputs.
llvm::Expected<size_t> logitsIndex(const Graph &graph) {
  if (auto at = program::outputIndex(graph, program::kLogits))
    return *at;
  return stringError("error: the generation program has no output %logits");
}
} // namespace

llvm::Expected<std::unique_ptr<Generator>>
Generator::create(const ModelConfig &config, const std::map<std::string, Tensor> &weights,
                  int64_t batch, Device device) {
  auto generator = std::unique_ptr<Generator>(new Generator());
  generator->config_ = config;
  generator->batch_ = batch;
  generator->device_ = device;
  auto decode = compileInference(config, weights, batch, device, GPTOutput::Decode);
  if (!decode)
    return decode.takeError();
  generator->decode_ = std::move(*decode);
  auto logits = logitsIndex(*generator->decode_.graph);
  if (!logits)
    return logits.takeError();
  generator->decodeLogits_ = *logits;
  // What the full program would bind, should a sequence outgrow the cache: the decode program's
  // weights and scaling state (not a checkpoint's optimizer moments).
  for (const Op *op : generator->decode_.graph->ops())
    if (op->kind() == OpKind::Param || op->kind() == OpKind::State)
      if (auto it = weights.find(op->result()->name()); it != weights.end())
        generator->weights_.insert(*it);
  return generator;
}

llvm::Error Generator::ensureWindowed() {
  if (windowed_.executor)
    return llvm::Error::success();
  auto windowed = compileInference(config_, weights_, batch_, device_, GPTOutput::Logits);
  if (!windowed)
    return windowed.takeError();
  auto logits = logitsIndex(*windowed->graph);
  if (!logits)
    return logits.takeError();
  windowed_ = std::move(*windowed);
  windowedLogits_ = *logits;
  return llvm::Error::success();
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::generate(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                    const SamplingOptions &options) {
  const int64_t T = config_.seqLen, V = config_.vocab;
  if (auto err = checkPrompts(prompts, batch_, V))
    return std::move(err);
  int64_t promptLength = int64_t(prompts[0].size());
  // Positions fed: the prompt's, then every generated token but the last.
  if (count < 1 || promptLength + count - 1 > T)
    return generateWithoutCache(prompts, count, options);
  Rng rng(mix64(options.seed));
  Executor &executor = *decode_.executor;
  std::vector<int32_t> feed(batch_, 0);
  for (size_t b = 0; b < prompts.size(); ++b)
    feed[b] = prompts[b][0];
  std::vector<std::vector<int32_t>> generated(prompts.size());
  for (int64_t pos = 0; pos < promptLength + count - 1; ++pos) {
    TensorType column(DType::I32, {batch_, 1});
    if (auto err = executor.bind(program::kTokens, Tensor{column, {}, feed}))
      return std::move(err);
    if (auto err = executor.bind(program::kPositions, Tensor{column, {}, std::vector<int32_t>(batch_, int32_t(pos))}))
      return std::move(err);
    if (auto err = executor.bind(program::kPosition, Tensor{TensorType(DType::I32, {}), {}, {int32_t(pos)}}))
      return std::move(err);
    auto outputs = executor.run();
    if (!outputs)
      return outputs.takeError();
    const std::vector<float> &logits = (*outputs)[decodeLogits_].data; // [batch, 1, V]
    for (size_t b = 0; b < prompts.size(); ++b) {
      if (pos + 1 < promptLength) {
        feed[b] = prompts[b][pos + 1];
        continue;
      }
      feed[b] = pick(&logits[b * V], V, options, rng);
      generated[b].push_back(feed[b]);
    }
  }
  return generated;
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::generateWithoutCache(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                                const SamplingOptions &options) {
  const int64_t T = config_.seqLen, V = config_.vocab;
  if (auto err = checkPrompts(prompts, batch_, V))
    return std::move(err);
  if (auto err = ensureWindowed())
    return std::move(err);
  Executor &executor = *windowed_.executor;
  Rng rng(mix64(options.seed));
  std::vector<std::vector<int32_t>> sequences = prompts, generated(prompts.size());
  for (int64_t n = 0; n < count; ++n) {
    int64_t length = int64_t(sequences[0].size());
    int64_t window = std::min(length, T), start = length - window;
    std::vector<int32_t> tokens(batch_ * T, 0);
    for (size_t b = 0; b < sequences.size(); ++b)
      std::copy(sequences[b].begin() + start, sequences[b].end(), tokens.begin() + b * T);
    if (auto err = executor.bind(program::kTokens, Tensor{TensorType(DType::I32, {batch_, T}), {}, tokens}))
      return std::move(err);
    auto outputs = executor.run();
    if (!outputs)
      return outputs.takeError();
    const std::vector<float> &logits = (*outputs)[windowedLogits_].data;
    for (size_t b = 0; b < sequences.size(); ++b) {
      int32_t next = pick(&logits[(b * T + window - 1) * V], V, options, rng);
      sequences[b].push_back(next);
      generated[b].push_back(next);
    }
  }
  return generated;
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
