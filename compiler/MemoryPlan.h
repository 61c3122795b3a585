// The memory plan: every intermediate value of a program gets an offset in one arena, and
// values whose lifetimes (program order, from definition to last use) do not overlap share
// memory. Parameters, optimizer state and inputs keep buffers of their own.
#pragma once

#include "compiler/CudaSource.h"
#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {

/// Bytes a value of type `t` takes on the GPU: f32 and i32 four per element, FP8 one.
int64_t deviceBytesOf(const TensorType &t);

struct MemoryPlan {
  llvm::DenseMap<const Value *, int64_t> offsets; // bytes into the arena
  /// Per op: its scratch buffers (OpLowering::scratchFloats), then for a BF16 GEMM the BF16
  /// copies of its two operands. They live only while the op runs.
  std::vector<std::vector<int64_t>> opLocalOffsets;
  int64_t arenaBytes = 0;
  int64_t withoutReuseBytes = 0; // what one buffer per value would take
  int64_t persistentBytes = 0;   // parameters, state, inputs and ops' persistent buffers
};

/// Bytes of the op-local buffers of op `op` as lowered (see MemoryPlan::opLocalOffsets).
std::vector<int64_t> opLocalBytes(const Op &op, const OpLowering &lowering);

/// Plans the arena for `graph` as lowered (aliases share their source's memory and extend its
/// life; graph outputs and values assigned at the end of the step live to the end).
MemoryPlan planMemory(const Graph &graph, const CudaProgram &program);

} // namespace tgc
