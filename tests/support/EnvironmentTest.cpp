// Settings read from environment variables (support/Environment.h): what each reader takes, and
// the one line it says on stderr for a value it does not take.
#include "support/Environment.h"

#include <cstdlib>
#include <gtest/gtest.h>

using namespace tgc;

namespace {

/// What `read(name)` returns with a variable of a name not read before set to `value` (unset
/// where null), and what it printed, the name shown as X (a line is said once a process: a fresh
/// name each time keeps the tests repeatable).
template <typename Read> auto withValue(const char *value, Read read, std::string &printed) {
  static int calls = 0;
  const std::string name = "TGC_ENVIRONMENT_TEST_" + std::to_string(calls++);
  if (value)
    ::setenv(name.c_str(), value, 1);
  testing::internal::CaptureStderr();
  auto result = read(name.c_str());
  printed = testing::internal::GetCapturedStderr();
  ::unsetenv(name.c_str());
  for (size_t at; (at = printed.find(name)) != std::string::npos;)
    printed.replace(at, name.size(), "X");
  return result;
}

TEST(Environment, ASwitchTakesZeroAndOneAndSaysAnythingElse) {
  std::string printed;
  auto on = [](const char *name) { return environmentSwitch(name, true); };
  auto off = [](const char *name) { return environmentSwitch(name, false); };
  EXPECT_TRUE(withValue(nullptr, on, printed));
  EXPECT_FALSE(withValue(nullptr, off, printed));
  EXPECT_TRUE(withValue("", on, printed));
  EXPECT_EQ(printed, "");
  EXPECT_FALSE(withValue("0", on, printed));
  EXPECT_TRUE(withValue("1", off, printed));
  EXPECT_EQ(printed, "");
  // "off" is not 0: the default stays, and the line says so.
  EXPECT_TRUE(withValue("off", on, printed));
  EXPECT_EQ(printed, "tgc: X='off' is not 0 or 1: using 1\n");
  EXPECT_FALSE(withValue("true", off, printed));
  EXPECT_EQ(printed, "tgc: X='true' is not 0 or 1: using 0\n");
}

TEST(Environment, AChoiceIsOneOfItsNamesOrNone) {
  std::string printed;
  auto read = [](const char *name) { return environmentChoice(name, {"graph", "marginal"}, "no profile"); };
  EXPECT_EQ(withValue(nullptr, read, printed), "");
  EXPECT_EQ(withValue("marginal", read, printed), "marginal");
  EXPECT_EQ(printed, "");
  EXPECT_EQ(withValue("Graph", read, printed), "");
  EXPECT_EQ(printed, "tgc: X='Graph' is not one of graph, marginal: no profile\n");
  // A control byte in the value is shown escaped, and a long value cut at 40 bytes.
  EXPECT_EQ(withValue("a\nb", read, printed), "");
  EXPECT_EQ(printed, "tgc: X='a\\x0ab' is not one of graph, marginal: no profile\n");
  EXPECT_EQ(withValue(std::string(100, 'x').c_str(), read, printed), "");
  EXPECT_EQ(printed, "tgc: X='" + std::string(40, 'x') + "' is not one of graph, marginal: no profile\n");
}

TEST(Environment, ACountIsAWholeNumberUpToItsBound) {
  std::string printed;
  auto read = [](const char *name) { return environmentCount(name, 8, 64, "the test's bound"); };
  EXPECT_EQ(withValue(nullptr, read, printed), 8);
  EXPECT_EQ(withValue("12", read, printed), 12);
  EXPECT_EQ(printed, "");
  EXPECT_EQ(withValue("100", read, printed), 64);
  EXPECT_EQ(printed, "tgc: X=100 is more than the test's bound (64): using 64\n");
  for (const char *bad : {"0", "-3", "4k", "", "99999999999999999999"}) {
    EXPECT_EQ(withValue(bad, read, printed), 8) << bad;
    EXPECT_EQ(printed, "tgc: X='" + std::string(bad) + "' is not a count (a whole number, 1 or more): using 8\n");
  }
}

TEST(Environment, AValueNotTakenIsSaidOnceAProcess) {
  // A decode program reads TGC_DECODE_PARTS at each of its attentions: one line, not one a read.
  static int runs = 0;
  const std::string name = "TGC_ENVIRONMENT_ONCE_" + std::to_string(runs++);
  ::setenv(name.c_str(), "many", 1);
  testing::internal::CaptureStderr();
  for (int read = 0; read < 3; ++read)
    EXPECT_EQ(environmentCount(name.c_str(), 2, 32, "the test's bound"), 2);
  std::string printed = testing::internal::GetCapturedStderr();
  ::unsetenv(name.c_str());
  EXPECT_EQ(printed, "tgc: " + name + "='many' is not a count (a whole number, 1 or more): using 2\n");
}

} // namespace
