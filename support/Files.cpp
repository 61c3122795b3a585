#include "support/Files.h"

#include "support/Error.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include "llvm/ADT/STLExtras.h"

#include <fmt/format.h>
#include <vector>

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

namespace {

/// What identifies a file: its device and inode where it exists, else its folder resolved
/// (links and "..", as the kernel would) and its name.
std::string fileIdentity(llvm::StringRef path) {
  llvm::sys::fs::UniqueID id;
  if (!llvm::sys::fs::getUniqueID(path, id))
    return fmt::format("inode {}:{}", id.getDevice(), id.getFile());
  llvm::SmallString<256> dir(path), real;
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  if (llvm::sys::fs::real_path(dir, real))
    real = dir; // the folder does not exist either: the spelling is all there is
  llvm::sys::path::append(real, llvm::sys::path::filename(path));
  return "path " + real.str().str();
}

} // namespace

llvm::Error checkDistinctFiles(llvm::ArrayRef<NamedFile> files,
                               llvm::ArrayRef<std::pair<llvm::StringRef, llvm::StringRef>> allowed) {
  std::vector<std::string> ids;
  for (const NamedFile &f : files)
    ids.push_back(f.path.empty() ? "" : fileIdentity(f.path));
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t j = i + 1; j < files.size(); ++j) {
      if (ids[i].empty() || ids[i] != ids[j])
        continue;
      bool permitted = llvm::any_of(allowed, [&](const auto &pair) {
        return (pair.first == files[i].flag && pair.second == files[j].flag) ||
               (pair.first == files[j].flag && pair.second == files[i].flag);
      });
      if (!permitted)
        return fileError(files[j].path, "{} and {} name the same file{}: nothing was written; give each its own",
                         files[i].flag, files[j].flag,
                         files[i].path == files[j].path ? "" : " ('" + files[i].path + "')");
    }
  return llvm::Error::success();
}

} // namespace tgc
