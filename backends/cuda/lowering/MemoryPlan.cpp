#include "backends/cuda/lowering/MemoryPlan.h"

#include "ir/Attributes.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>

namespace tgc {

namespace {
constexpr int64_t kAlignment = 256;
int64_t aligned(int64_t bytes, int64_t alignment = kAlignment) {
  return (std::max<int64_t>(bytes, 4) + alignment - 1) / alignment * alignment;
}
// Parameters start at multiples of 512 bytes, so that in the executor's BF16 copy of the
// parameter buffer (half the bytes) each starts at a multiple of 256, as cuBLASLt expects.
constexpr int64_t kParamAlignment = 512;
} // namespace

int64_t deviceBytesOf(const TensorType &t) { return t.numElements() * dtypeBytes(t.dtype); }

int64_t storedBytesOf(const CudaProgram &program, const Value *v) {
  return program.bf16Stored.count(v) ? v->type().numElements() * 2 : deviceBytesOf(v->type());
}

int64_t stateSpanOf(const CudaProgram &program, const Value *v) { return aligned(storedBytesOf(program, v)); }

std::vector<size_t> collectiveJoins(const std::vector<Op *> &ops, const CudaProgram &program) {
  std::vector<size_t> joins(ops.size(), ops.size());
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i)
    index[ops[i]] = i;
  std::vector<size_t> scatters;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (program.lowering[i].kind != OpLowering::Collective)
      continue;
    for (unsigned r = 0; r < ops[i]->numResults(); ++r)
      for (const Op *user : ops[i]->result(r)->users())
        joins[i] = std::min(joins[i], index.lookup(user));
    if (ops[i]->kind() == OpKind::ReduceScatter)
      scatters.push_back(i);
  }
  // A reduce-scatter's operands are a bucket of the rank's gradients in the arena: joined before
  // the reduce-scatter two buckets on (one more in flight meanwhile), they go then.
  for (size_t k = 0; k + 2 < scatters.size(); ++k)
    joins[scatters[k]] = std::min(joins[scatters[k]], scatters[k + 2]);
  return joins;
}

bool prefixOfGathered(const Op &op) {
  if (op.kind() != OpKind::Slice || op.attrs().getInt("start").value_or(-1) != 0)
    return false;
  const Value *gathered = op.operand(0);
  if (!gathered->def() || gathered->def()->kind() != OpKind::AllGather)
    return false;
  int64_t axis = op.attrs().getInt("axis").value_or(0), leading = 1;
  for (int64_t d = 0; d < axis; ++d)
    leading *= gathered->type().dim(d);
  return leading == 1 && op.result()->type().dtype == gathered->type().dtype;
}

bool isBf16Gemm(const Op &op) {
  return (op.kind() == OpKind::MatMul || op.kind() == OpKind::MatMulBias ||
          op.kind() == OpKind::MatMulBiasGelu || op.kind() == OpKind::MatMulDGelu) &&
         hasBf16Gemms(op.attrs());
}

const Value *reshapeRoot(const Value *v) {
  while (v->def() && v->def()->kind() == OpKind::Reshape)
    v = v->def()->operand(0);
  return v;
}

namespace {
/// What a state leaf holds between steps: the value assigned to it (the FP8 weights a quantize
/// after AdamW makes, fp8-weights), or the leaf itself where none is.
const Value *stepValueOf(const Value *v) {
  const Value *assigned = v->def() && v->def()->kind() == OpKind::State ? assignedValue(v) : nullptr;
  return assigned ? assigned : v;
}
} // namespace

const Op *quantizeOf(const Value *v) {
  // Through views, transposes, the state the step before left, and ZeRO's gather of a shard's
  // codes (ShardedFp8Weights.h: every rank's at the scale they share), to the quantize.
  for (int hops = 0; v->def() && hops < 8; ++hops) {
    const Op *def = v->def();
    if (def->kind() == OpKind::Reshape || def->kind() == OpKind::Transpose || prefixOfGathered(*def))
      v = def->operand(0);
    else if (def->kind() == OpKind::AllGather)
      v = def->operand(v->index());
    else if (def->kind() == OpKind::State && stepValueOf(v) != v) // bytes kept from the step before
      v = stepValueOf(v);
    else
      break;
  }
  const Op *def = v->def();
  return def && def->kind() == OpKind::Quantize ? def : nullptr;
}

