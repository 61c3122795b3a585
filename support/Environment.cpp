#include "support/Environment.h"

#include "llvm/ADT/StringRef.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>
#include <mutex>
#include <set>

namespace tgc {

namespace {
/// At most 40 bytes of a value, control bytes escaped: the value is the user's, not tgc's.
std::string shownValue(const char *env) {
  std::string shown;
  for (char c : llvm::StringRef(env).take_front(40))
    shown += (unsigned char)c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", (unsigned char)c) : std::string(1, c);
  return shown;
}

/// `line` on stderr the first time this process says it: a variable read by every layer or op
/// (TGC_DECODE_PARTS) is said once, not once a read.
void sayOnce(const std::string &line) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(line).second)
    fmt::print(stderr, "{}", line);
}
} // namespace

int64_t environmentCount(const char *name, int64_t fallback, int64_t most, const char *limit) {
  const char *env = std::getenv(name);
  if (!env)
    return fallback;
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(env, &end, 10);
  if (*env == '\0' || *end != '\0' || errno == ERANGE || n < 1) {
    sayOnce(fmt::format("tgc: {}='{}' is not a count (a whole number, 1 or more): using {}\n", name, shownValue(env),
                        fallback));
    return fallback;
  }
  if (n > most) {
    sayOnce(fmt::format("tgc: {}={} is more than {} ({}): using {}\n", name, n, limit, most, most));
    return most;
  }
  return n;
}

bool environmentSwitch(const char *name, bool fallback) {
  const char *env = std::getenv(name);
  if (!env || !*env)
    return fallback;
  if (llvm::StringRef(env) == "0" || llvm::StringRef(env) == "1")
    return *env == '1';
  sayOnce(fmt::format("tgc: {}='{}' is not 0 or 1: using {}\n", name, shownValue(env), fallback ? 1 : 0));
  return fallback;
}

std::string environmentChoice(const char *name, llvm::ArrayRef<const char *> choices, const char *unset) {
  const char *env = std::getenv(name);
  if (!env || !*env)
    return "";
  for (const char *choice : choices)
    if (llvm::StringRef(env) == choice)
      return env;
  std::string listed;
  for (const char *choice : choices)
    listed += (listed.empty() ? "" : ", ") + std::string(choice);
  sayOnce(fmt::format("tgc: {}='{}' is not one of {}: {}\n", name, shownValue(env), listed, unset));
  return "";
}

} // namespace tgc
