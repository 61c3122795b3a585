// NCCL's run-time loader (backends/cuda/libraries/Nccl.h): without a GPU, what it finds and what it says
// when it finds nothing. ncclGetVersion needs no GPU.
#include "backends/cuda/libraries/Nccl.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"

#include <algorithm>
#include <cstdlib>
#include <fmt/format.h>

#include <gtest/gtest.h>

using namespace tgc;

namespace {

TEST(Nccl, AbsentLibrariesAreOneErrorNamingEachPlaceTried) {
  std::string error = llvm::toString(
      loadNcclFrom({"/nonexistent/libnccl.so.2", "/lib/x86_64-linux-gnu/libm.so.6"}).takeError());
  EXPECT_NE(error.find("error: NCCL (libnccl.so.2) was not found"), std::string::npos) << error;
  EXPECT_NE(error.find("TGC_NCCL_LIBRARY"), std::string::npos) << error;
  EXPECT_NE(error.find("/nonexistent/libnccl.so.2 ("), std::string::npos) << error;
  // A library that opens but is not NCCL says which symbol it lacks (where libm is there).
  if (llvm::sys::fs::exists("/lib/x86_64-linux-gnu/libm.so.6")) {
    EXPECT_NE(error.find("libm.so.6 (not NCCL: no ncclGetVersion)"), std::string::npos) << error;
  }
  EXPECT_NE(llvm::toString(loadNcclFrom({}).takeError()).find("nothing"), std::string::npos);
}

TEST(Nccl, TheSearchStartsWithTheUsersPathAloneThenTheToolkitThenTheSystem) {
  setenv("TGC_NCCL_LIBRARY", "/given/libnccl.so.2", 1);
  EXPECT_EQ(ncclCandidates(), std::vector<std::string>{"/given/libnccl.so.2"});
  unsetenv("TGC_NCCL_LIBRARY");
  std::vector<std::string> candidates = ncclCandidates();
  auto at = [&](const std::string &path) { return std::find(candidates.begin(), candidates.end(), path); };
  ASSERT_NE(at("libnccl.so.2"), candidates.end());
  EXPECT_LT(at("/usr/local/cuda/lib64/libnccl.so.2"), at("libnccl.so.2"));
  for (auto it = at("libnccl.so.2") + 1; it != candidates.end(); ++it)
    EXPECT_NE(it->find("nvidia/nccl/lib/libnccl.so.2"), std::string::npos) << *it;
}

// Where the machine has NCCL (the development machines and CI: the CUDA toolkit's copy), it
// loads and reports NCCL 2; elsewhere the test says what was tried.
TEST(Nccl, LoadsWhereTheMachineHasIt) {
  auto api = loadNcclFrom(ncclCandidates());
  if (!api)
    GTEST_SKIP() << llvm::toString(api.takeError());
  EXPECT_GE(api->version, 21800) << api->path; // 2.18 or later: the ABI of the calls declared
  EXPECT_EQ(api->versionText(), fmt::format("{}.{}.{}", api->version / 10000, api->version / 100 % 100,
                                            api->version % 100));
  EXPECT_TRUE(api->allReduce && api->commInitRank && api->getUniqueId && api->errorString);
  EXPECT_STREQ(api->errorString(0), "no error");
}

} // namespace