bool isQuantizeTranspose(const Op &quantize, const Value *v) {
  while (v->def() && v->def()->kind() == OpKind::Reshape)
    v = v->def()->operand(0);
  return quantize.numResults() > 3 && stepValueOf(v) == quantize.result(3);
}

bool isWeight(const CudaProgram &program, const Value *v) {
  return program.layout.params.count(reshapeRoot(v));
}

bool bf16Ready(const CudaProgram &program, const Value *v) {
  return program.bf16Stored.count(v) || program.bf16Shadowed.count(v) || isWeight(program, v);
}

std::vector<int64_t> opLocalBytes(const Op &op, const CudaProgram &program, size_t index) {
  const OpLowering &lowering = program.lowering[index];
  std::vector<int64_t> bytes;
  for (int64_t floats : lowering.scratchFloats)
    bytes.push_back(floats * 4);
  if (lowering.kind == OpLowering::Gemm && isBf16Gemm(op))
    for (unsigned i = 0; i < 2; ++i)
      bytes.push_back(bf16Ready(program, op.operand(i)) ? 0 : op.operand(i)->type().numElements() * 2);
  return bytes;
}

namespace {
/// Where `assign` gives a parameter its gathered value through views (reshapes, a prefix slice):
/// the all_gather's result, read by that view alone. Else null.
const Value *gatheredInto(const Op &assign, const CudaProgram &program,
                          const llvm::DenseMap<const Op *, int64_t> &index) {
  const Value *leaf = assign.operand(0), *v = assign.operand(1);
  if (!leaf->def() || leaf->def()->kind() != OpKind::Param)
    return nullptr;
  while (v->def() && program.lowering[size_t(index.lookup(v->def()))].kind == OpLowering::Alias) {
    const Op *view = v->def();
    if (prefixOfGathered(*view))
      return view->operand(0)->users().size() == 1 ? view->operand(0) : nullptr;
    if (view->kind() != OpKind::Reshape || view->operand(0)->users().size() != 1)
      return nullptr;
    v = view->operand(0);
  }
  return nullptr;
}
} // namespace

llvm::DenseMap<const Value *, const Value *> inPlaceValues(const Graph &graph,
                                                           const CudaProgram &program) {
  std::vector<Op *> ops = graph.ops();
  // The leaf each value's memory is (a leaf itself, or a reshape of one), and the last op that
  // reads each leaf's memory other than as an assign's target.
  llvm::DenseMap<const Value *, const Value *> leafOf;
  llvm::DenseMap<const Value *, int64_t> lastRead;
  llvm::DenseMap<const Op *, int64_t> index;
  for (int64_t i = 0; i < int64_t(ops.size()); ++i) {
    const Op &op = *ops[i];
    index[&op] = i;
    const OpLowering &lowering = program.lowering[i];
    if (lowering.kind == OpLowering::Leaf)
      leafOf[op.result()] = op.result();
    else if (lowering.kind == OpLowering::Alias)
      if (const Value *leaf = leafOf.lookup(op.operand(0)))
        leafOf[op.result()] = leaf;
    for (unsigned p = 0; p < op.numOperands(); ++p)
      if (const Value *leaf = leafOf.lookup(op.operand(p)))
        if (!(op.kind() == OpKind::Assign && p == 0))
          lastRead[leaf] = i;
  }
  llvm::DenseMap<const Value *, unsigned> assigned; // how many leaves each value is assigned to
  for (const Op *op : ops)
    if (op->kind() == OpKind::Assign)
      ++assigned[op->operand(1)];
  llvm::DenseMap<const Value *, const Value *> inPlace;
  for (const Op *assign : ops) {
    if (assign->kind() != OpKind::Assign)
      continue;
    const Value *leaf = assign->operand(0), *value = assign->operand(1);
    const Op *def = value->def();
    if (!def || assigned.lookup(value) != 1)
      continue;
    if (const Value *gathered = gatheredInto(*assign, program, index)) {
      if (lastRead.lookup(leaf) <= index.lookup(gathered->def()))
        inPlace[gathered] = leaf;
      continue;
    }
    if (deviceBytesOf(leaf->type()) != deviceBytesOf(value->type()) ||
        program.lowering[index.lookup(def)].kind == OpLowering::Alias)
      continue;
    unsigned r = 0;
    while (def->result(r) != value)
      ++r;
    bool safe = lastRead.lookup(leaf) <= index.lookup(def);
    for (unsigned p = 0; p < def->numOperands() && safe; ++p)
      if (leafOf.lookup(def->operand(p)) == leaf)
        safe = int(p) == inPlaceOperand(def->kind(), r) && def->operand(p) == leaf;
    if (safe)
      inPlace[value] = leaf;
  }
  return inPlace;
}

