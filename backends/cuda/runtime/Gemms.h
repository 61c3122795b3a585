// The program's GEMMs on cuBLASLt (OpLowering::Gemm): the handle and workspace, one plan per op
// (layouts, batching, epilogue, FP8 scale pointers, the algorithm), the choice among the
// heuristic's algorithms (GemmTuning.h), and the calls. A BF16 GEMM reads BF16 copies of its
// operands: the parameters' copy, its producer's BF16 store, or a conversion before the call.
// An FP8 GEMM reads the bytes its quantize ops wrote, scaled back by the scale_inv each used.
#pragma once

#include "backends/cuda/CudaProgram.h"
#include "backends/cuda/libraries/CublasLt.h"
#include "backends/cuda/runtime/DeviceMemory.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <cuda_runtime.h>
#include <string>
#include <vector>

namespace tgc {

/// One cuBLASLt matmul, planned once.
/// Per block-scaled quantize op: the block scales of its q, and of its transpose (or null).
using BlockScaleMap = llvm::DenseMap<const Op *, std::pair<float *, float *>>;

struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates; // the heuristic's, best first (GemmTuner picks)
  std::string key;                              // what the choice depends on (GemmTuner)
  bool bf16 = false;
  void *bf16Operands[2] = {nullptr, nullptr};
  bool fromWeightCopy[2] = {false, false}; // the operand is a parameter: its BF16 copy is ready
  bool written[2] = {false, false};        // its producer wrote it in BF16 (stored, or a copy)
};

class GemmRunner {
public:
  GemmRunner() = default;
  GemmRunner(const GemmRunner &) = delete;
  GemmRunner &operator=(const GemmRunner &) = delete;
  ~GemmRunner();

  /// Opens cuBLASLt, makes its handle and workspace (in `memory`), and room for `ops` plans.
  llvm::Error open(DeviceMemory &memory, size_t ops);
  /// Plans op `i`'s GEMM: `buffers` hold its bias and GELU aux, `scaleInv` each quantize's
  /// scale_inv (for FP8 operands), `device` names the GPU in the tuning key.
  llvm::Error plan(size_t i, const Op &op, const CudaProgram &program, const BufferMap &buffers,
                   const llvm::DenseMap<const Op *, float *> &scaleInv, const BlockScaleMap &blockScales,
                   const std::string &device);
  GemmPlan &at(size_t i) { return plans_[i]; }
  /// The bias op `i`'s epilogue adds (the parameter's BF16 copy: cuBLASLt's BF16 epilogues).
  llvm::Error setBias(size_t i, const void *bias);
  /// Each GEMM's algorithm among its candidates, timed once and kept (GemmTuning.h); those
  /// whose result is written into the state it updates (`inPlace`) are not run for trials.
  llvm::Error tune(const std::vector<Op *> &ops, const BufferMap &buffers, const llvm::DenseSet<const Value *> &inPlace,
                   cudaStream_t stream);
  /// Enqueues op `i`'s GEMM, `convert` first writing the BF16 operand copies it needs.
  llvm::Error run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream,
                  llvm::function_ref<llvm::Error(const void *, void *, int64_t)> convert);

  static constexpr size_t kWorkspaceBytes = 32 << 20; // 32 MiB, as fp8.md suggests for Hopper

private:
  /// The operands and output the GEMM reads and writes (its BF16 operand copies under bf16).
  void pointers(const Op &op, const GemmPlan &plan, const BufferMap &buffers, void *&first, void *&second,
                void *&c) const;

  const CublasLtApi *blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void *workspace_ = nullptr;
  std::vector<GemmPlan> plans_; // per op (unused for non-GEMMs)
};

} // namespace tgc
