// Writing files so that a crash or an error never leaves a half-written file under the name.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/Error.h"

#include <string>
#include <utility>

namespace tgc {

/// The folder `path` names a file in ("." for a bare name).
std::string folderOf(llvm::StringRef path);

/// The file a replacing write of `path` replaces: `path`, or the file its link names. A target
/// that exists and is not a regular file (a device such as /dev/null, a pipe, a folder), or a
/// link to nothing, is an error naming it: a rename over it would replace the node itself.
llvm::Expected<std::string> replaceableTarget(llvm::StringRef path);

/// The start of the names of writeFileAtomically's temporaries for a file called `name`: a
/// hidden name of fixed length (32 bytes with its 6 random ones), whatever the length of `name`.
std::string temporaryPrefix(llvm::StringRef name);

/// An error where the name of `path`, with `suffix` appended, is longer than its folder takes.
llvm::Error checkNameFits(llvm::StringRef path, llvm::StringRef suffix = "");

/// Writes `contents` to `path` through a temporary file in the same folder and a rename; through
/// a link, to the file it names (the link kept); refused where replaceableTarget refuses.
llvm::Error writeFileAtomically(llvm::StringRef path, llvm::StringRef contents);
/// writeFileAtomically of what `write` streams into the temporary file (it may go back with
/// pwrite, to fill in a header last); an error from it leaves no file and the old one in place.
llvm::Error writeFileAtomicallyWith(llvm::StringRef path,
                                   llvm::function_ref<llvm::Error(llvm::raw_pwrite_stream &)> write);

/// A file a command reads or writes, by the flag that names it.
struct NamedFile {
  std::string flag; // "the model file", "--data", "--save", ...
  std::string path; // empty: not given
};

/// An error naming the first two of `files` that are the same file: by device and inode where
/// both exist (so that a symbolic or hard link, or another spelling, is caught), by the
/// resolved folder and name where they do not exist yet. `allowed` lists pairs of flags that
/// may name one file (a checkpoint read whole before it is replaced atomically). The file
/// TGC_TRACE names, where tracing is on, is one of them: the trace replaces it at the end.
llvm::Error checkDistinctFiles(llvm::ArrayRef<NamedFile> files,
                               llvm::ArrayRef<std::pair<llvm::StringRef, llvm::StringRef>> allowed = {});

} // namespace tgc
