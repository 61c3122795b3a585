// Bounds on what tgc's readers accept, so that a hostile or mistaken input ends in one clear
// error rather than an exhausted stack, a read that never ends or an out-of-memory kill.
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cstdint>
#include <memory>
#include <optional>

namespace tgc {

/// How deep brackets may nest in a JSON header or metadata (tgc's nest three levels) and in a
/// model file (two): deeper is refused before a recursive parser runs.
constexpr unsigned kMaxJsonDepth = 64;
constexpr unsigned kMaxYamlDepth = 64;
/// The largest model file and IR file tgc reads.
constexpr uint64_t kMaxModelFileBytes = 1 << 20;
constexpr uint64_t kMaxIrFileBytes = uint64_t(256) << 20;

/// The offset in `text` where brackets ([ and {) first nest deeper than `limit`, if they do.
/// JSON: brackets inside strings do not count. YAML: every bracket counts (a conservative
/// bound), and so do lines indented past 4 * limit columns or opening more than `limit` block
/// sequences ("- - - ..."), and runs of key and entry indicators ("? ? ?", "{???", "? - ? -":
/// each nesting the next), added to the brackets open around them.
std::optional<size_t> findDeepNesting(llvm::StringRef text, unsigned limit, bool yaml = false);

/// The 1-based line and column of `offset` in `text`.
std::pair<unsigned, unsigned> lineAndColumn(llvm::StringRef text, size_t offset);

/// The contents of `path` ("-": standard input) if at most `limit` bytes: a larger file, or a
/// device or pipe that does not end, is an error naming the limit (read stops past it), not a
/// read that fills the memory. `what` names the file in the error ("a model file").
llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> readFileAtMost(llvm::StringRef path, uint64_t limit,
                                                                  llvm::StringRef what);

} // namespace tgc
