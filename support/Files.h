// Writing files so that a crash or an error never leaves a half-written file under the name.
#pragma once

#include "llvm/Support/Error.h"

namespace tgc {

/// Writes `contents` to `path` through a temporary file in the same folder and a rename.
llvm::Error writeFileAtomically(llvm::StringRef path, llvm::StringRef contents);

} // namespace tgc
