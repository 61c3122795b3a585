// AdamW writing the next step's FP8 weights: where precision.fp8_weights moved a weight's
// quantize after AdamW (transforms/precision/Fp8Weights.cpp), the quantize's launch makes the
// update itself (optimizer.cuh's QuantizeAdamW as fp8.cuh's quantizeBlocks's source): it reads
// the master weight, its gradient and moments once, writes them back and writes the FP8 bytes,
// their amax and saturation count from the same registers. Apart, AdamW wrote the master and
// the cast read it again: four bytes an element more a step (4.8 GB at gpt-1.3b). The AdamW op
// becomes Grouped, and the weight leads the parameter layout (ParameterLayout::castBytes), so
// that the grouped AdamW covers the others as one contiguous range. The same bits: the same
// per-element arithmetic (AdamWStep) and the same cast. The prologue (the FP8 weights made
// after initialisation or a resume) launches the cast with the clip scale 0, AdamW's skip: the
// master cast unchanged, as the plain cast would.
#include "backends/cuda/lowering/Emitter.h"
#include "backends/cuda/lowering/Lowering.h"

#include <fmt/format.h>

namespace tgc {

llvm::DenseMap<const Op *, const Op *> chooseAdamWInCast(const Graph &graph, const CudaProgram &program) {
  llvm::DenseMap<const Op *, const Op *> chosen;
  std::vector<Op *> ops = graph.ops();
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i)
    index[ops[i]] = i;
  for (const Op *quantize : ops) {
    if (quantize->kind() != OpKind::Quantize || quantize->numResults() != 3)
      continue;
    QuantizeOptions options = quantizeOptions(quantize->attrs());
    // The per-tensor casts of delayed scaling alone: a cast whose scale is its own amax reads
    // the whole tensor before it converts, and a block cast or a cast-transpose reads tiles.
    if (options.activation != QuantizeActivation::None || options.transpose || options.blockScaling ||
        options.currentScaling || options.biasGrad)
      continue;
    const Value *weight = quantize->operand(0);
    const Op *adamw = weight->def();
    if (!adamw || adamw->kind() != OpKind::AdamW || adamw->result(0) != weight || !adamw->operand(5)->def() ||
        adamw->operand(5)->def()->kind() != OpKind::ClipScale) // (the prologue writes it)
      continue;
    // Only the assign into the parameter reads the new weight besides the cast, and the cast
    // comes after the optimizer's other updates: nothing between reads what it writes.
    bool alone = llvm::all_of(weight->users(), [&](const Op *user) {
      return user == quantize || (user->kind() == OpKind::Assign && user->operand(1) == weight);
    });
    size_t at = index.lookup(quantize);
    if (!alone || program.lowering[at].kind != OpLowering::Kernels ||
        program.lowering[index.lookup(adamw)].kind != OpLowering::Kernels)
      continue;
    for (size_t k = index.lookup(adamw) + 1; k < at && alone; ++k)
      alone = ops[k]->kind() == OpKind::AdamW || ops[k]->kind() == OpKind::Assign ||
              ops[k]->kind() == OpKind::Quantize || program.lowering[k].kind == OpLowering::Leaf;
    if (alone)
      chosen[adamw] = quantize;
  }
  return chosen;
}

void castWithAdamW(const std::vector<Op *> &ops, CudaProgram &program, std::vector<std::vector<KernelText>> &kernels) {
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i)
    index[ops[i]] = i;
  for (auto [adamw, quantize] : program.adamwInCast) {
    size_t a = index.lookup(adamw), q = index.lookup(quantize);
    const AttrMap &attrs = adamw->attrs(), &cast = quantize->attrs();
    int64_t count = quantize->operand(0)->type().numElements();
    auto [blocks, perBlock] = castBlocks(count); // the plain cast's
    bool copy = program.optimizerWritesWeightCopy;
    OpLowering fused;
    fused.launches.push_back({fmt::format("k{}_adamw_cast", q), blocks, kThreads});
    for (unsigned k = 0; k < 7; ++k)
      fused.arguments.push_back(adamw->operand(k));
    for (unsigned r = 0; r < 3; ++r)
      fused.arguments.push_back(adamw->result(r));
    for (unsigned k = 1; k < 3; ++k) // scale, scale_inv
      fused.arguments.push_back(quantize->operand(k));
    for (unsigned r = 0; r < 3; ++r) // q, amax, saturations
      fused.arguments.push_back(quantize->result(r));
    if (copy)
      fused.weightCopyArgument = 7; // newParam
    fused.zeroInPrologue = adamw->operand(5); // the prologue's launch: the clip scale 0, no update
    fused.persistentFloats = program.lowering[q].persistentFloats; // the cast's totals, used[0] first
    fused.label = fmt::format("adamw + quantize %{}", quantize->result()->name());
    std::string params = fmt::format("{}, const float *scale, const float *scaleInv, unsigned char *q, float *amax, "
                                     "float *saturations, float *used",
                                     copy ? kAdamWCopyParams : kAdamWParams);
    std::string source = fmt::format(
        "quantizeAdamW(param, grad, m, v, lr, clip, step, newParam, newM, newV, {}, {}, {}, {})",
        formatDouble(*attrs.getFloat("beta1")), formatDouble(*attrs.getFloat("beta2")), lit(*attrs.getFloat("eps")),
        formatDouble(attrs.getFloat("weight_decay").value_or(0)));
    std::string call = fmt::format("quantizeBlocks<{}, {}, {}, {}, false>({}, scale, q, scaleInv, amax, saturations, "
                                   "used, {});",
                                   count, perBlock, blocks, fp8Interpretation(cast), source, lit(fp8Largest(cast)));
    std::string comment = fmt::format("// AdamW of %{} and the cast of its new weight to FP8 (the next step's), from "
                                      "one read of the weight, its gradient and moments",
                                      adamw->operand(0)->name());
    kernels[q] = {{comment, fused.launches[0].name, params, call}};
    program.lowering[q] = std::move(fused);
    program.lowering[a] = OpLowering{};
    program.lowering[a].kind = OpLowering::Grouped;
    kernels[a].clear();
  }
}

} // namespace tgc
