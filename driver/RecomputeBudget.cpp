#include "driver/RecomputeBudget.h"

#include "backends/cuda/Target.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "models/GPTBuilder.h"
#include "support/Error.h"

#include <fmt/format.h>

namespace tgc {

namespace {
/// GiB, or MiB below one.
std::string gib(int64_t bytes) {
  if (bytes >= int64_t(1) << 30)
    return fmt::format("{:.1f} GiB", double(bytes) / double(int64_t(1) << 30));
  return fmt::format("{:.2f} MiB", double(bytes) / double(int64_t(1) << 20));
}
/// Whether the executor will find cuDNN to run the attention on `device` (cuDNN's flash
/// attention needs compute capability 8.0): only on a machine with that GPU, so that what tgc
/// compile plans does not depend on the machine.
bool cudnnRunsAttention(const Device &device, const TargetInfo &target) {
  if (device != Device::Cuda || device.computeCapability < 80 || cudnnTurnedOff() ||
      device.ordinal >= int(target.gpus.size()))
    return false;
  auto api = loadCudnn();
  if (!api) {
    llvm::consumeError(api.takeError());
    return false;
  }
  return true;
}

} // namespace

llvm::Expected<RecomputeChoice> chooseRecomputeLayers(int64_t layerCount, int64_t budgetBytes,
                                                      llvm::function_ref<llvm::Expected<int64_t>(int64_t)> planBytes) {
  RecomputeChoice choice;
  choice.budget = budgetBytes;
  auto plan = [&](int64_t layers) -> llvm::Expected<bool> {
    auto bytes = planBytes(layers);
    if (!bytes)
      return bytes.takeError();
    choice.tried.push_back({layers, *bytes});
    bool fits = *bytes <= budgetBytes;
    if (fits)
      choice.layers = layers, choice.bytes = *bytes;
    return fits;
  };
  for (int64_t first : {int64_t(0), int64_t(-1)}) { // none, then every layer and the head
    auto fits = plan(first);
    if (!fits)
      return fits.takeError();
    if (*fits)
      break;
    if (first == -1)
      return stringError(fmt::format("error: recompute: auto: the training program's GPU plan takes {} with every "
                                     "layer recomputed ({} with none), over the memory budget of {}: a smaller "
                                     "batch or a larger budget",
                                     gib(choice.tried[1].second), gib(choice.tried[0].second), gib(budgetBytes)));
  }
  if (choice.layers == 0)
    return choice;
  // The fewest leading layers that fit: none does not, every one and the head does (hi =
  // layers + 1 stands for that plan).
  int64_t lo = 0, hi = layerCount + 1;
  while (hi - lo > 1) {
    int64_t mid = (lo + hi) / 2;
    auto fits = plan(mid);
    if (!fits)
      return fits.takeError();
    if (*fits)
      hi = mid;
    else
      lo = mid;
  }
  return choice; // the last plan that fit, hi's (-1's, made first, where no count of layers fits)
}

llvm::Expected<int64_t> gpuTrainingPlanBytes(const ModelConfig &config, int64_t batch, const Device &device,
                                             int ranks, bool cudnnAttention) {
  auto graph = buildGPT(config, batch);
  if (!graph)
    return graph.takeError();
  PrecisionConfig precision;
  auto pipeline = devicePipeline(config, device, /*training=*/true, ranks, precision);
  if (!pipeline)
    return pipeline.takeError();
  if (auto err = pipeline->run(**graph))
    return std::move(err);
  LoweringOptions lowering;
  if (cudnnAttention) {
    // As the executor will plan it: cuDNN runs every attention it has a shape for (its few MiB
    // of workspace not counted), and what is stored in BF16 follows (Lowering.h).
    for (const Op *op : (*graph)->ops())
      if (cudnnAttentionShape(**graph, *op, lowering))
        lowering.cudnnAttention[op] = 0;
  }
  auto program = lowerToCuda(**graph, lowering);
  if (!program)
    return program.takeError();
  MemoryPlan plan = planMemory(**graph, *program);
  return plan.arenaBytes + plan.persistentBytes;
}

llvm::Expected<ModelConfig> resolveRecompute(const ModelConfig &config, int64_t batch, const Device &device, int ranks,
                                             std::string *note) {
  if (!config.train.recomputeAuto || device != Device::Cuda)
    return config;
  int64_t budget = int64_t(config.train.memoryBudgetGiB * double(int64_t(1) << 30));
  TargetInfo target = detectTarget();
  bool cudnnAttention = cudnnRunsAttention(device, target); // once for every plan
  if (budget <= 0) {
    if (device.ordinal >= int(target.gpus.size()))
      return stringError("error: recompute: auto needs the GPU's memory or a memory_budget (--memory-budget)");
    budget = int64_t(target.gpus[device.ordinal].memoryBytes) - kGpuReserveBytes;
  }
  auto choice = chooseRecomputeLayers(config.layers, budget, [&](int64_t layers) {
    ModelConfig trial = config;
    trial.train.recompute = layers != 0;
    trial.train.recomputeAuto = false;
    trial.train.recomputeLayers = layers;
    return gpuTrainingPlanBytes(trial, batch, device, ranks, cudnnAttention);
  });
  if (!choice)
    return choice.takeError();
  ModelConfig resolved = config;
  resolved.train.recompute = choice->layers != 0;
  resolved.train.recomputeAuto = false;
  resolved.train.recomputeLayers = choice->layers;
  if (note) {
    std::string tried;
    for (auto [layers, bytes] : choice->tried)
      tried += fmt::format("{}{}: {}", tried.empty() ? "" : ", ", layers < 0 ? "all" : std::to_string(layers), gib(bytes));
    std::string what = choice->layers < 0  ? std::string("every layer and the head")
                       : choice->layers == 0 ? std::string("no layer")
                                             : fmt::format("the first {} of {} layers", choice->layers, config.layers);
    *note = fmt::format("recompute: auto: {} recomputed, the plan {} of the budget's {} (plans by layers "
                        "recomputed: {})",
                        what, gib(choice->bytes), gib(budget), tried);
  }
  return resolved;
}

} // namespace tgc