namespace {
/// The operand all_reduce `op` reduces into its result `r` in place: one that only the all_reduce
/// reads, of the result's type and storage, not written in place into a leaf. Else null. (The
/// unsharded gradients so share the gradient buffer, rankGradient; other results, ZeRO-1's whole
/// gradients, the loss, the norm's sum, their operand's bytes in the arena.)
const Value *reducedInPlace(const Op &op, unsigned r, const CudaProgram &program) {
  if (op.kind() != OpKind::AllReduce)
    return nullptr;
  const Value *local = op.operand(r), *v = op.result(r);
  bool alone = local->users().size() == 1 && llvm::count(op.operands(), local) == 1;
  return alone && local->type() == v->type() && !program.inPlace.count(local) &&
                 program.bf16Stored.count(local) == program.bf16Stored.count(v)
             ? local
             : nullptr;
}

/// Where `g` is a result of an all_reduce (a gradient averaged over the ranks) whose operand
/// can share its memory in the gradient buffer: that operand, the rank's own gradient (written
/// by kernels or a GEMM, reducedInPlace's). Else null.
const Value *rankGradient(const Value *g, const CudaProgram &program, const llvm::DenseMap<const Op *, size_t> &index) {
  const Value *local = g->def() ? reducedInPlace(*g->def(), g->index(), program) : nullptr;
  if (!local || !local->def())
    return nullptr;
  OpLowering::Kind kind = program.lowering[index.lookup(local->def())].kind;
  return kind == OpLowering::Kernels || kind == OpLowering::Gemm ? local : nullptr;
}
} // namespace

