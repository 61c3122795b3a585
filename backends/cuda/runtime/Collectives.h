// The collectives of a program (OpLowering::Collective: all_reduce, and ZeRO's reduce_scatter
// and all_gather) over its ranks: NCCL on a communication stream of their own, started from an
// event recorded on the main stream at the op's place and joined where collectiveJoins says
// (before its results' first reader; a reduce_scatter also before the one two buckets on), and
// all of them before the step ends. With one rank each result is its operand (a
// copy where their buffers differ). A reduce_scatter pads each operand to ranks x part in a
// staging buffer first (NCCL splits equal parts). Under
// dtype = "bf16" (grad_reduce: bf16) the values cross the ranks in BF16: rounded into a staging
// buffer, reduced there by NCCL in BF16, and widened into the results (with one rank, each
// result is its operand rounded to BF16, as the CPU's).
#pragma once

#include "backends/Communicator.h"
#include "backends/cuda/CudaProgram.h"
#include "backends/cuda/libraries/Nccl.h"
#include "backends/cuda/runtime/DeviceMemory.h"

#include "llvm/ADT/DenseMap.h"

#include <cuda_runtime.h>
#include <vector>

namespace tgc {

class Collectives {
public:
  Collectives() = default;
  Collectives(const Collectives &) = delete;
  Collectives &operator=(const Collectives &) = delete;
  ~Collectives();

  /// The events of `ops`' all_reduce ops and where each is joined; NCCL where `communicator`
  /// has more than one rank.
  /// `memory` holds the BF16 staging buffer; `library` the program's CUBIN (common.cuh's
  /// conversion kernels).
  llvm::Error prepare(const std::vector<Op *> &ops, const CudaProgram &program, Communicator *communicator,
                      DeviceMemory &memory, cudaLibrary_t library);
  /// Enqueues all_reduce op `i`: on the communication stream after what `stream` has queued,
  /// or on `stream` itself when `onMainStream` (profiling: then it is timed).
  llvm::Error run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream, bool onMainStream);
  /// Whether the all_reduce ops run on a stream of their own (more than one rank).
  bool concurrent() const { return commStream_ != nullptr; }
  /// `stream` waits for the all_reduce ops whose results op `i` reads first.
  llvm::Error joinBefore(size_t i, cudaStream_t stream) const;
  /// `stream` waits for every all_reduce op.
  llvm::Error joinAll(const CudaProgram &program, cudaStream_t stream) const;
  /// Whether joinBefore(i) waits for anything.
  bool joinsBefore(size_t i) const { return !joinsBefore_[i].empty(); }

private:
  struct Events {
    cudaEvent_t ready = nullptr, done = nullptr;
  };
  /// Launches common.cuh's conversion `kernel` over `count` elements on `stream`.
  llvm::Error convert(cudaKernel_t kernel, const void *from, void *to, int64_t count, cudaStream_t stream) const;
  /// An error naming NCCL's `call` and `op` where `result` is not success.
  llvm::Error check(int result, const char *call, const Op &op) const;
  llvm::Error runOneRank(const Op &op, const BufferMap &buffers, cudaStream_t stream) const;
  llvm::Error allReduce(const Op &op, const BufferMap &buffers, cudaStream_t on) const;
  llvm::Error reduceScatter(const Op &op, const BufferMap &buffers, cudaStream_t on) const;
  llvm::Error allGather(const Op &op, const BufferMap &buffers, cudaStream_t on) const;
  const NcclApi *nccl_ = nullptr;
  cudaKernel_t toBf16_ = nullptr, fromBf16_ = nullptr, roundThroughBf16_ = nullptr;
  char *staging_ = nullptr; // padded reduce-scatter parts, BF16 values on the wire (one collective at a time)
  void *comm_ = nullptr;
  cudaStream_t commStream_ = nullptr;
  std::vector<Events> events_;                   // per op (events only for all_reduce ops)
  std::vector<std::vector<size_t>> joinsBefore_; // per op: the all_reduce ops it waits for
};

} // namespace tgc
