// Helpers shared by the test suites.
#pragma once

#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

namespace tgc::test {

/// A file of the source tree; TGC_SOURCE_DIR in the environment overrides the build's path (for
/// test binaries carried to another machine).
inline std::string sourcePath(const std::string &relative) {
  const char *root = std::getenv("TGC_SOURCE_DIR");
  return std::string(root && *root ? root : TGC_SOURCE_DIR) + "/" + relative;
}

inline std::string readSource(const std::string &relative) {
  auto buffer = llvm::MemoryBuffer::getFile(sourcePath(relative));
  if (!buffer)
    return "";
  return (*buffer)->getBuffer().str();
}

/// The value of an Expected, failing the test (with the message) when it holds an error.
template <typename T> T unwrap(llvm::Expected<T> value) {
  if (!value) {
    ADD_FAILURE() << llvm::toString(value.takeError());
    return T();
  }
  return std::move(*value);
}

/// The message of an Expected that must fail ("" and a test failure when it succeeded).
template <typename T> std::string errorOf(llvm::Expected<T> value) {
  if (value) {
    ADD_FAILURE() << "expected an error";
    return "";
  }
  return llvm::toString(value.takeError());
}

inline std::string errorOf(llvm::Error err) {
  if (!err) {
    ADD_FAILURE() << "expected an error";
    return "";
  }
  return llvm::toString(std::move(err));
}

/// A new seed each run for tests on fresh random inputs, printed so that a failure can be
/// replayed with TGC_TEST_SEED=N.
inline uint64_t freshSeed() {
  if (const char *env = std::getenv("TGC_TEST_SEED"))
    return std::strtoull(env, nullptr, 10);
  uint64_t seed = std::random_device{}();
  std::cout << "[ seed ] TGC_TEST_SEED=" << seed << "\n";
  return seed;
}

/// The largest |a[i] - b[i]| over the largest |b[i]|: an error relative to b's scale.
inline double relativeError(const std::vector<float> &a, const std::vector<float> &b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    err = std::max(err, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return err / scale;
}

} // namespace tgc::test