ParameterLayout layoutParameters(const Graph &graph, const CudaProgram &program) {
  ParameterLayout layout;
  std::vector<Op *> ops = graph.ops();
  llvm::DenseMap<const Op *, size_t> index;
  llvm::DenseMap<const Value *, int> adamwReads; // how many AdamW ops read each gradient
  for (size_t i = 0; i < ops.size(); ++i) {
    index[ops[i]] = i;
    if (ops[i]->kind() == OpKind::AdamW)
      ++adamwReads[ops[i]->operand(1)];
  }
  auto leafOf = [](const Value *v, OpKind kind) { return v->def() && v->def()->kind() == kind; };
  llvm::DenseMap<const Value *, const Op *> updateOf; // parameter -> the AdamW op laid out with it
  for (const Op *op : ops) {
    if (op->kind() != OpKind::AdamW)
      continue;
    const Value *p = op->operand(0), *g = op->operand(1), *m = op->operand(2), *v = op->operand(3);
    OpLowering::Kind gradKind = g->def() ? program.lowering[index.lookup(g->def())].kind : OpLowering::Leaf;
    // A gradient averaged over the ranks: reduced in place, where the backward wrote the rank's.
    if (const Value *local = rankGradient(g, program, index))
      gradKind = program.lowering[index.lookup(local->def())].kind;
    else if (gradKind == OpLowering::Collective)
      gradKind = OpLowering::Leaf; // not laid out
    // (A parameter kept as its ZeRO shard, ShardedFp8Weights.h, is not: its gradient is a shard
    // op's, alive in the arena from the backward's gradient to AdamW, as the other shards'.)
    bool usual = leafOf(p, OpKind::Param) && !shardedParamWhole(*p->def()) && leafOf(m, OpKind::State) &&
                 leafOf(v, OpKind::State) &&
                 !updateOf.count(p) && program.inPlace.lookup(op->result(0)) == p &&
                 program.inPlace.lookup(op->result(1)) == m && program.inPlace.lookup(op->result(2)) == v &&
                 (gradKind == OpLowering::Kernels || gradKind == OpLowering::Gemm) &&
                 !program.inPlace.count(g) && adamwReads.lookup(g) == 1 &&
                 p->type().dtype == DType::F32 && g->type() == p->type() && m->type() == p->type() &&
                 v->type() == p->type();
    if (usual)
      updateOf[p] = op;
  }
  // The bytes each parameter's slot holds: its own, or what is gathered into it (ZeRO: the
  // ranks' parts, zeros past its end).
  llvm::DenseMap<const Value *, int64_t> slotBytes;
  for (auto [value, leaf] : program.inPlace)
    if (leaf->def() && leaf->def()->kind() == OpKind::Param)
      slotBytes[leaf] = std::max(slotBytes.lookup(leaf), deviceBytesOf(value->type()));
  // Parameters: AdamW's in an FP8 cast, AdamW's with weight decay, AdamW's without, then the
  // rest, each in program order.
  for (int group = -1; group < 3; ++group) {
    for (const Op *op : ops) {
      if (op->kind() != OpKind::Param)
        continue;
      const Op *update = updateOf.lookup(op->result());
      bool decayed = update && update->attrs().getFloat("weight_decay").value_or(0) != 0;
      bool cast = update && program.adamwInCast.count(update);
      if (group != (!update ? 2 : cast ? -1 : decayed ? 0 : 1))
        continue;
      layout.params[op->result()] = layout.paramBytes;
      int64_t bytes = std::max(deviceBytesOf(op->result()->type()), slotBytes.lookup(op->result()));
      layout.paramBytes += aligned(bytes, kParamAlignment);
    }
    if (group == -1)
      layout.castBytes = layout.paramBytes;
    if (group == 0)
      layout.decayedBytes = layout.paramBytes;
    if (group == 1)
      layout.updatedBytes = layout.paramBytes;
  }
  for (const Op *op : ops)
    if (const Op *update = op->kind() == OpKind::Param ? updateOf.lookup(op->result()) : nullptr) {
      int64_t offset = layout.params.lookup(op->result());
      layout.updates.push_back(update);
      layout.grads[update->operand(1)] = offset;
      if (const Value *local = rankGradient(update->operand(1), program, index))
        layout.grads[local] = offset;
      layout.state[update->operand(2)] = offset;
      layout.state[update->operand(3)] = layout.updatedBytes + offset;
    }
  llvm::sort(layout.updates, [&](const Op *a, const Op *b) { return index.lookup(a) < index.lookup(b); });
  layout.gradBytes = layout.updatedBytes;
  layout.stateBytes = 2 * layout.updatedBytes;
  for (const Op *op : ops)
    if (op->kind() == OpKind::State && !layout.state.count(op->result())) {
      layout.state[op->result()] = layout.stateBytes;
      layout.stateBytes += stateSpanOf(program, op->result()); // a BF16 KV cache: half
    }
  return layout;
}

