// A model's program compiled for a device: the pipeline for training or inference on that
// device, and the executor that runs it. The trainer and the generator both start here.
#pragma once

#include "backends/Executor.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"

#include <memory>

namespace tgc {

enum class Device { Cpu, Cuda };

/// The recipe a model file's "auto" means on `device`: fp32 on the CPU interpreter; on the GPU
/// gpuRecipeFor its compute capability. Explicit recipes stay as they are.
PrecisionConfig resolveRecipe(PrecisionConfig precision, Device device);
struct CompiledProgram {
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Executor> executor;
  PrecisionConfig precision; // resolved
};

/// Runs the training or the inference pipeline on `graph` (the builder's output) and creates
/// the executor. On the GPU the program is compiled by gpuPipeline (the fusions the GPU
/// lowers); a recipe the GPU cannot serve (fp8 below compute capability 8.9, bf16 below 8.0)
/// is an error there, not a downgrade.
llvm::Expected<CompiledProgram> compileForDevice(std::unique_ptr<Graph> graph,
                                                 const ModelConfig &config, Device device,
                                                 bool training);

} // namespace tgc
