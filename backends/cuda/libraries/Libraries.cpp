#include "backends/cuda/libraries/Libraries.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

namespace tgc {

namespace {

/// The nvidia/<package>/lib/<library> of each python3.* site-packages or dist-packages folder
/// under `root` (pip's layout: PyTorch's CUDA wheels carry NCCL and cuDNN there).
void addPythonCopies(const std::string &root, const char *package, const char *library,
                     std::vector<std::string> &out) {
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.starts_with("python3"))
      continue;
    for (const char *packages : {"site-packages", "dist-packages"}) {
      llvm::SmallString<256> path(it->path());
      llvm::sys::path::append(path, packages, "nvidia", package);
      llvm::sys::path::append(path, "lib", library);
      if (llvm::sys::fs::exists(path))
        out.push_back(std::string(path));
    }
  }
}

} // namespace

std::vector<std::string> libraryCandidates(const char *environment, const char *package, const char *library) {
  if (const char *given = std::getenv(environment); given && *given)
    return {given};
  std::vector<std::string> out;
  auto add = [&](std::string path) {
    if (!path.empty() && std::find(out.begin(), out.end(), path) == out.end())
      out.push_back(std::move(path));
  };
  if (const char *home = std::getenv("CUDA_HOME"); home && *home)
    add(std::string(home) + "/lib64/" + library);
#ifdef TGC_CUDA_LIBRARY_DIR
  add(std::string(TGC_CUDA_LIBRARY_DIR) + "/" + library);
#endif
  add(std::string("/usr/local/cuda/lib64/") + library);
  add(library); // the system's search: LD_LIBRARY_PATH, ld.so.cache
  std::vector<std::string> python;
  for (const char *root : {"/usr/local/lib", "/usr/lib"})
    addPythonCopies(root, package, library, python);
  if (const char *home = std::getenv("HOME"); home && *home)
    addPythonCopies(std::string(home) + "/.local/lib", package, library, python);
  for (std::string &p : python)
    add(std::move(p));
  return out;
}

std::string openFirstLibrary(const std::vector<std::string> &candidates,
                             llvm::function_ref<std::string(void *library)> accept, std::vector<std::string> &tried) {
  for (const std::string &path : candidates) {
    void *library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      const char *why = dlerror();
      tried.push_back(fmt::format("{} ({})", path, why ? why : "cannot open"));
      continue;
    }
    std::string refused = accept(library);
    if (refused.empty())
      return path;
    tried.push_back(fmt::format("{} ({})", path, refused));
    dlclose(library);
  }
  return "";
}

std::string versionFromCode(size_t code) {
  return fmt::format("{}.{}.{}", code / 10000, code / 100 % 100, code % 100);
}

std::string listTried(const std::vector<std::string> &tried) {
  std::string list;
  for (const std::string &t : tried)
    list += "\n  " + t;
  return list.empty() ? "\n  nothing" : list;
}

llvm::Error libraryNotFound(const char *name, const char *soname, const char *environment,
                            const std::vector<std::string> &tried) {
  return stringError(fmt::format("error: {} ({}) was not found; tried, in order (set {} to its path):{}", name,
                                 soname, environment, listTried(tried)));
}

} // namespace tgc
