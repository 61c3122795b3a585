// What a program's device memory holds, by class: the plan's persistent buffers (master
// weights, gradients, AdamW's moments, the rest of the state, inputs and kernel buffers) and the
// arena at its fullest op, split by what lives there then (activations kept for the backward,
// FP8 copies and their transposes, BF16 copies, op workspace). `tgc compile --stats`, `tgc
// bench` and `tgc train` print it; the executor adds what it allocates beyond the plan.
#pragma once

#include "backends/cuda/lowering/MemoryPlan.h"

#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace tgc {

struct MemoryClass {
  std::string name;
  int64_t bytes = 0;
};

struct MemoryBreakdown {
  std::vector<MemoryClass> persistent; // the parameter layout's regions, inputs, kernel buffers
  std::vector<MemoryClass> arena;      // what lives in the arena while `peakOp` runs
  int64_t peakOp = -1;                 // the op during which the arena holds the most
  std::string peakOpName;              // its first result's name
  int64_t peakLiveBytes = 0;           // the bytes live then (the arena is at least this)
  int64_t arenaBytes = 0;
};

/// AdamW's moments (its operands 2 and 3): their bytes in the state, and where they are shards
/// (ZeRO: each update reads its rank's shard of the parameter) over how many ranks, else 1.
struct AdamWMoments {
  int64_t bytes = 0;
  int64_t ranks = 1;
};
AdamWMoments adamwMoments(const Graph &graph, const CudaProgram &program);

/// `plan`'s bytes by class (see the file comment). A training program's activations are split
/// into those the ops the loss depends on make (the forward's, kept for the backward) and the rest.
MemoryBreakdown memoryBreakdown(const Graph &graph, const CudaProgram &program, const MemoryPlan &plan);

/// The breakdown as lines under `indent`, largest classes first, in MiB.
void printMemoryBreakdown(const MemoryBreakdown &b, llvm::raw_ostream &os, llvm::StringRef indent);

} // namespace tgc
