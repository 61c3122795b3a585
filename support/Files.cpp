#include "support/Files.h"

#include "support/Error.h"
#include "support/Trace.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

#include "llvm/ADT/STLExtras.h"

#include <cerrno>
#include <chrono>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <vector>

namespace tgc {

std::string folderOf(llvm::StringRef path) {
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  return dir.empty() ? "." : dir.str().str();
}

std::string temporaryPrefix(llvm::StringRef name) {
  return fmt::format(".tgc-{:016x}.tmp-", llvm::xxHash64(name));
}

llvm::Error checkNameFits(llvm::StringRef path, llvm::StringRef suffix) {
  std::string dir = folderOf(path);
  long most = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  size_t length = llvm::sys::path::filename(path).size() + suffix.size();
  if (most <= 0 || length <= size_t(most))
    return llvm::Error::success();
  return fileError(path, "the file name{} is {} bytes, and its folder takes names of at most {}",
                   suffix.empty() ? "" : " with '" + suffix.str() + "'", length, most);
}

namespace {

/// Temporaries of earlier saves to `name` that were killed before their rename (untouched for
/// ten minutes: not a save running now): removed, so that they do not pile up. Both spellings:
/// temporaryPrefix's, and NAME.tmp-XXXXXX of earlier versions.
void removeStaleTemporaries(llvm::StringRef dir, llvm::StringRef name) {
  std::string prefixes[] = {temporaryPrefix(name), (name + ".tmp-").str()};
  auto now = std::chrono::system_clock::now();
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    llvm::StringRef file = llvm::sys::path::filename(it->path());
    if (!llvm::any_of(prefixes, [&](const std::string &p) { return file.starts_with(p) && file.size() == p.size() + 6; }))
      continue;
    llvm::sys::fs::file_status status;
    if (!llvm::sys::fs::status(it->path(), status) && status.type() == llvm::sys::fs::file_type::regular_file &&
        now - status.getLastModificationTime() > std::chrono::minutes(10))
      llvm::sys::fs::remove(it->path());
  }
}

/// Makes what was written to `fd` (or renamed in the folder `fd` is) durable.
std::error_code syncToDisk(int fd) {
  return ::fsync(fd) ? std::error_code(errno, std::generic_category()) : std::error_code();
}

} // namespace

llvm::Expected<std::string> replaceableTarget(llvm::StringRef requested) {
  std::string resolved = requested.str();
  llvm::sys::fs::file_status status;
  if (!llvm::sys::fs::status(requested, status, /*Follow=*/false) &&
      status.type() == llvm::sys::fs::file_type::symlink_file) {
    llvm::SmallString<256> real;
    if (std::error_code ec = llvm::sys::fs::real_path(requested, real))
      return fileError(requested, "a link to nothing ({}): the link is left as it is", ec.message());
    resolved = real.str().str();
  }
  if (!llvm::sys::fs::status(resolved, status) && status.type() != llvm::sys::fs::file_type::regular_file)
    return fileError(requested, "exists and is not a regular file (a device, a pipe or a folder): tgc replaces "
                                "only regular files");
  return resolved;
}

llvm::Error writeFileAtomically(llvm::StringRef requested, llvm::StringRef contents) {
  return writeFileAtomicallyWith(requested, [&](llvm::raw_pwrite_stream &os) {
    os << contents;
    return llvm::Error::success();
  });
}

llvm::Error writeFileAtomicallyWith(llvm::StringRef requested,
                                   llvm::function_ref<llvm::Error(llvm::raw_pwrite_stream &)> write) {
  auto resolved = replaceableTarget(requested);
  if (!resolved)
    return resolved.takeError();
  llvm::StringRef path = *resolved;
  std::string dir = folderOf(path);
  removeStaleTemporaries(dir, llvm::sys::path::filename(path));
  llvm::SmallString<256> model(dir);
  // A short name of its own, so that a target whose name is near the folder's limit still has one.
  llvm::sys::path::append(model, temporaryPrefix(llvm::sys::path::filename(path)) + "%%%%%%");
  auto temp = llvm::sys::fs::TempFile::create(model);
  if (!temp)
    return fileError(path, "cannot create a temporary file next to it: {}",
                llvm::toString(temp.takeError()));
  {
    llvm::raw_fd_ostream os(temp->FD, /*shouldClose=*/false);
    if (auto err = write(os)) {
      os.flush();
      os.clear_error();
      llvm::consumeError(temp->discard());
      return err;
    }
    os.flush();
    if (os.has_error()) {
      std::string message = os.error().message();
      os.clear_error();
      llvm::consumeError(temp->discard());
      return fileError(path, "write failed: {}", message);
    }
  }
  // On the disk before the rename makes it the file (a crash then leaves the old or the new
  // one, never a renamed file whose data was not written), and the rename on the disk after.
  if (std::error_code ec = syncToDisk(temp->FD)) {
    llvm::consumeError(temp->discard());
    return fileError(path, "write failed: {}", ec.message());
  }
  if (auto err = temp->keep(path))
    return fileError(path, "cannot move the finished file into place: {}", llvm::toString(std::move(err)));
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dirFd >= 0) {
    syncToDisk(dirFd); // (some file systems cannot sync a folder; the file itself is there)
    ::close(dirFd);
  }
  return llvm::Error::success();
}

namespace {

/// What identifies a file: its device and inode where it exists, else its folder resolved
/// (links and "..", as the kernel would) and its name.
std::string fileIdentity(llvm::StringRef path) {
  llvm::sys::fs::UniqueID id;
  if (!llvm::sys::fs::getUniqueID(path, id))
    return fmt::format("inode {}:{}", id.getDevice(), id.getFile());
  std::string dir = folderOf(path);
  llvm::SmallString<256> real;
  if (llvm::sys::fs::real_path(dir, real))
    real = dir; // the folder does not exist either: the spelling is all there is
  llvm::sys::path::append(real, llvm::sys::path::filename(path));
  return "path " + real.str().str();
}

} // namespace

llvm::Error checkDistinctFiles(llvm::ArrayRef<NamedFile> given,
                               llvm::ArrayRef<std::pair<llvm::StringRef, llvm::StringRef>> allowed) {
  std::vector<NamedFile> files(given.begin(), given.end());
  // The trace is written when an executor ends, over whatever file it names.
  if (TraceLog::instance().enabled())
    files.push_back({"TGC_TRACE", TraceLog::instance().path()});
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
