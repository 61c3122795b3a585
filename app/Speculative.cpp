// Speculative decoding: a draft model proposes a few tokens a sequence, the target model checks
// them all in one step over its KV cache (GPTOutput::Verify) and keeps the longest prefix it
// agrees with, then its own next token. Under greedy decoding that is the target's own choice
// at every position, so the tokens are plain greedy decoding's; each target step gives every
// sequence 1 to lookahead + 1 tokens.
//
// The caches stay right without copies. A verify step writes its rows at the sequence's
// positions; the rows of rejected tokens lie past the sequence's end, where the next step
// writes before it reads. The draft has run each token it proposed but the last; where all
// of a sequence's proposals were kept, a catch-up step runs that last one (the others'
// sequences run their last kept token again, rewriting a row with what it holds).
#include "app/Generate.h"
#include "app/InferencePrograms.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"

#include <chrono>

namespace tgc {

namespace {

/// The position of a sequence's last token: where the next step feeds it.
int32_t lastPosition(const std::vector<int32_t> &sequence) { return int32_t(sequence.size()) - 1; }

/// Binds `executor`'s %tokens and %positions [batch, 1] for a step over each active sequence's
/// token `back` places before its last, at that token's position (finished sequences and rows
/// past them: token 0 at position 0).
llvm::Error bindFeed(Executor &executor, int64_t batch, const std::vector<std::vector<int32_t>> &sequences,
                     const std::vector<bool> &active, int32_t back) {
  TensorType column(DType::I32, {batch, 1});
  std::vector<int32_t> feed(batch, 0), positions(batch, 0);
  for (size_t b = 0; b < sequences.size(); ++b)
    if (active[b]) {
      positions[b] = lastPosition(sequences[b]) - back;
      feed[b] = sequences[b][size_t(positions[b])];
    }
  if (auto err = executor.bind(program::kTokens, Tensor{column, {}, feed}))
    return err;
  return executor.bind(program::kPositions, Tensor{column, {}, positions});
}

/// Hands `names` of `from`'s leaves to `to` where they are not one memory.
llvm::Error copyCaches(const std::vector<std::string> &names, Executor &from, Executor &to) {
  for (const std::string &name : names)
    if (auto err = to.copyLeafFrom(name, from))
      return err;
  return llvm::Error::success();
}

} // namespace

llvm::Error Generator::setDraft(std::unique_ptr<Generator> draft, int64_t lookahead) {
  draft_.reset();
  verify_ = CompiledProgram{};
  if (!draft)
    return llvm::Error::success();
  if (draft->config_.vocab != config_.vocab)
    return makeError("the draft model's vocabulary ({} tokens) is not the model's ({})", draft->config_.vocab,
                     config_.vocab);
  if (draft->batch_ != batch_ || draft->device_.kind != device_.kind || draft->device_.ordinal != device_.ordinal)
    return makeError("the draft model must run the same batch ({}) on the same device", batch_);
  if (lookahead < 1 || lookahead + 1 > std::min(config_.seqLen, draft->config_.seqLen))
    return makeError("the lookahead must be between 1 and seq_len - 1 ({}), got {}",
                     std::min(config_.seqLen, draft->config_.seqLen) - 1, lookahead);
  auto verify =
      compileInference(config_, weights_, batch_, device_, GPTOutput::Verify, lookahead + 1, decode_.executor.get());
  if (!verify)
    return verify.takeError();
  // On one GPU the verify step reads and writes the decode step's caches; elsewhere they are
  // copied between the two when generation turns from one to the other.
  verifySharesCaches_ = true;
  for (const std::string &cache : caches_) {
    auto sharing = verify->executor->shareLeaf(cache, *decode_.executor);
    if (!sharing)
      return sharing.takeError();
    verifySharesCaches_ = verifySharesCaches_ && *sharing;
  }
  verify_ = std::move(*verify);
  draft_ = std::move(draft);
  lookahead_ = lookahead;
  return llvm::Error::success();
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::draftTokens(const std::vector<std::vector<int32_t>> &sequences, const std::vector<bool> &active) {
  Executor &executor = *draft_->decode_.executor;
  if (auto err = bindFeed(executor, batch_, sequences, active, 0))
    return std::move(err);
  // Each step's token is the next one's input on the device; the host reads them all at the end.
  TensorType column(DType::I32, {batch_, 1});
  std::vector<int32_t> positions(batch_, 0);
  std::vector<unsigned> tickets;
  for (int64_t j = 0; j < lookahead_; ++j) {
    if (j > 0) {
      if (auto err = executor.feed(program::kNext, program::kTokens))
        return std::move(err);
      for (size_t b = 0; b < sequences.size(); ++b)
        positions[b] = active[b] ? lastPosition(sequences[b]) + int32_t(j) : 0;
      if (auto err = executor.bind(program::kPositions, Tensor{column, {}, positions}))
        return std::move(err);
    }
    auto ticket = launchAndReadNext(executor);
    if (!ticket)
      return ticket.takeError();
    tickets.push_back(*ticket);
  }
  std::vector<std::vector<int32_t>> proposals;
  for (unsigned ticket : tickets) {
    auto tokens = executor.collect(ticket);
    if (!tokens)
      return tokens.takeError();
    proposals.push_back(std::move(tokens->ints));
  }
  return proposals;
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::verifyTokens(const std::vector<std::vector<int32_t>> &sequences, const std::vector<bool> &active,
                        const std::vector<std::vector<int32_t>> &proposals) {
  Executor &executor = *verify_.executor;
  const int64_t S = lookahead_ + 1;
  std::vector<int32_t> tokens(batch_ * S, 0), first(batch_, 0), positions(batch_ * S, 0);
  for (int64_t b = 0; b < batch_; ++b) {
    bool on = b < int64_t(sequences.size()) && active[b];
    if (on) {
      first[b] = lastPosition(sequences[b]);
      tokens[b * S] = sequences[b].back();
      for (int64_t j = 0; j < lookahead_; ++j)
        tokens[b * S + 1 + j] = proposals[j][b];
    }
    for (int64_t s = 0; s < S; ++s)
      positions[b * S + s] = first[b] + int32_t(s);
  }
  TensorType rows(DType::I32, {batch_, S});
  if (auto err = executor.bind(program::kTokens, Tensor{rows, {}, tokens}))
    return std::move(err);
  if (auto err = executor.bind(program::kPositions, Tensor{TensorType(DType::I32, {batch_, 1}), {}, first}))
    return std::move(err);
  if (auto err = executor.bind(program::kTokenPositions, Tensor{rows, {}, positions}))
    return std::move(err);
  if (auto err = executor.step())
    return std::move(err);
  auto next = nextTokens(executor, size_t(batch_ * S));
  if (!next)
    return next.takeError();
  std::vector<std::vector<int32_t>> successors(sequences.size());
  for (size_t b = 0; b < sequences.size(); ++b)
    successors[b].assign(next->begin() + int64_t(b) * S, next->begin() + int64_t(b + 1) * S);
  return successors;
}

llvm::Expected<std::vector<int32_t>> Generator::decodeOnce(const std::vector<std::vector<int32_t>> &sequences,
                                                           const std::vector<bool> &active) {
  Executor &executor = *decode_.executor;
  if (auto err = bindFeed(executor, batch_, sequences, active, 0))
    return std::move(err);
  if (auto err = executor.step())
    return std::move(err);
  return nextTokens(executor, sequences.size());
}

llvm::Error Generator::catchUpDraft(const std::vector<std::vector<int32_t>> &sequences,
                                    const std::vector<bool> &active) {
  // Each active sequence's token before its last, at its position: the last proposal where all
  // were kept, elsewhere a token the draft ran already (the same row written again).
  Executor &draft = *draft_->decode_.executor;
  if (auto err = bindFeed(draft, batch_, sequences, active, 1))
    return err;
  return draft.launch();
}

llvm::Expected<std::vector<std::vector<int32_t>>>
Generator::generateSpeculative(const std::vector<std::vector<int32_t>> &prompts, int64_t count,
                               const TokenCallback &onTokens) {
  auto start = std::chrono::steady_clock::now();
  const size_t n = prompts.size();
  size_t longest = 0;
  for (const auto &p : prompts)
    longest = std::max(longest, p.size());
  stats_ = GenerationStats{};
  stats_.sequences = int64_t(n);
  SamplingOptions greedy;
  auto first = runPrefill(prompts, int64_t(longest), greedy);
  if (!first)
    return first.takeError();
  if (auto drafted = draft_->runPrefill(prompts, int64_t(longest), greedy); !drafted) // the draft's caches
    return drafted.takeError();
  for (Executor *executor : {verify_.executor.get(), decode_.executor.get(), draft_->decode_.executor.get()})
    if (auto err = bindSampling(*executor, greedy))
      return std::move(err);
  if (!verifySharesCaches_)
    if (auto err = copyCaches(caches_, *decode_.executor, *verify_.executor))
      return std::move(err);
  std::vector<std::vector<int32_t>> sequences = prompts;
  std::vector<bool> active(n, true);
  // Each sequence's tokens as they come; onTokens hears token t once every sequence has it.
  int64_t told = 0;
  auto append = [&](size_t b, int32_t token) {
    if (!active[b])
      return;
    sequences[b].push_back(token);
    ++stats_.generatedTokens;
    active[b] = int64_t(sequences[b].size() - prompts[b].size()) < count;
  };
  auto tell = [&] {
    int64_t common = count;
    for (size_t b = 0; b < n; ++b)
      common = std::min(common, int64_t(sequences[b].size() - prompts[b].size()));
    for (; told < common; ++told) {
      std::vector<int32_t> tokens(n);
      for (size_t b = 0; b < n; ++b)
        tokens[b] = sequences[b][prompts[b].size() + told];
      if (onTokens)
        onTokens(told, tokens);
    }
  };
  for (size_t b = 0; b < n; ++b)
    append(b, (*first)[b]);
  tell();
  stats_.prefillSeconds = secondsSince(start);
  start = std::chrono::steady_clock::now();
  auto anyActive = [&] { return std::find(active.begin(), active.end(), true) != active.end(); };
  // Rounds while every active sequence's verify step fits the window.
  auto roundFits = [&] {
    for (size_t b = 0; b < n; ++b)
      if (active[b] && lastPosition(sequences[b]) + lookahead_ >= std::min(config_.seqLen, draft_->config_.seqLen))
        return false;
    return true;
  };
  while (anyActive() && roundFits()) {
    auto proposals = draftTokens(sequences, active);
    if (!proposals)
      return proposals.takeError();
    auto successors = verifyTokens(sequences, active, *proposals);
    if (!successors)
      return successors.takeError();
    ++stats_.verifySteps;
    bool catchUp = false; // some sequence kept all the proposals and goes on
    for (size_t b = 0; b < n; ++b) {
      if (!active[b])
        continue;
      int64_t kept = 0;
      while (kept < lookahead_ && (*proposals)[kept][b] == (*successors)[b][kept])
        ++kept;
      stats_.draftedTokens += lookahead_;
      stats_.acceptedTokens += kept;
      for (int64_t j = 0; j < kept; ++j)
        append(b, (*proposals)[j][b]);
      append(b, (*successors)[b][kept]);
      catchUp = catchUp || (kept == lookahead_ && active[b]);
    }
    tell();
    if (catchUp)
      if (auto err = catchUpDraft(sequences, active))
        return std::move(err);
  }
  // Near the window's end, plain decode steps of this model finish.
  if (anyActive() && !verifySharesCaches_)
    if (auto err = copyCaches(caches_, *verify_.executor, *decode_.executor))
      return std::move(err);
  while (anyActive()) {
    auto next = decodeOnce(sequences, active);
    if (!next)
      return next.takeError();
    ++stats_.decodeSteps;
    for (size_t b = 0; b < n; ++b)
      append(b, (*next)[b]);
    tell();
  }
  stats_.decodeSteps += stats_.verifySteps;
  stats_.decodeSeconds = secondsSince(start);
  std::vector<std::vector<int32_t>> generated(n);
  for (size_t b = 0; b < n; ++b)
    generated[b].assign(sequences[b].begin() + int64_t(prompts[b].size()), sequences[b].end());
  return generated;
}

} // namespace tgc
