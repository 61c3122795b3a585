// The optimizer's program-level lowering: the per-parameter AdamW ops and the gradient norm's
// chain of sum_squares and adds, each as one group of launches over the contiguous parameter
// layout (ParameterLayout) or, for ZeRO's shards, over an address table, with the arithmetic
// of the per-op kernels (Emitter.h).
#include "backends/cuda/lowering/Emitter.h"
#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"

#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <fmt/format.h>

namespace tgc {

std::pair<int64_t, int64_t> weightsReadInBf16(const std::vector<Op *> &ops, const CudaProgram &program) {
  const ParameterLayout &layout = program.layout;
  int64_t begin = layout.paramBytes, end = 0;
  auto take = [&](const Value *v) {
    const Value *param = reshapeRoot(v);
    if (!layout.params.count(param))
      return;
    int64_t offset = layout.params.lookup(param), bytes = deviceBytesOf(param->type());
    begin = std::min(begin, offset);
    end = std::max(end, offset + (bytes + 511) / 512 * 512); // the layout's 512-byte alignment
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = *ops[i];
    const OpLowering &l = program.lowering[i];
    for (unsigned k : l.bf16Weights)
      take(op.operand(k));
    if (l.kind == OpLowering::Gemm && hasBf16Gemms(op.attrs())) // as the GEMM runner reads them
      for (unsigned k = 0; k < 2; ++k)
        take(op.operand(k));
    if (addsBf16Bias(program, op))
      take(op.operand(2));
  }
  return end > begin ? std::pair{begin, end} : std::pair<int64_t, int64_t>{0, 0};
}

namespace {

/// Ops `members` become Grouped: `grouped` runs in op `at`'s place, its kernels `texts`.
void install(const std::vector<size_t> &members, size_t at, OpLowering grouped, std::vector<KernelText> texts,
             CudaProgram &program, std::vector<std::vector<KernelText>> &kernels) {
  for (size_t i : members) {
    program.lowering[i] = OpLowering{};
    program.lowering[i].kind = OpLowering::Grouped;
    kernels[i].clear();
  }
  program.lowering[at] = std::move(grouped);
  kernels[at] = std::move(texts);
}

/// Whether AdamW op `op` has `first`'s betas and epsilon and reads its learning rate, clip and
/// step: one grouped launch can run both.
bool sameAdamWSettings(const Op &op, const Op &first) {
  for (const char *attr : {"beta1", "beta2", "eps"})
    if (op.attrs().getFloat(attr) != first.attrs().getFloat(attr))
      return false;
  for (unsigned k = 4; k < 7; ++k) // lr, clip, step
    if (op.operand(k) != first.operand(k))
      return false;
  return true;
}

/// One launch for every AdamW op of the layout, over the contiguous parameters, gradients and
/// moments: the same elementwise arithmetic (the same bits), the weight decay chosen by offset.
/// It runs where the first of them ran; the others become Grouped. Nothing happens unless every
/// AdamW op is laid out, they share their settings and inputs, and only AdamW ops, assigns and
/// leaves lie between the first and the last.
void groupAdamW(const std::vector<Op *> &ops, CudaProgram &program, std::vector<std::vector<KernelText>> &kernels) {
  const ParameterLayout &layout = program.layout;
  std::vector<size_t> members; // (those whose FP8 cast makes their update lead the layout: not these)
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i]->kind() == OpKind::AdamW && !program.adamwInCast.count(ops[i]))
      members.push_back(i);
  if (members.size() < 2 || members.size() + program.adamwInCast.size() != layout.updates.size())
    return;
  const Op &first = *ops[members.front()];
  double decay = 0;
  for (size_t i : members) {
    const Op &op = *ops[i];
    if (!sameAdamWSettings(op, first))
      return;
    double wd = op.attrs().getFloat("weight_decay").value_or(0);
    bool decayed = layout.params.lookup(op.operand(0)) < layout.decayedBytes;
    if (decayed ? (decay != 0 && wd != decay) || wd == 0 : wd != 0)
      return;
    if (decayed)
      decay = wd;
  }
  for (size_t i = members.front(); i <= members.back(); ++i)
    if (ops[i]->kind() != OpKind::AdamW && ops[i]->kind() != OpKind::Assign &&
        program.lowering[i].kind != OpLowering::Leaf)
      return;
  // The first tensor of each buffer: the parameter after the casts' (castBytes), its gradient
  // and moments.
  const Op *base = nullptr;
  for (size_t i : members)
    if (layout.params.lookup(ops[i]->operand(0)) == layout.castBytes)
      base = ops[i];
  if (!base)
    return;
  int64_t count = (layout.updatedBytes - layout.castBytes) / 4, decayed = (layout.decayedBytes - layout.castBytes) / 4;
  std::string name = fmt::format("k{}_adamw_flat", members.front());
  OpLowering grouped;
  grouped.launches.push_back({name, elementwiseBlocks(count), kThreads});
  grouped.arguments = {base->operand(0), base->operand(1), base->operand(2), base->operand(3),
                       first.operand(4), first.operand(5), first.operand(6),
                       base->operand(0), base->operand(2), base->operand(3)};
  grouped.label = "adamw (all parameters)";
  // Where the next step reads most of the parameters in BF16, the update writes their whole
  // copy (two bytes more an element here, six fewer than converting them at the step's start);
  // a few (an FP8 program's biases) are converted at the step's start instead.
  int64_t read = program.weightCopyEnd - program.weightCopyBegin;
  bool copy = read > 0 && 2 * read >= layout.updatedBytes;
  if (copy) {
    grouped.weightCopyArgument = 7; // newParam
    program.optimizerWritesWeightCopy = true;
    program.weightCopyBegin = 0;
    program.weightCopyEnd = layout.paramBytes;
  }
  std::string comment = fmt::format("// AdamW for all {} parameters at once, over the contiguous parameters, gradients "
                                    "and moments\n// ({} floats, padding included, which stays zero); the first {} "
                                    "have weight decay.",
                                    members.size(), count, decayed);
  if (copy)
    comment += " It writes their BF16 copy too.";
  install(members, members.front(), std::move(grouped),
          {{comment, name, copy ? kAdamWCopyParams : kAdamWParams, adamwCall(first.attrs(), count, decayed, decay) + ";"}},
          program, kernels);
}

