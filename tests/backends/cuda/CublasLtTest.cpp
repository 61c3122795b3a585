// cuBLASLt's run-time loader (backends/cuda/libraries/CublasLt.h): what it finds without a GPU and what it
// says when it finds nothing. cublasLtGetVersion needs no GPU.
#ifdef TGC_HAVE_CUDA
#include "backends/cuda/libraries/CublasLt.h"
#include "backends/cuda/Target.h"

#include "llvm/Support/FileSystem.h"

#include <algorithm>
#include <cstdlib>
#include <dlfcn.h>
#include <fmt/format.h>

#include <gtest/gtest.h>

using namespace tgc;

namespace {

const std::string kSoname = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);

TEST(CublasLt, AbsentLibrariesAreOneErrorNamingEachPlaceTried) {
  std::string error = llvm::toString(
      loadCublasLtFrom({"/nonexistent/" + kSoname, "/lib/x86_64-linux-gnu/libm.so.6"}).takeError());
  EXPECT_NE(error.find(fmt::format("error: cuBLASLt ({}) was not found", kSoname)), std::string::npos) << error;
  EXPECT_NE(error.find("TGC_CUBLASLT_LIBRARY"), std::string::npos) << error;
  EXPECT_NE(error.find("/nonexistent/" + kSoname + " ("), std::string::npos) << error;
  // A library that opens but is not cuBLASLt says which symbol it lacks (where libm is there).
  if (llvm::sys::fs::exists("/lib/x86_64-linux-gnu/libm.so.6")) {
    EXPECT_NE(error.find("libm.so.6 (not cuBLASLt: no cublasLtCreate)"), std::string::npos) << error;
  }
}

TEST(CublasLt, TheSearchStartsWithTheUsersPathAloneThenTheToolkitThenTheSystem) {
  setenv("TGC_CUBLASLT_LIBRARY", "/given/libcublasLt.so", 1);
  EXPECT_EQ(cublasLtCandidates(), std::vector<std::string>{"/given/libcublasLt.so"});
  unsetenv("TGC_CUBLASLT_LIBRARY");
  std::vector<std::string> candidates = cublasLtCandidates();
  auto at = [&](const std::string &path) { return std::find(candidates.begin(), candidates.end(), path); };
  ASSERT_NE(at(kSoname), candidates.end());
  EXPECT_LT(at("/usr/local/cuda/lib64/" + kSoname), at(kSoname));
  for (auto it = at(kSoname) + 1; it != candidates.end(); ++it)
    EXPECT_NE(it->find("nvidia/cublas/lib/" + kSoname), std::string::npos) << *it;
}

// Detecting the target (what every tgc command does first) opens nothing where there is no GPU
// driver: cuBLASLt's start-up is paid by GPU programs alone.
TEST(CublasLt, DetectingATargetWithoutADriverDoesNotOpenIt) {
  TargetInfo target = detectTarget();
  if (target.driverVersion != 0) // a GPU program earlier in this process may have opened it, rightly
    GTEST_SKIP() << "this machine has a CUDA driver: an earlier test's GPU program may have opened cuBLASLt";
  EXPECT_EQ(dlopen(kSoname.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr)
      << "cuBLASLt was opened before a GPU program needed it";
}

// Where the machine has it (the development machines and CI: the CUDA toolkit's copy), it loads
// with the major version tgc was built with and every entry point bound.
TEST(CublasLt, LoadsWhereTheMachineHasIt) {
  auto api = loadCublasLtFrom(cublasLtCandidates());
  if (!api)
    GTEST_SKIP() << llvm::toString(api.takeError());
  EXPECT_EQ(api->version / 10000, size_t(CUBLAS_VER_MAJOR)) << api->path;
  EXPECT_TRUE(api->create && api->matmul && api->matmulAlgoGetHeuristic && api->matrixLayoutSetAttribute);
  EXPECT_EQ(api->getVersion(), api->version);
}

} // namespace
#endif
