#include "backends/Communicator.h"
#include "backends/TcpGroup.h"
#include "support/Error.h"

#include <algorithm>
#include <condition_variable>
#include <fmt/format.h>
#include <mutex>
#include <vector>

namespace tgc {

/// What the ranks of a LocalGroup share: each call waits until every rank has arrived with its
/// buffers; the last to arrive does the collective for all of them, in rank order (so every run
/// gives the same bits), and writes each rank's result.
struct LocalGroup::Shared {
  enum class Kind { AllReduce, ReduceScatter, AllGather };
  /// One rank's side of a call.
  struct Call {
    const float *in = nullptr;
    float *out = nullptr;
    size_t count = 0;
    ReduceOp op = ReduceOp::Sum;
    Kind kind = Kind::AllReduce;
  };
  std::mutex mutex;
  std::condition_variable arrived;
  std::vector<Call> calls;
  int waiting = 0;
  uint64_t generation = 0; // calls completed
  bool aborted = false;
  std::string failure; // why the last call failed (mismatched calls)

  struct Rank : Communicator {
    Shared *shared = nullptr;
    int index = 0;
    int rank() const override { return index; }
    int ranks() const override { return int(shared->calls.size()); }
    llvm::Error allReduceHost(float *data, size_t count, ReduceOp op) override {
      return shared->collective(index, {data, data, count, op, Kind::AllReduce});
    }
    llvm::Error reduceScatterHost(const float *in, float *out, size_t count, ReduceOp op) override {
      return shared->collective(index, {in, out, count, op, Kind::ReduceScatter});
    }
    llvm::Error allGatherHost(const float *in, float *out, size_t count) override {
      return shared->collective(index, {in, out, count, ReduceOp::Sum, Kind::AllGather});
    }
  };
  std::vector<Rank> ranks;

  /// The last rank's work: every rank's result (all_reduce's in place, after all are read).
  void run() {
    const Call &first = calls[0];
    size_t n = calls.size(), part = first.count / n;
    std::vector<const float *> inputs;
    for (const Call &c : calls)
      inputs.push_back(c.in);
    auto reduced = [&](size_t i, ReduceOp op) { return reduceInRankOrder(inputs.data(), n, i, op); };
    if (first.kind == Kind::AllReduce) {
      std::vector<float> result(first.count);
      for (size_t i = 0; i < first.count; ++i)
        result[i] = reduced(i, first.op);
      for (Call &c : calls)
        std::copy(result.begin(), result.end(), c.out);
    } else if (first.kind == Kind::ReduceScatter) {
      for (size_t r = 0; r < n; ++r)
        for (size_t i = 0; i < part; ++i)
          calls[r].out[i] = reduced(r * part + i, first.op);
    } else {
      for (size_t r = 0; r < n; ++r)
        for (const Call &c : calls)
          std::copy(calls[r].in, calls[r].in + part, c.out + r * part);
    }
  }

  llvm::Error collective(int rank, Call call) {
    std::unique_lock<std::mutex> lock(mutex);
    if (aborted)
      return makeError("rank {}: the group was aborted", rank);
    calls[rank] = call;
    uint64_t mine = generation;
    if (++waiting == int(calls.size())) {
      failure.clear();
      for (size_t r = 1; r < calls.size(); ++r)
        if (calls[r].count != calls[0].count || calls[r].op != calls[0].op || calls[r].kind != calls[0].kind)
          failure = "the ranks called different collectives, or with different counts or reductions";
      if (failure.empty() && calls[0].kind != Kind::AllReduce && calls[0].count % calls.size())
        failure = fmt::format("{} floats do not split into {} equal parts", calls[0].count, calls.size());
      if (failure.empty())
        run();
      waiting = 0;
      ++generation;
      arrived.notify_all();
    } else {
      arrived.wait(lock, [&] { return generation != mine || aborted; });
      if (generation == mine)
        return makeError("rank {}: the group was aborted", rank);
    }
    if (!failure.empty())
      return makeError("rank {}: {}", rank, failure.c_str());
    return llvm::Error::success();
  }
};

LocalGroup::LocalGroup(int ranks) : shared_(std::make_unique<Shared>()) {
  shared_->calls.resize(ranks);
  shared_->ranks.resize(ranks);
  for (int r = 0; r < ranks; ++r) {
    shared_->ranks[r].shared = shared_.get();
    shared_->ranks[r].index = r;
  }
}

LocalGroup::~LocalGroup() = default;

Communicator &LocalGroup::rank(int r) { return shared_->ranks.at(r); }

void LocalGroup::abort() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->aborted = true;
  shared_->arrived.notify_all();
}

} // namespace tgc