/// ZeRO's AdamW ops, each over its rank's shard of a parameter (in the arena, apart): one
/// launch over all of them where the last ran, each tensor found in an address table
/// (OpLowering::addresses: parameter shard, gradient shard, moments, new shard), with the per-op
/// arithmetic (the same bits). Nothing happens unless they share their settings and inputs,
/// their moments are updated in place, and nothing but assigns reads their results before the
/// last of them. Returns the ops grouped.
llvm::DenseSet<const Op *> groupShardedAdamW(const std::vector<Op *> &ops, CudaProgram &program,
                                             std::vector<std::vector<KernelText>> &kernels) {
  std::vector<size_t> members;
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i) {
    index[ops[i]] = i;
    const Op &op = *ops[i];
    // (Not one whose FP8 cast makes its update, AdamWCast.cpp.)
    const Op *target = op.kind() == OpKind::AdamW && !program.adamwInCast.count(&op) ? op.operand(0)->def() : nullptr;
    // (A shard op's result, or a parameter kept as its shard: an FP8 weight, ShardedFp8Weights.h.)
    if (target && (target->kind() == OpKind::Shard || shardedParamWhole(*target)))
      members.push_back(i);
  }
  if (members.size() < 2)
    return {};
  const Op &first = *ops[members.front()];
  const size_t last = members.back();
  double decay = 0;
  for (size_t i : members) {
    const Op &op = *ops[i];
    if (!sameAdamWSettings(op, first))
      return {};
    double wd = op.attrs().getFloat("weight_decay").value_or(0);
    if (wd != 0 && decay != 0 && wd != decay)
      return {};
    decay = wd != 0 ? wd : decay;
    if (program.inPlace.lookup(op.result(1)) != op.operand(2) || program.inPlace.lookup(op.result(2)) != op.operand(3))
      return {};
    for (const Op *user : op.result(0)->users())
      if (index.lookup(user) <= last)
        return {};
    for (unsigned r = 1; r < 3; ++r)
      for (const Op *user : op.result(r)->users())
        if (user->kind() != OpKind::Assign)
          return {};
  }
  constexpr int64_t kPerBlock = 4096;
  OpLowering grouped;
  int64_t blocks = 0;
  for (size_t i : members) {
    const Op &op = *ops[i];
    int64_t count = op.result(0)->type().numElements(), b = (count + kPerBlock - 1) / kPerBlock;
    bool decayed = op.attrs().getFloat("weight_decay").value_or(0) != 0;
    for (double field : {double(count), double(kPerBlock), decayed ? 1.0 : 0.0, double(blocks)})
      grouped.constants.push_back(field);
    blocks += b;
    for (const Value *v : {op.operand(0), op.operand(1), op.operand(2), op.operand(3), op.result(0)})
      grouped.addresses.push_back(v);
  }
  std::string name = fmt::format("k{}_adamw_shards", last);
  grouped.launches.push_back({name, blocks, kThreads});
  grouped.arguments = {first.operand(4), first.operand(5), first.operand(6)};
  grouped.label = "adamw (all shards)";
  const AttrMap &a = first.attrs();
  install(members, last, std::move(grouped),
          {{fmt::format("// AdamW for the rank's shards of all {} parameters at once, each found in the address table",
                       members.size()),
           name,
           "const float *lr, const float *clip, const int *step, const double *tensors, "
           "const unsigned long long *addresses",
           fmt::format("adamwTensors<{}>(lr, clip, step, tensors, addresses, {}, {}, {}, {});", members.size(),
                       formatDouble(*a.getFloat("beta1")), formatDouble(*a.getFloat("beta2")), lit(*a.getFloat("eps")),
                       formatDouble(decay))}},
          program, kernels);
  llvm::DenseSet<const Op *> updates;
  for (size_t i : members)
    updates.insert(ops[i]);
  return updates;
}

