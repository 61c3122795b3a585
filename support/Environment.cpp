#include "support/Environment.h"

#include "llvm/ADT/StringRef.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fmt/format.h>

namespace tgc {

int64_t environmentCount(const char *name, int64_t fallback, int64_t most, const char *limit) {
  const char *env = std::getenv(name);
  if (!env)
    return fallback;
  char *end = nullptr;
  errno = 0;
  long long n = std::strtoll(env, &end, 10);
  if (*env == '\0' || *end != '\0' || errno == ERANGE || n < 1) {
    // At most 40 bytes of it, control bytes escaped: the value is the user's, not tgc's.
    std::string shown;
    for (char c : llvm::StringRef(env).take_front(40))
      shown += (unsigned char)c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", (unsigned char)c) : std::string(1, c);
    fmt::print(stderr, "tgc: {}='{}' is not a count (a whole number, 1 or more): using {}\n", name, shown, fallback);
    return fallback;
  }
  if (n > most) {
    fmt::print(stderr, "tgc: {}={} is more than {} ({}): using {}\n", name, n, limit, most, most);
    return most;
  }
  return n;
}

} // namespace tgc
