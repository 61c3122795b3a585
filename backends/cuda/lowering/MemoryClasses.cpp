#include "backends/cuda/lowering/MemoryClasses.h"

#include "backends/Prologue.h"
#include "ir/Attributes.h"

#include "llvm/ADT/DenseSet.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

namespace tgc {

namespace {

/// The ops the first output (a training program's loss) depends on: the forward.
llvm::DenseSet<const Op *> opsOfFirstOutput(const Graph &graph) {
  llvm::DenseSet<const Op *> seen;
  if (graph.outputs().empty())
    return seen;
  std::vector<const Op *> stack{graph.outputs().front()->def()};
  while (!stack.empty()) {
    const Op *op = stack.back();
    stack.pop_back();
    if (!op || !seen.insert(op).second)
      continue;
    for (const Value *operand : op->operands())
      stack.push_back(operand->def());
  }
  return seen;
}

bool isTraining(const Graph &graph) {
  return llvm::any_of(graph.ops(), [](const Op *op) { return op->kind() == OpKind::AdamW; });
}

/// The class of an arena span.
const char *arenaClass(const MemoryPlan::Span &span, const CudaProgram &program, bool training,
                       const llvm::DenseSet<const Op *> &forward) {
  if (!span.value)
    return "op workspace (GEMM operand copies, scratch)";
  if (span.shadow)
    return "BF16 copies of fp32 values";
  const Op *def = reshapeRoot(span.value)->def();
  if (def && def->kind() == OpKind::Quantize && isFp8(span.value->type().dtype)) {
    bool weight = isWeight(program, def->operand(0)), transposed = span.value->index() != 0;
    return weight ? (transposed ? "FP8 weight transposes" : "FP8 weights")
                  : (transposed ? "FP8 activation and gradient transposes" : "FP8 activations and gradients");
  }
  if (!training)
    return "activations";
  return forward.count(span.value->def()) ? "activations kept for the backward" : "gradients and backward temporaries";
}

} // namespace

// The moments of the parameters' layout take twice its updated bytes; a shard's moments lie in
// the state after them.
AdamWMoments adamwMoments(const Graph &graph, const CudaProgram &program) {
  const ParameterLayout &layout = program.layout;
  AdamWMoments m{2 * layout.updatedBytes, 1};
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::AdamW || llvm::is_contained(layout.updates, op))
      continue;
    for (unsigned k : {2u, 3u})
      if (layout.state.count(op->operand(k)))
        m.bytes += stateSpanOf(program, op->operand(k));
    if (const Op *shard = op->operand(0)->def(); shard && shard->kind() == OpKind::Shard)
      m.ranks = shard->attrs().getInt("ranks").value_or(1);
  }
  return m;
}

MemoryBreakdown memoryBreakdown(const Graph &graph, const CudaProgram &program, const MemoryPlan &plan) {
  MemoryBreakdown b;
  const ParameterLayout &layout = program.layout;
  AdamWMoments adamw = adamwMoments(graph, program);
  int64_t moments = adamw.bytes;
  int64_t fp8Weights = 0, fp8Transposes = 0;
  for (const auto &[leaf, offset] : layout.state) // the FP8 weights kept between steps (fp8-weights)
    if (isPrologueLeaf(*leaf->def()) && isFp8(leaf->type().dtype)) {
      const Op *quantize = quantizeOf(leaf);
      const Value *step = assignedValue(leaf); // (under ZeRO: the gathered codes, transposed)
      bool transposed = (quantize && isQuantizeTranspose(*quantize, leaf)) ||
                        (step && step->def() && step->def()->kind() == OpKind::Transpose);
      (transposed ? fp8Transposes : fp8Weights) += storedBytesOf(program, leaf);
    }
  b.persistent = {{"master weights (fp32)", layout.paramBytes},
                  {"gradients (fp32)", layout.gradBytes},
                  {adamw.ranks > 1 ? fmt::format("AdamW moments (this rank's 1/{} shard)", adamw.ranks) : "AdamW moments",
                   moments},
                  {"FP8 weights between steps", fp8Weights},
                  {"FP8 weight transposes between steps", fp8Transposes},
                  {"other state (FP8 scaling, caches)", layout.stateBytes - moments - fp8Weights - fp8Transposes},
                  {"inputs and kernel buffers",
                   plan.persistentBytes - layout.paramBytes - layout.gradBytes - layout.stateBytes}};
  b.arenaBytes = plan.arenaBytes;
  // Live bytes at each op: add at a span's first op, remove after its last.
  int64_t ops = int64_t(graph.ops().size());
  std::vector<int64_t> delta(size_t(ops) + 2, 0);
  for (const MemoryPlan::Span &s : plan.spans) {
    delta[size_t(s.first)] += s.bytes;
    delta[size_t(std::min(s.last, ops) + 1)] -= s.bytes;
  }
  int64_t live = 0;
  for (int64_t i = 0; i <= ops; ++i) {
    live += delta[size_t(i)];
    if (live > b.peakLiveBytes)
      b.peakLiveBytes = live, b.peakOp = i;
  }
  if (b.peakOp < 0)
    return b;
  if (b.peakOp < ops && graph.ops()[size_t(b.peakOp)]->numResults())
    b.peakOpName = graph.ops()[size_t(b.peakOp)]->result()->name();
  bool training = isTraining(graph);
  llvm::DenseSet<const Op *> forward = training ? opsOfFirstOutput(graph) : llvm::DenseSet<const Op *>{};
  std::map<std::string, int64_t> byClass;
  for (const MemoryPlan::Span &s : plan.spans)
    if (s.first <= b.peakOp && b.peakOp <= s.last)
      byClass[arenaClass(s, program, training, forward)] += s.bytes;
  for (auto &[name, bytes] : byClass)
    b.arena.push_back({name, bytes});
  return b;
}

void printMemoryBreakdown(const MemoryBreakdown &b, llvm::raw_ostream &os, llvm::StringRef indent) {
  auto mib = [](int64_t bytes) { return double(bytes) / double(1 << 20); };
  auto listed = [&](std::vector<MemoryClass> classes) {
    std::stable_sort(classes.begin(), classes.end(),
                     [](const MemoryClass &x, const MemoryClass &y) { return x.bytes > y.bytes; });
    std::vector<std::string> parts;
    for (const MemoryClass &c : classes)
      if (c.bytes)
        parts.push_back(fmt::format("{} {:.1f}", c.name, mib(c.bytes)));
    return fmt::format("{}", fmt::join(parts, ", "));
  };
  int64_t persistent = 0;
  for (const MemoryClass &c : b.persistent)
    persistent += c.bytes;
  os << fmt::format("{}persistent {:.1f} MiB: {}\n", indent, mib(persistent), listed(b.persistent));
  os << fmt::format("{}arena {:.1f} MiB, fullest at op {} (%{}), {:.1f} MiB live: {}\n", indent, mib(b.arenaBytes),
                    b.peakOp, b.peakOpName, mib(b.peakLiveBytes), listed(b.arena));
}

} // namespace tgc