/// One launch for the shard ops `members` where the last of them ran, each tensor and its shard in
/// an address table, the per-op values (optimizer.cuh's shardTensors).
void installShards(const std::vector<Op *> &ops, const std::vector<size_t> &members, CudaProgram &program,
                   std::vector<std::vector<KernelText>> &kernels) {
  constexpr int64_t kShardPerBlock = 4096; // elements a block copies (at most)
  OpLowering grouped;
  int64_t blocks = 0;
  for (size_t i : members) {
    const Op &op = *ops[i];
    int64_t part = op.result()->type().numElements(), first = *op.attrs().getInt("rank") * part;
    for (int64_t field : {op.operand(0)->type().numElements(), part, first, blocks})
      grouped.constants.push_back(double(field));
    blocks += (part + kShardPerBlock - 1) / kShardPerBlock;
    grouped.addresses.push_back(op.operand(0));
    grouped.addresses.push_back(op.result());
  }
  const size_t last = members.back();
  const bool params = llvm::all_of(members, [&](size_t i) {
    const Op *def = ops[i]->operand(0)->def();
    return def && def->kind() == OpKind::Param;
  });
  std::string name = fmt::format("k{}_shards", last);
  grouped.launches.push_back({name, blocks, kThreads});
  grouped.label = params ? "shards (all parameters)" : "shards (gradients)";
  install(members, last, std::move(grouped),
          {{fmt::format("// The rank's shards of {} {} {} at once, each found in the address table",
                       params ? "all" : "the", members.size(), params ? "parameters" : "tensors"),
           // (The launch takes the last shard op's own operand and result first, unused.)
           name, "const float *x, float *out, const double *tensors, const unsigned long long *addresses",
           fmt::format("shardTensors<{}>(tensors, addresses);", members.size())}},
          program, kernels);
}

/// ZeRO's shard ops in runs, in program order, whose shards are read only after the run's last
/// op ran: by the grouped AdamW (`updates`, which runs after them all) or by ops after the run
/// (ZeRO-1's gradient shards, which the gradient norm reads before the parameters' shards are
/// taken); one launch a run of two or more (installShards).
void groupShards(const std::vector<Op *> &ops, const llvm::DenseSet<const Op *> &updates, CudaProgram &program,
                 std::vector<std::vector<KernelText>> &kernels) {
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i)
    index[ops[i]] = i;
  std::vector<std::vector<size_t>> runs(1);
  size_t firstReader = SIZE_MAX; // of the current run's shards, outside `updates`
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]->kind() != OpKind::Shard || program.lowering[i].kind != OpLowering::Kernels)
      continue;
    if (i > firstReader) { // a shard of the run is read before this op: the run ends before it
      runs.emplace_back();
      firstReader = SIZE_MAX;
    }
    runs.back().push_back(i);
    for (const Op *user : ops[i]->result()->users())
      if (!updates.count(user))
        firstReader = std::min(firstReader, index.lookup(user));
  }
  for (const std::vector<size_t> &run : runs)
    if (run.size() >= 2)
      installShards(ops, run, program, kernels);
}

