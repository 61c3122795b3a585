// Settings read from environment variables: counts (TGC_THREADS, TGC_TRACE_STEPS), switches
// (TGC_PDL, TGC_CUDNN) and choices among names (TGC_GPU_PROFILE). A value tgc does not take is
// said on stderr, once a process, with what is used instead, rather than silently taken for
// another.
#pragma once

#include "llvm/ADT/ArrayRef.h"

#include <cstdint>
#include <string>

namespace tgc {

/// The count in environment variable `name`: `fallback` when it is unset; `fallback` with a
/// warning when it is not a whole number of at least 1; `most` with a warning when it is more.
/// `limit` says what bounds it, for the warning ("this machine's cores").
int64_t environmentCount(const char *name, int64_t fallback, int64_t most, const char *limit);

/// Environment variable `name` as a switch: `fallback` when unset or empty, false for "0", true
/// for "1"; anything else `fallback`, with a warning.
bool environmentSwitch(const char *name, bool fallback);

/// Environment variable `name` when it is one of `choices`; "" when unset or empty; otherwise ""
/// with a warning that lists the choices (`unset` says what "" means: "no profile").
std::string environmentChoice(const char *name, llvm::ArrayRef<const char *> choices, const char *unset);

} // namespace tgc
