// The CPU interpreter's worker pool (WorkerPool.h): every index of a range run exactly once, in
// the parts parallelFor asks for; a nested call, and a call while another thread's job runs,
// refused (the caller then runs the range itself), never waiting on each other.
#include "backends/cpu/WorkerPool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

using namespace tgc::cpu;

namespace {

constexpr unsigned kThreads = 4;

TEST(WorkerPool, RunsEveryIndexOnceInThePartsAskedFor) {
  WorkerPool pool(kThreads - 1);
  for (unsigned parts : {2u, 3u, kThreads})
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000)}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      std::vector<std::atomic<std::thread::id>> by(static_cast<size_t>(n));
      ASSERT_TRUE(pool.run(n, parts, [&](int64_t i) {
        runs[size_t(i)]++;
        by[size_t(i)] = std::this_thread::get_id();
      })) << parts << " parts of " << n;
      for (int64_t i = 0; i < n; ++i)
        EXPECT_EQ(runs[size_t(i)].load(), 1) << i;
      // Part 0 is the caller's: [0, n / parts).
      for (int64_t i = 0; i < n / parts; ++i)
        EXPECT_EQ(by[size_t(i)].load(), std::this_thread::get_id()) << i;
    }
  EXPECT_FALSE(pool.run(10, kThreads + 1, [](int64_t) {})); // more parts than threads
  EXPECT_FALSE(pool.run(10, 1, [](int64_t) {}));            // nothing to share
}

TEST(WorkerPool, ANestedCallIsRefusedAndTheOuterOneFinishes) {
  WorkerPool pool(kThreads - 1);
  std::atomic<int> refused{0}, ran{0};
  ASSERT_TRUE(pool.run(8, 2, [&](int64_t) {
    ran++;
    if (!pool.run(4, 2, [](int64_t) {}))
      refused++;
  }));
  EXPECT_EQ(ran.load(), 8);
  EXPECT_EQ(refused.load(), 8); // from the caller's part (the pool is taken) and the worker's
}

TEST(WorkerPool, ThreadsCallingAtOnceEachGetTheirRangeRunOnce) {
  // The CPU ranks of a data-parallel run: four threads each running ranges through the pool,
  // or themselves where it is taken; every index of every call run once.
  WorkerPool pool(kThreads - 1);
  constexpr int kCallers = 4, kCalls = 200, kN = 64;
  std::vector<std::atomic<int>> runs(kCallers * kCalls * kN);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c)
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        auto body = [&, c, call](int64_t i) { runs[size_t((c * kCalls + call) * kN + i)]++; };
        if (!pool.run(kN, 2 + unsigned(call % 3), body))
          for (int64_t i = 0; i < kN; ++i)
            body(i);
      }
    });
  for (std::thread &t : callers)
    t.join();
  for (size_t i = 0; i < runs.size(); ++i)
    ASSERT_EQ(runs[i].load(), 1) << i;
}

} // namespace
