#include "support/Files.h"

#include "support/Error.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

namespace tgc {

llvm::Error writeFileAtomically(llvm::StringRef path, llvm::StringRef contents) {
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  llvm::SmallString<256> model(dir);
  llvm::sys::path::append(model, llvm::sys::path::filename(path) + ".tmp-%%%%%%");
  auto temp = llvm::sys::fs::TempFile::create(model);
  if (!temp)
    return fileError(path, "cannot create a temporary file next to it: {}",
                llvm::toString(temp.takeError()));
  {
    llvm::raw_fd_ostream os(temp->FD, /*shouldClose=*/false);
    os << contents;
    os.flush();
    if (os.has_error()) {
      std::string message = os.error().message();
      os.clear_error();
      llvm::consumeError(temp->discard());
      return fileError(path, "write failed: {}", message);
    }
  }
  if (auto err = temp->keep(path))
    return fileError(path, "cannot move the finished file into place: {}", llvm::toString(std::move(err)));
  return llvm::Error::success();
}

} // namespace tgc
