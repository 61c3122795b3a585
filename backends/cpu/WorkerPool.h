// The CPU interpreter's worker threads, started once and kept: parallelFor (below) hands them
// the parts of a range of indices instead of starting threads at every call (which
// cost tens of microseconds a call, tens of calls a step). Each index is a piece of work whose
// result does not depend on the thread that runs it, so the pool changes no bit.
#pragma once

#include "llvm/ADT/STLFunctionalExtras.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tgc::cpu {

class WorkerPool {
public:
  /// The process's pool of `threads - 1` workers (the caller is the last thread), made at the
  /// first call.
  static WorkerPool &instance(unsigned threads);
  /// A pool of its own (the tests'), of `workers` threads.
  explicit WorkerPool(unsigned workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool &) = delete;
  WorkerPool &operator=(const WorkerPool &) = delete;

  /// Runs body(i) for every i in [0, n), split into `parts` contiguous parts (part t:
  /// [n * t / parts, n * (t + 1) / parts)), the caller taking part 0 and a worker each other
  /// part, and returns once all are done. Returns false, having run nothing, where the pool
  /// cannot take it: a call from one of its workers (a nested parallelFor), another thread's
  /// job running (the CPU ranks of a data-parallel run are threads), or more parts than
  /// threads; the caller then runs the range itself.
  bool run(int64_t n, unsigned parts, llvm::function_ref<void(int64_t)> body);

private:
  void work(unsigned worker);

  std::vector<std::thread> workers_;
  std::mutex busy_; // held by the thread whose job runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  // The job, under mutex_: a new generation wakes the workers below `parts_`.
  uint64_t generation_ = 0;
  int64_t n_ = 0;
  unsigned parts_ = 0, finished_ = 0;
  llvm::function_ref<void(int64_t)> body_;
  bool stop_ = false;
};

/// The interpreter's thread count, read once: TGC_THREADS, at most the machine's cores, as more
/// threads than cores only wait on each other.
unsigned interpreterThreads();

/// Runs body(i) for i in [0, n), on several threads when `work` is large enough to pay for
/// them (interpreterThreads of them at most): the pool's, or this thread alone where the pool
/// is taken (a nested call, another rank's job).
template <typename F> void parallelFor(int64_t n, int64_t work, F body) {
  const unsigned threads = interpreterThreads();
  unsigned count = work < (1 << 20) ? 1u : unsigned(std::min<int64_t>(threads, n));
  if (count > 1 && WorkerPool::instance(threads).run(n, count, body))
    return;
  for (int64_t i = 0; i < n; ++i)
    body(i);
}

/// An elementwise loop over n elements as parallelFor's work: chunkCount(n) chunks of
/// kElementChunk, body(chunk, begin, end) for each, `cost` an element's work in additions' worth
/// (a tanhf some 64).
inline constexpr int64_t kElementChunk = 4096;
inline int64_t chunkCount(int64_t n) { return (n + kElementChunk - 1) / kElementChunk; }
template <typename F> void parallelChunks(int64_t n, int64_t cost, F body) {
  parallelFor(chunkCount(n), n * cost,
              [&](int64_t c) { body(c, c * kElementChunk, std::min(n, (c + 1) * kElementChunk)); });
}

} // namespace tgc::cpu
