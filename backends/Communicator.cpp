#include "backends/Communicator.h"
#include "support/Error.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace tgc {

/// What the ranks of a LocalGroup share: each call waits until every rank has arrived with its
/// buffer; the last to arrive reduces them all in rank order and writes the result into each.
struct LocalGroup::Shared {
  std::mutex mutex;
  std::condition_variable arrived;
  std::vector<float *> buffers;
  std::vector<size_t> counts;
  std::vector<ReduceOp> ops;
  int waiting = 0;
  uint64_t generation = 0; // calls completed
  bool aborted = false;
  std::string failure; // why the last call failed (mismatched counts or ops)

  struct Rank : Communicator {
    Shared *shared = nullptr;
    int index = 0;
    int rank() const override { return index; }
    int ranks() const override { return int(shared->buffers.size()); }
    llvm::Error allReduceHost(float *data, size_t count, ReduceOp op) override {
      return shared->allReduce(index, data, count, op);
    }
  };
  std::vector<Rank> ranks;

  llvm::Error allReduce(int rank, float *data, size_t count, ReduceOp op) {
    std::unique_lock<std::mutex> lock(mutex);
    if (aborted)
      return makeError("rank {}: the group was aborted", rank);
    buffers[rank] = data;
    counts[rank] = count;
    ops[rank] = op;
    uint64_t mine = generation;
    if (++waiting == int(buffers.size())) {
      failure.clear();
      for (size_t r = 1; r < buffers.size(); ++r)
        if (counts[r] != counts[0] || ops[r] != ops[0])
          failure = "the ranks called all_reduce with different counts or reductions";
      if (failure.empty())
        for (size_t i = 0; i < count; ++i) {
          double acc = buffers[0][i];
          for (size_t r = 1; r < buffers.size(); ++r)
            acc = op == ReduceOp::Max ? std::max(acc, double(buffers[r][i])) : acc + double(buffers[r][i]);
          if (op == ReduceOp::Avg)
            acc /= double(buffers.size());
          for (float *b : buffers)
            b[i] = float(acc);
        }
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
  shared_->buffers.resize(ranks);
  shared_->counts.resize(ranks);
  shared_->ops.resize(ranks);
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
