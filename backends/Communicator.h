// The ranks of a data-parallel run and how they reduce values together: the all_reduce op of the
// data-parallel pass runs through a Communicator (and reduce-scatter and all-gather, what a
// sharded optimizer needs: [dist-zero]'s CPU reference, not yet used by a pass). The CPU
// interpreter reduces host memory through it (LocalGroup: ranks as threads of one process, the
// reference); the GPU executor hands NCCL the device buffers (backends/cuda/libraries/Nccl.h's
// NcclCommunicator).
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

namespace tgc {

enum class ReduceOp { Avg, Sum, Max };
/// all_reduce's reduce attribute: "avg", "sum" or "max".
inline std::optional<ReduceOp> parseReduceOp(llvm::StringRef name) {
  if (name == "avg")
    return ReduceOp::Avg;
  if (name == "sum")
    return ReduceOp::Sum;
  if (name == "max")
    return ReduceOp::Max;
  return std::nullopt;
}

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  /// Reduces `count` floats of host memory in place over the ranks: every rank calls it with
  /// the same count and op, in the same order, and gets the same values.
  virtual llvm::Error allReduceHost(float *data, size_t count, ReduceOp op) = 0;
  /// Reduces `count` floats of each rank's `in` over the ranks and leaves rank r's part, elements
  /// [r * count / ranks, (r + 1) * count / ranks), in `out` (ZeRO's gradient reduction): count is
  /// a multiple of ranks(); every rank calls it with the same count and op.
  virtual llvm::Error reduceScatterHost(const float *in, float *out, size_t count, ReduceOp op) = 0;
  /// Each rank's `count / ranks()` floats of `in` into `out` (count floats), in rank order
  /// (ZeRO's parameters rebuilt from their shards).
  virtual llvm::Error allGatherHost(const float *in, float *out, size_t count) = 0;
  /// The NCCL communicator (ncclComm_t) where the ranks are GPUs through NCCL, else null.
  virtual void *ncclComm() const { return nullptr; }
};

/// `ranks` ranks as threads of one process, each with its Communicator: the CPU reference of a
/// data-parallel run. The reduction is done in rank order, so every run gives the same bits.
/// abort() makes every waiting and later call fail (a rank that failed would otherwise leave the
/// others waiting for it).
class LocalGroup {
public:
  explicit LocalGroup(int ranks);
  ~LocalGroup();
  Communicator &rank(int r);
  void abort();

private:
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

} // namespace tgc