namespace {

/// Something placed in the arena: a value, its BF16 copy, or an op-local buffer alive during
/// its op only.
struct Item {
  int64_t bytes, first, last;
  const Value *value; // nullptr for an op-local buffer
  size_t op, local;
  bool shadow = false; // the BF16 copy of `value`
};

/// Each of `items` at an offset of the arena, into `plan`: largest first, each at the lowest
/// offset that overlaps no placed item alive at once.
void placeItems(std::vector<Item> &items, MemoryPlan &plan) {
  std::stable_sort(items.begin(), items.end(),
                   [](const Item &a, const Item &b) { return a.bytes > b.bytes; });
  std::vector<std::pair<const Item *, int64_t>> placed;
  for (const Item &item : items) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (auto &[p, offset] : placed)
      if (p->first <= item.last && item.first <= p->last)
        busy.push_back({offset, offset + p->bytes});
    std::sort(busy.begin(), busy.end());
    int64_t offset = 0;
    for (auto [b, e] : busy) {
      if (offset + item.bytes <= b)
        break;
      offset = std::max(offset, e);
    }
    if (item.shadow)
      plan.shadowOffsets[item.value] = offset;
    else if (item.value)
      plan.offsets[item.value] = offset;
    else
      plan.opLocalOffsets[item.op][item.local] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + item.bytes);
    plan.spans.push_back({item.value, item.shadow, item.bytes, item.first, item.last});
    placed.push_back({&item, offset});
  }
}

/// A collective runs on its own stream from its place until the main stream joins it
/// (collectiveJoins): NCCL reads its operands and writes its results until then.
void extendCollectiveLives(const std::vector<Op *> &ops, const CudaProgram &program,
                           const llvm::DenseMap<const Value *, const Value *> &owner,
                           llvm::DenseMap<const Value *, std::pair<int64_t, int64_t>> &life) {
  std::vector<size_t> joins = collectiveJoins(ops, program);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (program.lowering[i].kind != OpLowering::Collective)
      continue;
    int64_t last = int64_t(joins[i]); // (ops.size(): the step's end)
    for (const Value *v : ops[i]->operands())
      if (const Value *o = owner.lookup(v))
        life[o].second = std::max(life[o].second, last);
    for (unsigned r = 0; r < ops[i]->numResults(); ++r)
      if (const Value *o = owner.lookup(ops[i]->result(r)))
        life[o].second = std::max(life[o].second, last);
  }
}

} // namespace

