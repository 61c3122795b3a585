#include "backends/cpu/WorkerPool.h"

#include "support/Environment.h"

namespace tgc::cpu {

namespace {
thread_local bool inWorker = false; // this thread is one of the pool's
} // namespace

unsigned interpreterThreads() {
  static const unsigned threads = [] {
    int64_t cores = std::max(1u, std::thread::hardware_concurrency());
    return unsigned(environmentCount("TGC_THREADS", cores, cores, "this machine's cores"));
  }();
  return threads;
}

WorkerPool &WorkerPool::instance(unsigned threads) {
  static WorkerPool pool(threads > 1 ? threads - 1 : 0);
  return pool;
}

WorkerPool::WorkerPool(unsigned workers) {
  for (unsigned w = 0; w < workers; ++w)
    workers_.emplace_back([this, w] { work(w); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

bool WorkerPool::run(int64_t n, unsigned parts, llvm::function_ref<void(int64_t)> body) {
  if (inWorker || parts < 2 || parts > workers_.size() + 1)
    return false;
  std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
  if (!busy.owns_lock())
    return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n_ = n;
    parts_ = parts;
    finished_ = 0;
    body_ = body;
    ++generation_;
  }
  wake_.notify_all();
  for (int64_t i = 0; i < n / parts; ++i) // part 0
    body(i);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return finished_ == parts - 1; });
  return true;
}

void WorkerPool::work(unsigned worker) {
  inWorker = true;
  uint64_t seen = 0;
  for (;;) {
    int64_t n;
    unsigned parts;
    llvm::function_ref<void(int64_t)> body;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && worker + 1 < parts_); });
      if (stop_)
        return;
      seen = generation_;
      n = n_, parts = parts_, body = body_;
    }
    unsigned part = worker + 1;
    for (int64_t i = n * part / parts; i < n * (part + 1) / parts; ++i)
      body(i);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++finished_;
    }
    done_.notify_one();
  }
}

} // namespace tgc::cpu
