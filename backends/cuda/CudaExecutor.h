// The GPU executor: runs a program's generated kernels (compiled by NVRTC for this GPU) and its
// GEMMs (cuBLASLt) on one CUDA device, one step as one CUDA graph replay. Intermediates share
// one arena laid out by the memory plan (MemoryPlan.h); parameters, gradients and state live in
// contiguous regions (ParameterLayout).
#pragma once

#include "backends/Communicator.h"
#include "backends/Executor.h"
#include "ir/Graph.h"

#include <memory>

namespace tgc {

struct CudaOptions {
  int device = 0;
  /// The ranks the program's all_reduce ops reduce over (NCCL: Communicator::ncclComm); none:
  /// this rank alone, where an all_reduce's results are its operands.
  Communicator *communicator = nullptr;
  /// Fill every result buffer with NaN before each run, so that elements a kernel fails to
  /// write show up in comparisons (the GPU tests set it).
  bool poisonResults = false;
  /// AdamW and the gradient norm as flat launches over the contiguous parameter layout (the
  /// same bits as one kernel per op; off only to test that).
  bool groupOptimizer = true;
  /// The delayed-scaling updates as a few launches of many blocks, one per update (the same
  /// bits as one kernel per op; off only to test that).
  bool groupFp8Updates = true;
  /// Values only BF16 GEMMs read stored in BF16 (the same bits; off only to test that).
  bool storeBf16 = true;
  /// fc1's GELU and its gradient as cuBLASLt epilogues writing BF16, the logits in BF16, an FP8
  /// layer's pre-activation in BF16 (CudaProgram::bf16Rounding, lowering/StorageRules.cpp; with storeBf16):
  /// these round what fp32 keeps (off to test the other BF16 stores' bits).
  bool bf16Rounding = true;
  /// BF16 attention on cuDNN's fused attention where cuDNN 9 is found and takes the shape
  /// (Cudnn.h), else tgc's kernels. TGC_CUDNN=0 in the environment turns it off too.
  bool cudnnAttention = true;
  /// Another program on this device (a decode step's) whose parameter region, state region and
  /// BF16 weight copy this one uses instead of allocating its own, each where the two programs
  /// lay it out alike (a prompt's prefill: the same weights, the KV caches it writes for the
  /// decode step); that program must outlive this one. Null: every region its own.
  Executor *regionsOf = nullptr;
};

/// Compiles `graph` for the device and allocates its buffers. Fails with a clear message where
/// there is no GPU, no CUDA in this build, or an op without a GPU lowering.
llvm::Expected<std::unique_ptr<Executor>> createCudaExecutor(const Graph &graph,
                                                             CudaOptions options = {});

} // namespace tgc