/// The gradient norm, add(...add(sum_squares(g0), sum_squares(g1))..., sum_squares(gN)) over
/// laid-out gradients (or, through an address table, over gradients that lie apart: ZeRO's
/// shards, whose chain a scalar all_reduce ends before the clip), as two launches where the
/// final add ran: every gradient's block partial sums in one, then in one block each gradient's
/// sum and the float adds in order (the same bits as the per-op kernels). The other ops of the
/// chain become Grouped.
void groupGradientNorm(const std::vector<Op *> &ops, CudaProgram &program,
                       std::vector<std::vector<KernelText>> &kernels) {
  llvm::DenseMap<const Value *, int> uses;
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i) {
    index[ops[i]] = i;
    for (const Value *v : ops[i]->operands())
      ++uses[v];
  }
  auto onlyUse = [&](const Value *v) { return uses.lookup(v) == 1; };
  for (size_t last = 0; last < ops.size(); ++last) {
    const Op *op = ops[last];
    if (op->kind() != OpKind::ClipScale)
      continue;
    // Walk the chain back from the clip's operand (through ZeRO's all_reduce of the shards' sum).
    std::vector<const Op *> sums, adds;
    const Value *v = op->operand(0);
    if (v->def() && v->def()->kind() == OpKind::AllReduce && v->def()->numOperands() == 1 && v->type().rank() == 0 &&
        onlyUse(v->def()->operand(0)))
      v = v->def()->operand(0);
    while (v->def() && v->def()->kind() == OpKind::Add && v->type().rank() == 0) {
      const Op *add = v->def();
      const Op *right = add->operand(1)->def();
      if (!right || right->kind() != OpKind::SumSquares || !onlyUse(add->operand(1)) ||
          (!adds.empty() && !onlyUse(add->result()))) // an inner add: the next one reads it only
        break;
      adds.push_back(add);
      sums.push_back(right);
      v = add->operand(0);
    }
    if (!v->def() || v->def()->kind() != OpKind::SumSquares || !onlyUse(v) || adds.empty())
      continue;
    sums.push_back(v->def());
    std::reverse(sums.begin(), sums.end());
    std::reverse(adds.begin(), adds.end());
    bool inner = true; // every add but the last is read by the next add only
    for (size_t k = 0; k + 1 < adds.size(); ++k)
      inner &= onlyUse(adds[k]->result()) && adds[k + 1]->operand(0) == adds[k]->result();
    // Laid out: offsets into the gradient buffer; else each gradient in an address table.
    bool laidOut = llvm::all_of(sums, [&](const Op *s) { return program.layout.grads.count(s->operand(0)); });
    if (!inner)
      continue;
    const Value *base = sums.front()->operand(0);
    for (const Op *s : sums)
      if (laidOut && program.layout.grads.lookup(s->operand(0)) < program.layout.grads.lookup(base))
        base = s->operand(0);
    // Each gradient's {offset, count, elements per block, first block}, in the order the adds
    // take them: the kernels read it from the op's constants.
    int64_t baseOffset = laidOut ? program.layout.grads.lookup(base) / 4 : 0, blocks = 0;
    OpLowering grouped;
    for (const Op *s : sums) {
      int64_t count = s->operand(0)->type().numElements(), b = sumSquaresBlocks(count);
      int64_t offset = laidOut ? program.layout.grads.lookup(s->operand(0)) / 4 - baseOffset : 0;
      for (int64_t field : {offset, count, (count + b - 1) / b, blocks})
        grouped.constants.push_back(double(field));
      blocks += b;
      if (!laidOut)
        grouped.addresses.push_back(s->operand(0));
    }
    size_t at = index.lookup(adds.back());
    std::string name = fmt::format("k{}_grad_norm", at);
    const char *params = laidOut ? "const float *grads, float *out, float *scratch, const double *tensors"
                                 : "float *out, float *scratch, const double *tensors, const unsigned long long *grads";
    int64_t n = int64_t(sums.size());
    grouped.launches = {{name, blocks, kThreads}, {name + "_1", 1, kThreads}};
    grouped.scratchFloats = {2 * blocks};
    grouped.arguments = laidOut ? std::vector<const Value *>{base, adds.back()->result()}
                                : std::vector<const Value *>{adds.back()->result()};
    grouped.label = "grad norm (all gradients)";
    std::vector<size_t> members;
    for (const std::vector<const Op *> *list : {&sums, &adds})
      for (const Op *member : *list)
        members.push_back(index.lookup(member));
    std::string comment = fmt::format("// The gradient norm: the sums of squares of {} gradients {} and the adds of them",
                                      n, laidOut ? "in the gradient buffer" : "in the address table");
    install(members, at, std::move(grouped),
            {{comment + ": each block a range of one gradient", name, params,
              laidOut ? fmt::format("gradNormPartials<{}>(grads, scratch, tensors);", n)
                      : fmt::format("gradNormPartials<{}>(nullptr, scratch, tensors, grads);", n)},
             {comment + ": the gradients' partials, then the adds", name + "_1", params,
              fmt::format("gradNormTotal<{}, {}>(out, scratch, tensors);", n, blocks)}},
            program, kernels);
  }
}

} // namespace

void groupOptimizer(const std::vector<Op *> &ops, CudaProgram &program,
                    std::vector<std::vector<KernelText>> &kernels) {
  groupAdamW(ops, program, kernels);
  llvm::DenseSet<const Op *> shardUpdates = groupShardedAdamW(ops, program, kernels);
  groupShards(ops, shardUpdates, program, kernels); // the shards only those read
  castWithAdamW(ops, program, kernels); // after: it writes the BF16 copy where the group does
  groupGradientNorm(ops, program, kernels);
}

} // namespace tgc
