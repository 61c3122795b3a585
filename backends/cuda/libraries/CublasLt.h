// cuBLASLt, opened at run time (dlopen) the first time a GPU program plans a GEMM, as NCCL and
// cuDNN are (Libraries.h): loading it runs its static initialisers, some 0.45 s of page faults,
// which every tgc process paid at start when the binary linked it, CPU-only commands included.
#pragma once

#ifdef TGC_HAVE_CUDA
#include <cublasLt.h>

#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace tgc {

/// The entry points tgc calls, bound from the library found.
struct CublasLtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetVersion) getVersion = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) matmulAlgoGetHeuristic = nullptr;
  decltype(&cublasLtMatmulDescCreate) matmulDescCreate = nullptr;
  decltype(&cublasLtMatmulDescDestroy) matmulDescDestroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) matmulDescSetAttribute = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) matmulPreferenceCreate = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) matmulPreferenceDestroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) matmulPreferenceSetAttribute = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) matrixLayoutCreate = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) matrixLayoutDestroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) matrixLayoutSetAttribute = nullptr;
  std::string path;
  size_t version = 0; // cublasLtGetVersion's
};

/// Where libcublasLt.so.<the major version tgc was built with> is looked for
/// (libraryCandidates: $TGC_CUBLASLT_LIBRARY, the toolkit's folders, the system's search,
/// PyTorch's nvidia/cublas).
std::vector<std::string> cublasLtCandidates();
/// The first of `candidates` that is cuBLASLt of that major version, or an error naming each
/// place tried and why it failed.
llvm::Expected<CublasLtApi> loadCublasLtFrom(const std::vector<std::string> &candidates);
/// cuBLASLt from cublasLtCandidates, opened once for the process.
llvm::Expected<const CublasLtApi *> loadCublasLt();

} // namespace tgc
#endif
