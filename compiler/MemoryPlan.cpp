#include "compiler/MemoryPlan.h"

#include <algorithm>

namespace tgc {

namespace {
constexpr int64_t kAlignment = 256;
int64_t aligned(int64_t bytes) { return (std::max<int64_t>(bytes, 4) + kAlignment - 1) / kAlignment * kAlignment; }
int64_t bytesOf(const TensorType &t) { return t.numElements() * 4; }
} // namespace

MemoryPlan planMemory(const Graph &graph, const CudaProgram &program) {
  MemoryPlan plan;
  std::vector<Op *> ops = graph.ops();
  int64_t end = int64_t(ops.size());
  // The value whose memory each value uses (itself, or an alias's source).
  llvm::DenseMap<const Value *, const Value *> owner;
  llvm::DenseMap<const Value *, std::pair<int64_t, int64_t>> life; // [first, last] op index
  std::vector<const Value *> planned;
  for (int64_t i = 0; i < end; ++i) {
    const Op &op = *ops[i];
    const OpLowering &lowering = program.lowering[i];
    for (unsigned r = 0; r < op.numResults(); ++r) {
      const Value *v = op.result(r);
      if (lowering.kind == OpLowering::Leaf) {
        plan.persistentBytes += aligned(bytesOf(v->type()));
        continue;
      }
      owner[v] = lowering.kind == OpLowering::Alias ? owner.lookup(op.operand(0)) : v;
      if (lowering.kind == OpLowering::Alias && !owner[v]) // an alias of a leaf
        owner.erase(v);
      if (lowering.kind != OpLowering::Alias) {
        life[v] = {i, i};
        planned.push_back(v);
        plan.withoutReuseBytes += aligned(bytesOf(v->type()));
      }
    }
    for (const Value *v : op.operands())
      if (const Value *o = owner.lookup(v))
        life[o].second = std::max(life[o].second, i);
    if (op.kind() == OpKind::Assign) // copied when the step ends
      if (const Value *o = owner.lookup(op.operand(1)))
        life[o].second = end;
  }
  for (const Value *out : graph.outputs())
    if (const Value *o = owner.lookup(out))
      life[o].second = end;
  // Largest first, each at the lowest offset that overlaps no placed value alive at once.
  std::stable_sort(planned.begin(), planned.end(), [](const Value *a, const Value *b) {
    return bytesOf(a->type()) > bytesOf(b->type());
  });
  std::vector<const Value *> placed;
  for (const Value *v : planned) {
    int64_t size = aligned(bytesOf(v->type()));
    auto [first, last] = life[v];
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Value *p : placed) {
      auto [pf, pl] = life[p];
      if (pf <= last && first <= pl)
        busy.push_back({plan.offsets[p], plan.offsets[p] + aligned(bytesOf(p->type()))});
    }
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [b, e] : busy) {
      if (offset + size <= b)
        break;
      offset = std::max(offset, e);
    }
    plan.offsets[v] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + size);
    placed.push_back(v);
  }
  // Aliases point into their source's memory.
  for (auto &[v, o] : owner)
    if (v != o)
      plan.offsets[v] = plan.offsets.lookup(o);
  return plan;
}

} // namespace tgc