MemoryPlan planMemory(const Graph &graph, const CudaProgram &program) {
  MemoryPlan plan;
  const ParameterLayout &layout = program.layout;
  plan.persistentBytes = layout.paramBytes + layout.gradBytes + layout.stateBytes;
  std::vector<Op *> ops = graph.ops();
  int64_t end = int64_t(ops.size());
  // The value whose memory each value uses (itself, or an alias's source).
  llvm::DenseMap<const Value *, const Value *> owner;
  llvm::DenseMap<const Value *, std::pair<int64_t, int64_t>> life; // [first, last] op index
  std::vector<const Value *> planned;
  for (int64_t i = 0; i < end; ++i) {
    const Op &op = *ops[i];
    const OpLowering &lowering = program.lowering[i];
    for (int64_t floats : lowering.persistentFloats)
      plan.persistentBytes += aligned(floats * 4);
    if (!lowering.constants.empty())
      plan.persistentBytes += aligned(int64_t(lowering.constants.size() * sizeof(double)));
    if (!lowering.addresses.empty())
      plan.persistentBytes += aligned(int64_t(lowering.addresses.size() * sizeof(uint64_t)));
    for (unsigned r = 0; r < op.numResults(); ++r) {
      const Value *v = op.result(r);
      if (lowering.kind == OpLowering::Leaf) {
        if (op.kind() == OpKind::Input) // parameters and state are in the layout's buffers
          plan.persistentBytes += aligned(deviceBytesOf(v->type()));
        continue;
      }
      if (program.inPlace.count(v)) { // in its leaf's buffer, as are its aliases
        plan.inPlaceBytes += aligned(deviceBytesOf(v->type()));
        continue;
      }
      if (layout.grads.count(v)) // in the gradient buffer, as are its aliases
        continue;
      if (const Value *qkv = program.qkvRows.lookup(v)) { // an attention's q, k, v: qkv's memory
        owner[v] = owner.lookup(qkv);
        continue;
      }
      if (const Value *local = reducedInPlace(op, r, program)) { // an all_reduce into its operand
        if (const Value *o = owner.lookup(local)) {
          owner[v] = o;
          continue;
        }
      }
      owner[v] = lowering.kind == OpLowering::Alias ? owner.lookup(op.operand(0)) : v;
      if (lowering.kind == OpLowering::Alias && !owner[v]) // an alias of a leaf
        owner.erase(v);
      if (lowering.kind != OpLowering::Alias) {
        life[v] = {i, i};
        planned.push_back(v);
        plan.withoutReuseBytes += aligned(storedBytesOf(program, v));
      }
    }
    for (const Value *v : op.operands())
      if (const Value *o = owner.lookup(v))
        life[o].second = std::max(life[o].second, i);
    // A launch that takes other ops' values (a grouped launch, AdamW in a cast; through an
    // address table, one over tensors that lie apart) reads and writes them here.
    for (const auto *values : {&program.lowering[i].arguments, &program.lowering[i].addresses})
      for (const Value *v : *values)
        if (const Value *o = owner.lookup(v))
          life[o].second = std::max(life[o].second, i);
    if (op.kind() == OpKind::Assign) // copied when the step ends
      if (const Value *o = owner.lookup(op.operand(1)))
        life[o].second = end;
  }
  for (const Value *out : graph.outputs())
    if (const Value *o = owner.lookup(out))
      life[o].second = end;
  extendCollectiveLives(ops, program, owner, life);
  std::vector<Item> items;
  for (const Value *v : planned)
    items.push_back({aligned(storedBytesOf(program, v)), life[v].first, life[v].second, v, 0, 0});
  // BF16 copies: from the producer to the last BF16 GEMM that reads the value.
  llvm::DenseMap<const Value *, std::pair<int64_t, int64_t>> shadowLife;
  for (int64_t i = 0; i < end; ++i)
    for (unsigned k = 0; k < std::min(2u, ops[i]->numOperands()); ++k)
      if (program.lowering[i].kind == OpLowering::Gemm && program.bf16Shadowed.count(ops[i]->operand(k))) {
        const Value *root = reshapeRoot(ops[i]->operand(k));
        auto &span = shadowLife[root];
        span.second = std::max(span.second, i);
      }
  // cuDNN's attention writes its BF16 results into their copies, which it may be alone to read.
  for (int64_t i = 0; i < end; ++i)
    if (program.lowering[i].cudnnAttention)
      for (unsigned r = 0; r < ops[i]->numResults(); ++r)
        if (program.bf16Shadowed.count(ops[i]->result(r))) {
          auto &span = shadowLife[ops[i]->result(r)];
          span.second = std::max(span.second, i);
        }
  std::vector<const Value *> shadows;
  for (int64_t i = 0; i < end; ++i)
    for (unsigned r = 0; r < ops[i]->numResults(); ++r)
      if (shadowLife.count(ops[i]->result(r))) {
        shadowLife[ops[i]->result(r)].first = i;
        shadows.push_back(ops[i]->result(r));
      }
  std::vector<Item> shadowItems;
  for (const Value *v : shadows) {
    int64_t bytes = aligned(v->type().numElements() * 2);
    plan.withoutReuseBytes += bytes;
    shadowItems.push_back({bytes, shadowLife[v].first, shadowLife[v].second, v, 0, 0, true});
  }
  plan.opLocalOffsets.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<int64_t> local = opLocalBytes(*ops[i], program, i);
    plan.opLocalOffsets[i].resize(local.size());
    for (size_t k = 0; k < local.size(); ++k) {
      items.push_back({aligned(local[k]), int64_t(i), int64_t(i), nullptr, i, k});
      plan.withoutReuseBytes += aligned(local[k]);
    }
  }
  items.insert(items.end(), shadowItems.begin(), shadowItems.end());
  placeItems(items, plan);
  // Aliases point into their source's memory.
  for (auto &[v, o] : owner)
    if (v != o)
      plan.offsets[v] = plan.offsets.lookup(o);
  return plan;
}

} // namespace tgc
