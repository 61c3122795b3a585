// The GEMM algorithm choice (GemmTuning.h): the fastest candidate, but the heuristic's first
// unless another is at least 5% faster; kept in its file and taken from there, unchanged, by
// later tuners.
#include "backends/cuda/runtime/GemmTuning.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>
#include <vector>

using namespace tgc;

namespace {

std::string temporaryFile() {
  llvm::SmallString<128> path;
  EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("tgc-gemm-tuning", path));
  llvm::sys::path::append(path, "sub", "gemm-algorithms.txt"); // a folder save() creates
  return path.str().str();
}

llvm::Expected<int> chooseWith(GemmTuner &tuner, const std::string &key, std::vector<float> ms, int &timed) {
  return tuner.choose(key, int(ms.size()), [&](int i) -> llvm::Expected<float> {
    ++timed;
    return ms[size_t(i)];
  });
}

} // namespace

TEST(GemmTuning, TheFastestCandidateWhenClearlyFasterKeptForTheNextRun) {
  std::string file = temporaryFile();
  GemmTuner first(file);
  ASSERT_TRUE(first.enabled());
  int timed = 0;
  EXPECT_EQ(*chooseWith(first, "fast third", {2.0f, 1.9f, 1.5f, 1.7f}, timed), 2);
  EXPECT_EQ(timed, 4);
  // 4% faster is noise: the heuristic's first stays.
  EXPECT_EQ(*chooseWith(first, "close", {1.0f, 0.96f, 1.2f}, timed), 0);
  // Asked again in this run: no timing.
  timed = 0;
  EXPECT_EQ(*chooseWith(first, "fast third", {0.1f, 9.0f, 9.0f, 9.0f}, timed), 2);
  EXPECT_EQ(timed, 0);
  first.save();
  // A later run reads the file (and the process's choices) instead of timing.
  GemmTuner second(file);
  EXPECT_EQ(*chooseWith(second, "fast third", {0.1f, 9.0f, 9.0f, 9.0f}, timed), 2);
  EXPECT_EQ(*chooseWith(second, "close", {9.0f, 0.1f, 0.1f}, timed), 0);
  EXPECT_EQ(timed, 0);
  // One candidate: nothing to time.
  EXPECT_EQ(*chooseWith(second, "single", {5.0f}, timed), 0);
  EXPECT_EQ(timed, 0);
  // A timing error reaches the caller.
  auto failed = second.choose("broken", 2, [](int) -> llvm::Expected<float> {
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "no GPU");
  });
  EXPECT_FALSE(bool(failed));
  llvm::consumeError(failed.takeError());
}

TEST(GemmTuning, AKeptChoiceBeyondTheCandidatesIsTimedAgain) {
  std::string file = temporaryFile();
  {
    GemmTuner tuner(file);
    int timed = 0;
    EXPECT_EQ(*chooseWith(tuner, "shrinks", {3.0f, 3.0f, 3.0f, 1.0f}, timed), 3);
    tuner.save();
  }
  GemmTuner later(file);
  int timed = 0;
  // (another library version may offer fewer candidates under the same key)
  EXPECT_EQ(*chooseWith(later, "shrinks", {1.0f, 2.0f}, timed), 0);
  EXPECT_EQ(timed, 2);
}

TEST(GemmTuning, OffKeepsTheHeuristicsFirst) {
  ::setenv("TGC_GEMM_AUTOTUNE", "0", 1);
  GemmTuner tuner(temporaryFile());
  ::unsetenv("TGC_GEMM_AUTOTUNE");
  EXPECT_FALSE(tuner.enabled());
  int timed = 0;
  EXPECT_EQ(*chooseWith(tuner, "off", {9.0f, 1.0f}, timed), 0);
  EXPECT_EQ(timed, 0);
}
