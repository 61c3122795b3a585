#include "backends/cuda/Report.h"

#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryClasses.h"
#include "backends/cuda/lowering/Traffic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>

namespace tgc {

namespace {

/// A decode (or verify) step's bytes as lowering/Traffic.h counts them: those of its weights and
/// activations, and those of the KV caches' rows its attention reads, which grow with the
/// tokens cached. Their sum over the memory's rate is the step's floor.
void printStepTraffic(const Graph &graph, const CudaProgram &program, llvm::raw_ostream &os) {
  int64_t rows = 0; // every sequence's cache full
  for (const Op *op : graph.ops())
    if (op->kind() == OpKind::DecodeAttention)
      rows = op->operand(1)->type().dim(0) * op->operand(1)->type().dim(1);
  if (!rows)
    return;
  int64_t base = 0, full = 0;
  std::vector<Op *> ops = graph.ops();
  for (size_t i = 0; i < ops.size(); ++i) { // the ops the GPU launches (not leaves, aliases or assigns)
    if (!program.lowering[i].launchesWork())
      continue;
    base += opTraffic(program, *ops[i], 0);
    full += opTraffic(program, *ops[i], rows);
  }
  os << fmt::format("// a step moves {:.1f} MiB besides the caches' rows its attention reads, and {:.1f} KiB a token "
                    "cached in each sequence ({:.1f} MiB with every cache full)\n",
                    double(base) / (1 << 20), double(full - base) / rows / 1024, double(full) / (1 << 20));
}

} // namespace

void printGpuMemoryReport(const Graph &graph, llvm::raw_ostream &os) {
  if (auto lowered = lowerToCuda(graph)) {
    MemoryPlan plan = planMemory(graph, *lowered);
    const ParameterLayout &layout = lowered->layout;
    auto mib = [](int64_t bytes) { return double(bytes) / double(1 << 20); };
    os << fmt::format("// GPU memory plan: intermediates {:.1f} MiB in one arena ({:.1f} MiB "
                      "without reuse), parameters, gradients, state and inputs {:.1f} MiB\n",
                      mib(plan.arenaBytes), mib(plan.withoutReuseBytes),
                      mib(plan.persistentBytes));
    os << fmt::format("// contiguous buffers: parameters {:.1f} MiB ({} tensors), gradients "
                      "{:.1f} MiB, state {:.1f} MiB (AdamW's moments {:.1f} MiB)\n",
                      mib(layout.paramBytes), layout.params.size(), mib(layout.gradBytes),
                      mib(layout.stateBytes), mib(adamwMoments(graph, *lowered).bytes));
    printMemoryBreakdown(memoryBreakdown(graph, *lowered, plan), os, "// memory by class: ");
    os << "// (this plan has tgc's own attention kernels; where cuDNN runs the attention, what is stored "
          "in BF16 changes: `tgc bench` and `tgc train` print the plan the GPU runs)\n";
    for (const OpLowering &l : lowered->lowering)
      if (!l.label.empty())
        os << fmt::format("// grouped: {}, {} launch{}\n", l.label, l.launches.size(),
                          l.launches.size() == 1 ? "" : "es");
    int64_t bf16Values = 0, bf16Bytes = 0;
    for (const Value *v : lowered->bf16Stored)
      if (v->def()->kind() != OpKind::Reshape) {
        ++bf16Values;
        bf16Bytes += storedBytesOf(*lowered, v);
      }
    if (bf16Values)
      os << fmt::format("// {} values stored in BF16, as only BF16 GEMMs (or kernels that round them so) read them "
                        "({:.1f} MiB, half their fp32 size)\n",
                        bf16Values, mib(bf16Bytes));
    // What the GPU rounds beyond the program (CudaProgram::bf16Rounding), by the op's kind.
    std::map<std::string, int> rounding;
    for (const Op *op : lowered->bf16Rounding)
      ++rounding[op->name().str()];
    if (!rounding.empty()) {
      std::vector<std::string> kinds;
      for (const auto &[name, count] : rounding)
        kinds.push_back(fmt::format("{} {}", count, name));
      os << fmt::format("// BF16 outputs that round what the program keeps in fp32 (the GELU epilogues, the logits, "
                        "FP8 products' biases, h and fc1's output gradient, FP8 layers' norms, products only norms read): {}\n",
                        fmt::join(kinds, ", "));
    }
    std::vector<std::string> converted; // BF16 GEMM operands a conversion kernel rounds
    std::vector<Op *> loweredOps = graph.ops();
    for (size_t i = 0; i < loweredOps.size(); ++i)
      if (lowered->lowering[i].kind == OpLowering::Gemm && isBf16Gemm(*loweredOps[i]))
        for (unsigned k = 0; k < 2; ++k)
          if (!bf16Ready(*lowered, loweredOps[i]->operand(k)))
            converted.push_back("%" + loweredOps[i]->operand(k)->name());
    if (!converted.empty())
      os << fmt::format("// {} BF16 GEMM operands converted at the GEMM: {}\n",
                        converted.size(), fmt::join(converted, ", "));
    if (!plan.shadowOffsets.empty())
      os << fmt::format("// {} values with a BF16 copy their producer writes for the "
                        "BF16 GEMMs that read them\n",
                        plan.shadowOffsets.size());
    if (!lowered->inPlace.empty())
      os << fmt::format("// {} values written into the state they are assigned to "
                        "({:.1f} MiB neither in the arena nor copied)\n",
                        lowered->inPlace.size(), mib(plan.inPlaceBytes));
    printStepTraffic(graph, *lowered, os);
  } else {
    llvm::consumeError(lowered.takeError());
    os << "// GPU memory plan: this program has ops the GPU backend does not lower "
          "(compile with --arch or --emit-cuda for the GPU's program)\n";
  }
}

} // namespace tgc
