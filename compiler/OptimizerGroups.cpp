// The optimizer's program-level lowering: the per-parameter AdamW ops and the gradient norm's
// chain of sum_squares and adds, each as one group of launches over the contiguous parameter
// layout (ParameterLayout), with the arithmetic of the per-op kernels (KernelText.h).
#include "compiler/KernelText.h"

#include <algorithm>
#include <fmt/format.h>

namespace tgc {
namespace {

/// One launch for every AdamW op of the layout, over the contiguous parameters, gradients and
/// moments: the same elementwise arithmetic (the same bits), the weight decay chosen by offset.
/// It runs where the first of them ran; the others become Grouped. Nothing happens unless every
/// AdamW op is laid out, they share their settings and inputs, and only AdamW ops, assigns and
/// leaves lie between the first and the last.
void groupAdamW(const std::vector<Op *> &ops, CudaProgram &program,
                std::vector<std::string> &sources) {
  const ParameterLayout &layout = program.layout;
  std::vector<size_t> members;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i]->kind() == OpKind::AdamW)
      members.push_back(i);
  if (members.size() < 2 || members.size() != layout.updates.size())
    return;
  const Op &first = *ops[members.front()];
  double decay = 0;
  for (size_t i : members) {
    const Op &op = *ops[i];
    for (const char *attr : {"beta1", "beta2", "eps"})
      if (op.attrs().getFloat(attr) != first.attrs().getFloat(attr))
        return;
    for (unsigned k = 4; k < 7; ++k) // lr, clip, step
      if (op.operand(k) != first.operand(k))
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
  // The first tensor of each buffer: the parameter at offset 0, its gradient and moments.
  const Op *base = nullptr;
  for (size_t i : members)
    if (layout.params.lookup(ops[i]->operand(0)) == 0)
      base = ops[i];
  if (!base)
    return;
  int64_t count = layout.updatedBytes / 4, decayed = layout.decayedBytes / 4;
  std::string name = fmt::format("k{}_adamw_flat", members.front());
  std::string params = kAdamWParams;
  OpLowering grouped;
  grouped.launches.push_back({name, elementwiseBlocks(count), kThreads});
  grouped.arguments = {base->operand(0), base->operand(1), base->operand(2), base->operand(3),
                       first.operand(4), first.operand(5), first.operand(6),
                       base->operand(0), base->operand(2), base->operand(3)};
  grouped.label = "adamw (all parameters)";
  for (size_t i : members) {
    program.lowering[i] = OpLowering{};
    program.lowering[i].kind = OpLowering::Grouped;
    sources[i].clear();
  }
  program.lowering[members.front()] = std::move(grouped);
  sources[members.front()] =
      fmt::format("// AdamW for all {} parameters at once, over the contiguous parameters, gradients "
                  "and moments\n// ({} floats, padding included, which stays zero); the first {} "
                  "have weight decay.\nextern \"C\" __global__ void {}({}) {{\n{}}}\n\n",
                  members.size(), count, decayed, name, params,
                  adamwBody(first.attrs(), count, fmt::format("(i < {}LL ? {} : 0.0)", decayed, formatDouble(decay))));
}

/// The gradient norm, add(...add(sum_squares(g0), sum_squares(g1))..., sum_squares(gN)) over
/// laid-out gradients, as two launches where the final add ran: every gradient's block partial
/// sums in one, then in one block each gradient's sum and the float adds in order (the same
/// bits as the per-op kernels). The other ops of the chain become Grouped.
void groupGradientNorm(const std::vector<Op *> &ops, CudaProgram &program,
                       std::vector<std::string> &sources) {
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
    // Walk the chain back from the clip's operand.
    std::vector<const Op *> sums, adds;
    const Value *v = op->operand(0);
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
    bool laidOut = llvm::all_of(sums, [&](const Op *s) { return program.layout.grads.count(s->operand(0)); });
    if (!inner || !laidOut)
      continue;
    const Value *base = sums.front()->operand(0);
    for (const Op *s : sums)
      if (program.layout.grads.lookup(s->operand(0)) < program.layout.grads.lookup(base))
        base = s->operand(0);
    int64_t baseOffset = program.layout.grads.lookup(base) / 4, blocks = 0;
    std::string table;
    for (const Op *s : sums) {
      int64_t count = s->operand(0)->type().numElements(), b = sumSquaresBlocks(count);
      table += fmt::format("  {{{}, {}, {}, {}}}, // %{}\n", program.layout.grads.lookup(s->operand(0)) / 4 - baseOffset,
                           count, (count + b - 1) / b, blocks, s->operand(0)->name());
      blocks += b;
    }
    size_t at = index.lookup(adds.back());
    std::string name = fmt::format("k{}_grad_norm", at), params = "const float *grads, float *out, float *scratch";
    int64_t n = int64_t(sums.size());
    OpLowering grouped;
    grouped.launches = {{name, blocks, kThreads}, {name + "_1", 1, kThreads}};
    grouped.scratchFloats = {2 * blocks};
    grouped.arguments = {base, adds.back()->result()};
    grouped.label = "grad norm (all gradients)";
    for (const std::vector<const Op *> *list : {&sums, &adds})
      for (const Op *member : *list) {
        size_t i = index.lookup(member);
        program.lowering[i] = OpLowering{};
        program.lowering[i].kind = OpLowering::Grouped;
        sources[i].clear();
      }
    program.lowering[at] = std::move(grouped);
    sources[at] = fmt::format(
        "// The gradient norm's sum of squares over {0} gradients in the gradient buffer: {{offset, "
        "count,\n// floats per block, first block}} of each, in the order the adds take them.\n"
        "__device__ const int64 {1}_tensors[{0}][4] = {{\n{2}}};\n\n"
        "// Launch 0: each block sums the squares of a contiguous range of one gradient.\n"
        "extern \"C\" __global__ void {1}({3}) {{\n"
        "  __shared__ double shared[256];\n"
        "  double *partial = (double *)scratch;\n"
        "  int t = 0;\n"
        "  for (int lo = 1, hi = {0} - 1; lo <= hi;) {{ // the last tensor whose first block <= this one\n"
        "    int mid = (lo + hi) / 2;\n"
        "    if ({1}_tensors[mid][3] <= blockIdx.x) t = mid, lo = mid + 1; else hi = mid - 1;\n"
        "  }}\n"
        "  const float *x = grads + {1}_tensors[t][0];\n"
        "  int64 count = {1}_tensors[t][1], perBlock = {1}_tensors[t][2];\n"
        "  int64 begin = (blockIdx.x - {1}_tensors[t][3]) * perBlock, end = begin + perBlock < count ? begin + perBlock : count;\n"
        "  double sum = 0;\n"
        "  for (int64 i = begin + threadIdx.x; i < end; i += blockDim.x) sum += (double)x[i] * x[i];\n"
        "  sum = blockSum(sum, shared);\n"
        "  if (threadIdx.x == 0) partial[blockIdx.x] = sum;\n"
        "}}\n\n"
        "// Launch 1, one block: each gradient's sum of its partials, then the adds, in float.\n"
        "extern \"C\" __global__ void {1}_1({3}) {{\n"
        "  __shared__ double shared[256];\n"
        "  const double *partial = (const double *)scratch;\n"
        "  float total = 0.0f;\n"
        "  for (int t = 0; t < {0}; ++t) {{\n"
        "    int64 first = {1}_tensors[t][3], blocks = (t + 1 < {0} ? {1}_tensors[t + 1][3] : {4}LL) - first;\n"
        "    double sum = 0;\n"
        "    for (int64 i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[first + i];\n"
        "    sum = blockSum(sum, shared);\n"
        "    total = t == 0 ? (float)sum : total + (float)sum;\n"
        "  }}\n"
        "  if (threadIdx.x == 0) out[0] = total;\n"
        "}}\n\n",
        n, name, table, params, blocks);
  }
}

} // namespace

void groupOptimizer(const std::vector<Op *> &ops, CudaProgram &program, std::vector<std::string> &sources) {
  groupAdamW(ops, program, sources);
  groupGradientNorm(ops, program, sources);
}

} // namespace tgc
