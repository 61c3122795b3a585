// A model's program compiled for a device: the pipeline for training or inference on that
// device, and the executor that runs it. The trainer and the generator both start here.
#pragma once

#include "backends/Communicator.h"
#include "backends/Executor.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"
#include "transforms/Pass.h"

#include <memory>

namespace tgc {

/// Where a program runs, decided once per run and passed as a value: the CPU interpreter, or the
/// first GPU with its compute capability (detectCudaDevice).
struct Device {
  enum Kind { Cpu, Cuda };
  Kind kind = Cpu;
  int computeCapability = 0; // major * 10 + minor, on a GPU
  int ordinal = 0;           // which GPU of the machine (a data-parallel rank's own)

  static Device cpu() { return Device{}; }
  bool operator==(Kind k) const { return kind == k; }
  bool operator!=(Kind k) const { return kind != k; }
};

/// The GPU this run uses (GPU `ordinal`, the first by default), or why there is none (no driver,
/// no device, a build without CUDA, fewer GPUs than `ordinal` + 1).
llvm::Expected<Device> detectCudaDevice(int ordinal = 0);

/// The recipe a model file's "auto" means on `device`: fp32 on the CPU interpreter; on the GPU
/// gpuRecipeFor its compute capability. Explicit recipes stay as they are.
PrecisionConfig resolveRecipe(PrecisionConfig precision, const Device &device);
struct CompiledProgram {
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Executor> executor;
  PrecisionConfig precision; // resolved
};

/// The pass pipeline compileForDevice runs for `config` on `device` (rank `rank` of `ranks`
/// data-parallel ranks), and in `precision` the recipe it resolves.
llvm::Expected<PassPipeline> devicePipeline(const ModelConfig &config, const Device &device, bool training,
                                            int ranks, PrecisionConfig &precision, int rank = 0);

/// Runs the training or the inference pipeline on `graph` (the builder's output) and creates
/// the executor. On the GPU the program is compiled by gpuPipeline (the fusions the GPU
/// lowers); a recipe the GPU cannot serve (fp8 below compute capability 8.9, bf16 below 8.0)
/// is an error there, not a downgrade.
/// `communicator`: the ranks of a data-parallel training run this program is one of (the
/// data-parallel pass then reduces its gradients, loss and FP8 amaxes over them); none: one rank.
/// `regionsOf`: on the GPU, a program whose parameter and state regions this one uses where they
/// are laid out alike (CudaOptions::regionsOf); the interpreter holds its own.
llvm::Expected<CompiledProgram> compileForDevice(std::unique_ptr<Graph> graph,
                                                 const ModelConfig &config, const Device &device,
                                                 bool training, Communicator *communicator = nullptr,
                                                 Executor *regionsOf = nullptr);

} // namespace tgc
