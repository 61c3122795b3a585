// The CPU reference's collectives (LocalGroup: ranks as threads of one process): all-reduce,
// reduce-scatter and all-gather on fresh random values against the sums computed here, at 2, 3
// and 4 ranks; reduce-scatter then all-gather gives all-reduce's bits (what a sharded optimizer
// relies on); mismatched calls and counts that do not split are refused on every rank.
#include "backends/Communicator.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <gtest/gtest.h>

#include <thread>

using namespace tgc;
using namespace tgc::test;

namespace {

/// `body(rank, communicator)` on each of `ranks` threads; their errors, by rank.
template <typename Body> std::vector<std::string> onRanks(int ranks, Body body) {
  LocalGroup group(ranks);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      if (llvm::Error err = body(r, group.rank(r))) {
        errors[size_t(r)] = llvm::toString(std::move(err));
        group.abort();
      }
    });
  for (std::thread &t : threads)
    t.join();
  return errors;
}

TEST(LocalGroup, ReduceScatterAndAllGatherMakeAllReduce) {
  Rng rng(freshSeed());
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(ranks) + " ranks");
    const size_t count = size_t(ranks) * 37;
    std::vector<std::vector<float>> in(static_cast<size_t>(ranks), std::vector<float>(count));
    for (auto &v : in)
      for (float &x : v)
        x = float(rng.normal());
    std::vector<std::vector<float>> reduced(static_cast<size_t>(ranks)), shards(reduced), gathered(reduced);
    auto errors = onRanks(ranks, [&](int r, Communicator &c) -> llvm::Error {
      size_t me = size_t(r);
      reduced[me] = in[me];
      if (auto err = c.allReduceHost(reduced[me].data(), count, ReduceOp::Avg))
        return err;
      shards[me].resize(count / size_t(ranks));
      if (auto err = c.reduceScatterHost(in[me].data(), shards[me].data(), count, ReduceOp::Avg))
        return err;
      gathered[me].resize(count);
      return c.allGatherHost(shards[me].data(), gathered[me].data(), count);
    });
    for (const std::string &e : errors)
      ASSERT_EQ(e, "");
    for (size_t i = 0; i < count; ++i) { // the mean in rank order, in double, as the group sums
      double sum = 0;
      for (const auto &v : in)
        sum += v[i];
      ASSERT_EQ(reduced[0][i], float(sum / ranks)) << i;
    }
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(reduced[size_t(r)], reduced[0]);
      EXPECT_EQ(gathered[size_t(r)], reduced[0]); // the shards of every rank, in rank order
      std::vector<float> part(reduced[0].begin() + r * 37, reduced[0].begin() + (r + 1) * 37);
      EXPECT_EQ(shards[size_t(r)], part);
    }
  }
}

TEST(LocalGroup, RefusesCallsThatDoNotMatchOnEveryRank) {
  std::vector<float> a(6, 1.0f), b(3);
  auto split = onRanks(4, [&](int r, Communicator &c) -> llvm::Error {
    std::vector<float> out(2);
    return c.reduceScatterHost(a.data(), out.data(), 6, ReduceOp::Sum);
  });
  for (const std::string &e : split)
    EXPECT_NE(e.find("6 floats do not split into 4 equal parts"), std::string::npos) << e;
  auto mixed = onRanks(2, [&](int r, Communicator &c) -> llvm::Error {
    std::vector<float> out(6), mine = a;
    return r == 0 ? c.allReduceHost(mine.data(), 6, ReduceOp::Sum) : c.allGatherHost(b.data(), out.data(), 6);
  });
  for (const std::string &e : mixed)
    EXPECT_NE(e.find("the ranks called different collectives"), std::string::npos) << e;
}

} // namespace
