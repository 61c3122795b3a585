// Libraries that tgc opens at run time (dlopen): cuBLASLt for the GEMMs (when a GPU program
// first needs it: a CPU-only command never pays its start-up), NCCL for the collectives and
// cuDNN for the fused attention (optional: tgc runs without them). Each is searched where it is
// found in practice, and the search's order is the same for all of them.
#pragma once

#include "support/Error.h"

#include "llvm/ADT/STLFunctionalExtras.h"

#include <dlfcn.h>
#include <mutex>
#include <string>
#include <vector>

namespace tgc {

/// Where `library` (a soname such as libnccl.so.2) is looked for, in order: $`environment` (when
/// set, alone: a path the user gives is not silently replaced), the CUDA toolkit's library
/// folders ($CUDA_HOME, the one tgc was built with, /usr/local/cuda), the system's search
/// (LD_LIBRARY_PATH, ld.so.cache), then PyTorch's copy in Python's site-packages
/// (nvidia/`package`/lib), where the GPU machines have it.
std::vector<std::string> libraryCandidates(const char *environment, const char *package, const char *library);

/// Opens the first of `candidates` (dlopen) that `accept` takes: it binds what it needs from the
/// library and returns "" to keep it, else why not (the library is closed again). Returns the
/// path kept, or "" with `tried` naming each candidate and why it failed. A kept library stays
/// open for the process.
std::string openFirstLibrary(const std::vector<std::string> &candidates,
                             llvm::function_ref<std::string(void *library)> accept, std::vector<std::string> &tried);

/// Binds a library's symbols to function pointers of their types, and remembers the first one
/// the library lacks (the library is then not the one asked for).
class SymbolBinder {
public:
  explicit SymbolBinder(void *library) : library_(library) {}
  template <typename F> void operator()(const char *symbol, F &fn) {
    fn = reinterpret_cast<F>(dlsym(library_, symbol));
    if (!fn && !missing_)
      missing_ = symbol;
  }
  /// The first symbol not found, or null.
  const char *missing() const { return missing_; }

private:
  void *library_;
  const char *missing_ = nullptr;
};

/// "2.28.9" from a version code of major * 10000 + minor * 100 + patch (NCCL's since 2.9,
/// cuDNN's since 9.0).
std::string versionFromCode(size_t code);

/// The candidates tried and why each failed, as the lines of one error message.
std::string listTried(const std::vector<std::string> &tried);

/// The error of a library not found: `name` (`soname`), the variable that gives its path, and
/// each candidate tried and why it failed.
llvm::Error libraryNotFound(const char *name, const char *soname, const char *environment,
                            const std::vector<std::string> &tried);

/// `Api` from the first of `candidates` that `bind` takes (it fills a fresh Api from the library
/// and returns "" to keep it, else why not), with the path it was opened from; or
/// libraryNotFound's error.
template <typename Api>
llvm::Expected<Api> openLibrary(const char *name, const char *soname, const char *environment,
                                const std::vector<std::string> &candidates,
                                llvm::function_ref<std::string(void *library, Api &api)> bind) {
  std::vector<std::string> tried;
  Api api;
  std::string path = openFirstLibrary(
      candidates,
      [&](void *library) {
        api = Api();
        return bind(library, api);
      },
      tried);
  if (path.empty())
    return libraryNotFound(name, soname, environment, tried);
  api.path = path;
  return api;
}

/// The library `load` finds (an llvm::Expected<Api>), loaded at the first call for the whole
/// process: later calls return the same entry points, or the first call's error again. Each
/// caller passes its own lambda, so each library has its own once.
template <typename Api, typename Load>
llvm::Expected<const Api *> loadOnce(Load load) {
  static std::once_flag once;
  static Api api;
  static std::string error; // empty once loaded
  std::call_once(once, [&] {
    llvm::Expected<Api> loaded = load();
    if (loaded)
      api = std::move(*loaded);
    else
      error = llvm::toString(loaded.takeError());
  });
  if (!error.empty())
    return stringError(error);
  return &api;
}

} // namespace tgc
