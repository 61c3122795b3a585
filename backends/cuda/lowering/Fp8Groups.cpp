// The delayed-scaling updates of a step as a few launches: each fp8_update is one block of work
// (its amax history rolled, its scale from the window), and a training step has one for every
// quantized tensor (144 on gpt2-124m). One launch takes up to kUpdatesPerLaunch of them, a
// block each, with the arithmetic of the per-op kernel (the same bits).
#include "backends/cuda/lowering/Emitter.h"
#include "backends/cuda/lowering/Lowering.h"

#include <fmt/format.h>

namespace tgc {
namespace {

// Nine pointers a member (ten under block scaling): 48 members are at most 3840 bytes of kernel
// parameters, inside the 4 KB every GPU and CUDA version takes.
constexpr size_t kUpdatesPerLaunch = 48;
constexpr const char *kUpdateParams[] = {"history", "scale", "amax", "saturations", "saturated",
                                         "newHistory", "newScale", "newScaleInv", "newSaturations"};

/// Whether every result of `op` is written into the state it is assigned to: then a member's
/// writes touch no arena memory another member of its launch could still be reading.
bool writesState(const Op &op, const CudaProgram &program) {
  for (unsigned r = 0; r < op.numResults(); ++r)
    if (!program.inPlace.count(op.result(r)))
      return false;
  return true;
}

/// One launch for `members` (indices of fp8_update ops in program order), run where the last
/// of them ran: by then every member's operands are made (an all_reduce's amax joined), and
/// between the first and the last only other updates, assigns and leaves ran, so nothing read
/// the state they write or reused the arena values they read. The others become Grouped.
void groupLaunch(const std::vector<Op *> &ops, const std::vector<size_t> &members, CudaProgram &program,
                 std::vector<std::vector<KernelText>> &kernels) {
  size_t at = members.back();
  std::string name = fmt::format("k{}_fp8_update_group", at), params, cases;
  OpLowering grouped;
  for (size_t m = 0; m < members.size(); ++m) {
    const Op &op = *ops[members[m]];
    for (const Value *v : op.operands())
      grouped.arguments.push_back(v);
    for (unsigned r = 0; r < op.numResults(); ++r)
      grouped.arguments.push_back(op.result(r));
    params += (m ? ", " : "") + fp8UpdateParams(op, std::to_string(m));
    cases += fmt::format("\n    case {}: {}; break;", m, fp8UpdateCall(op, std::to_string(m)));
  }
  grouped.launches.push_back({name, int64_t(members.size()), 256}); // fp8.cuh's kFp8UpdateThreads
  grouped.label = "fp8_update (grouped)";
  std::string comment = fmt::format("// The delayed-scaling updates of {} quantized tensors, a block each (%{} ...)",
                                    members.size(), ops[members.front()]->result()->name());
  for (size_t i : members) {
    program.lowering[i] = OpLowering{};
    program.lowering[i].kind = OpLowering::Grouped;
    kernels[i].clear();
  }
  program.lowering[at] = std::move(grouped);
  KernelText text{comment, name, params, fmt::format("switch (blockIdx.x) {{{}\n  }}", cases), 256};
  kernels[at] = {text};
}

/// Whether `op` (an fp8_update) passes on a block-scaled quantize's largest block scale: a
/// tenth pointer, its fifth result.
bool passesBlockScale(const Op &op) { return op.numResults() > 4; }

} // namespace

std::string fp8UpdateParams(const Op &op, const std::string &suffix) {
  std::string params;
  for (size_t p = 0; p < std::size(kUpdateParams); ++p)
    params += fmt::format("{}{} *{}{}", p ? ", " : "", p < 5 ? "const float" : "float", kUpdateParams[p], suffix);
  if (passesBlockScale(op))
    params += fmt::format(", float *newLargestBlockScale{}", suffix);
  return params;
}

std::string fp8UpdateCall(const Op &op, const std::string &suffix) {
  const AttrMap &a = op.attrs();
  std::string args;
  for (const char *p : kUpdateParams)
    args += fmt::format("{}{}, ", p, suffix);
  return fmt::format("fp8Update<{}, {}>({}{}, {}{})", op.operand(0)->type().numElements(),
                     boolText(a.getString("algo") != "most_recent"), args, lit(fp8Largest(a)), fp8MarginScale(a),
                     passesBlockScale(op) ? ", newLargestBlockScale" + suffix : "");
}

void groupFp8Updates(const std::vector<Op *> &ops, CudaProgram &program,
                     std::vector<std::vector<KernelText>> &kernels) {
  std::vector<size_t> run;
  auto flush = [&] {
    for (size_t begin = 0; begin < run.size(); begin += kUpdatesPerLaunch) {
      std::vector<size_t> chunk(run.begin() + begin, run.begin() + std::min(run.size(), begin + kUpdatesPerLaunch));
      if (chunk.size() > 1)
        groupLaunch(ops, chunk, program, kernels);
    }
    run.clear();
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    OpLowering::Kind kind = program.lowering[i].kind;
    bool update = ops[i]->kind() == OpKind::Fp8Update && kind == OpLowering::Kernels && writesState(*ops[i], program);
    if (update)
      run.push_back(i);
    else if (kind != OpLowering::Assign && kind != OpLowering::Leaf)
      flush();
  }
  flush();
}

} // namespace tgc
