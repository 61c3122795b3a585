// What build this is, for logs and benchmark records.
#pragma once

namespace tgc {

/// The commit the sources were at when built (git describe --always --dirty), or "unknown".
const char *buildCommit();

} // namespace tgc
