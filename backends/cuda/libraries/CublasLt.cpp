#include "backends/cuda/libraries/CublasLt.h"

#include "backends/cuda/libraries/Libraries.h"

#include "support/Error.h"

#include <fmt/format.h>

namespace tgc {

namespace {

// The soname of the major version tgc was built with (cublas_api.h).
std::string libraryName() { return fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR); }
constexpr const char *kCublasLtEnvironment = "TGC_CUBLASLT_LIBRARY";

} // namespace

std::vector<std::string> cublasLtCandidates() {
  return libraryCandidates(kCublasLtEnvironment, "cublas", libraryName().c_str());
}

llvm::Expected<CublasLtApi> loadCublasLtFrom(const std::vector<std::string> &candidates) {
  std::string soname = libraryName();
  return openLibrary<CublasLtApi>(
      "cuBLASLt", soname.c_str(), kCublasLtEnvironment, candidates, [](void *library, CublasLtApi &api) {
        SymbolBinder need(library);
        need("cublasLtCreate", api.create);
        need("cublasLtDestroy", api.destroy);
        need("cublasLtGetVersion", api.getVersion);
        need("cublasLtMatmul", api.matmul);
        need("cublasLtMatmulAlgoGetHeuristic", api.matmulAlgoGetHeuristic);
        need("cublasLtMatmulDescCreate", api.matmulDescCreate);
        need("cublasLtMatmulDescDestroy", api.matmulDescDestroy);
        need("cublasLtMatmulDescSetAttribute", api.matmulDescSetAttribute);
        need("cublasLtMatmulPreferenceCreate", api.matmulPreferenceCreate);
        need("cublasLtMatmulPreferenceDestroy", api.matmulPreferenceDestroy);
        need("cublasLtMatmulPreferenceSetAttribute", api.matmulPreferenceSetAttribute);
        need("cublasLtMatrixLayoutCreate", api.matrixLayoutCreate);
        need("cublasLtMatrixLayoutDestroy", api.matrixLayoutDestroy);
        need("cublasLtMatrixLayoutSetAttribute", api.matrixLayoutSetAttribute);
        if (need.missing())
          return fmt::format("not cuBLASLt: no {}", need.missing());
        // The enumerators and structures tgc was compiled with are this major version's.
        api.version = api.getVersion();
        if (api.version / 10000 != CUBLAS_VER_MAJOR)
          return fmt::format("cuBLASLt {}: tgc was built with major version {}", versionFromCode(api.version),
                             CUBLAS_VER_MAJOR);
        return std::string();
      });
}

llvm::Expected<const CublasLtApi *> loadCublasLt() {
  return loadOnce<CublasLtApi>([] { return loadCublasLtFrom(cublasLtCandidates()); });
}

} // namespace tgc
