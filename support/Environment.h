// Counts read from environment variables (TGC_THREADS, TGC_TRACE_STEPS): a value tgc does not
// take is said once on stderr, with what is used instead, rather than silently changed.
#pragma once

#include <cstdint>

namespace tgc {

/// The count in environment variable `name`: `fallback` when it is unset; `fallback` with a
/// warning when it is not a whole number of at least 1; `most` with a warning when it is more.
/// `limit` says what bounds it, for the warning ("this machine's cores").
int64_t environmentCount(const char *name, int64_t fallback, int64_t most, const char *limit);

} // namespace tgc
