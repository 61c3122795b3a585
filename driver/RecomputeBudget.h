// recompute: auto (--memory-budget GIB): the fewest leading layers whose recomputation brings a
// training program's GPU plan within a memory budget, as torchtitan's memory-budget activation
// checkpointing chooses what to keep. The plan is the memory planner's (tgc compile --stats):
// the parameters, gradients and state, and the arena at its fullest. Each recomputed layer keeps
// fewer activations across the forward, so the plan shrinks as layers are added and a binary
// search over them needs about log2(layers) + 2 plans.
#pragma once

#include "driver/Program.h"

#include "llvm/ADT/STLFunctionalExtras.h"

#include <vector>

namespace tgc {

struct RecomputeChoice {
  int64_t layers = 0; // the first this many recompute; -1 every layer and the head
  int64_t bytes = 0;  // the plan's
  int64_t budget = 0;
  std::vector<std::pair<int64_t, int64_t>> tried; // (layers, bytes) of each plan made
};

/// The choice for `layerCount` block layers, `planBytes(k)` the plan with the first k layers
/// recomputed (-1: all, the head too); an error naming both numbers where even that is over.
llvm::Expected<RecomputeChoice> chooseRecomputeLayers(int64_t layerCount, int64_t budgetBytes,
                                                      llvm::function_ref<llvm::Expected<int64_t>(int64_t)> planBytes);

/// The bytes of the GPU plan of `config`'s training program at `batch` sequences a rank, as
/// compileForDevice would compile it for `device`: parameters, gradients, state and the arena;
/// with `cudnnAttention` cuDNN's attention (as the executor plans it where its GPU finds
/// cuDNN), else tgc's own (as tgc compile --stats: more BF16 copies, about 1.4 GiB at gpt-1.3b).
llvm::Expected<int64_t> gpuTrainingPlanBytes(const ModelConfig &config, int64_t batch, const Device &device, int ranks,
                                             bool cudnnAttention);

/// Under train.recomputeAuto on the GPU: `config` with the layers chosen for the budget
/// (memory_budget, else the GPU's memory less kGpuReserveBytes), recompute_layers set and
/// auto off; `note` says what was chosen. Elsewhere `config` unchanged.
llvm::Expected<ModelConfig> resolveRecompute(const ModelConfig &config, int64_t batch, const Device &device, int ranks,
                                             std::string *note = nullptr);

/// What the budget leaves, by default, for what the plan does not count: the CUDA context,
/// cuBLASLt's and cuDNN's workspaces and their libraries' own memory.
constexpr int64_t kGpuReserveBytes = int64_t(3) << 30;

} // namespace tgc
