// requantize-transposes: a forward cast-transpose (quantize {transpose=true}) writes q for the
// forward's FP8 product and q_t for the backward's wgrad or dgrad, and q_t then waits through
// the rest of the forward: at the loss every layer's q_t is alive (fc2's input alone is 4 bytes
// an element of the hidden width a token, a layer). Where the quantize's input is kept for the
// backward anyway (a weight; the attention's output, which its gradient reads; fc1's output,
// which the GELU's or SwiGLU's gradient reads) this pass has the forward's quantize write q
// alone and makes q_t again in the backward, before its first reader, by the same quantize of
// the same operands: the same scale (the state's, unchanged until the step ends; under current
// scaling the amax of the same input), so the same bytes. Its amax and saturations go unread
// (the forward's feed the scaling state). What this costs is a second read of the input, for
// the bytes q_t no longer holds across the forward (as torch.compile's partitioner recomputes
// torchao's casts, and Transformer Engine keeps only the FP8 weight's transposed copy). It runs
// under train.recompute (--recompute: less memory, more time), in the layers it names
// (recompute_layers); otherwise it changes nothing.
#include "ir/Attributes.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {
namespace {

/// The quantizes that make a forward value's FP8 form; the gradients' quantizes (and the
/// loss's) are made where the backward reads them.
bool forwardActivation(QuantizeActivation a) {
  return a == QuantizeActivation::None || a == QuantizeActivation::Gelu || a == QuantizeActivation::Swiglu;
}

class RequantizeTransposes : public Pass {
public:
  explicit RequantizeTransposes(const TrainConfig &train) : train_(train) {}
  llvm::Expected<bool> run(Graph &graph) override {
    if (!train_.recompute || graph.outputs().empty() || !graph.outputs().front()->def())
      return false;
    std::vector<Op *> ops = graph.ops();
    llvm::DenseMap<const Op *, size_t> index;
    for (size_t i = 0; i < ops.size(); ++i)
      index[ops[i]] = i;
    // The loss (a training program's first output) divides the forward from the backward.
    size_t loss = index.lookup(graph.outputs().front()->def());
    bool changed = false;
    for (Op *quantize : ops) {
      if (quantize->kind() != OpKind::Quantize || index.lookup(quantize) >= loss ||
          !train_.recomputes(layerOf(quantize->result()->name())))
        continue;
      QuantizeOptions options = quantizeOptions(quantize->attrs());
      if (!options.transpose || options.biasGrad || !forwardActivation(options.activation) ||
          quantize->numResults() != 4)
        continue;
      Value *transposed = quantize->result(3);
      if (transposed->users().empty() || isGraphOutput(graph, transposed))
        continue;
      Op *first = nullptr;
      for (Op *user : transposed->users())
        if (!first || index.lookup(user) < index.lookup(first))
          first = user;
      if (index.lookup(first) <= loss || !keptForBackward(graph, quantize->operand(0), quantize, index, loss))
        continue;
      if (auto err = split(graph, quantize, first))
        return std::move(err);
      changed = true;
    }
    if (changed)
      graph.sortTopologically();
    return changed;
  }

private:
  TrainConfig train_;
  /// Whether `x` stays alive into the backward without `quantize`: a leaf (a parameter), or
  /// a value another op reads after the loss.
  static bool keptForBackward(const Graph &graph, Value *x, const Op *quantize,
                              const llvm::DenseMap<const Op *, size_t> &index, size_t loss) {
    while (Op *reshape = definedBy(x, OpKind::Reshape))
      x = reshape->operand(0);
    if (!x->def() || x->def()->kind() == OpKind::Param)
      return true;
    if (isGraphOutput(graph, x))
      return true;
    std::vector<Value *> aliases{x};
    for (size_t a = 0; a < aliases.size(); ++a)
      for (Op *user : aliases[a]->users()) {
        if (user->kind() == OpKind::Reshape) {
          aliases.push_back(user->result());
          continue;
        }
        if (user != quantize && index.lookup(user) > loss)
          return true;
      }
    return false;
  }

  /// `quantize` writes q alone; a copy of it before `first` writes the q_t the backward reads.
  static llvm::Error split(Graph &graph, Op *quantize, Op *first) {
    Value *transposed = quantize->result(3);
    Op *again = copyOpBefore(graph, *quantize, first);
    graph.replaceAllUsesWith(transposed, again->result(3));
    Replacement rows{OpKind::Quantize, {}, quantize->attrs(), {}, {}};
    rows.operands.assign(quantize->operands().begin(), quantize->operands().end());
    rows.attrs.erase(kTranspose);
    for (unsigned r = 0; r < 3; ++r)
      rows.replaces.push_back(quantize->result(r));
    return applyReplacement(graph, {quantize}, std::move(rows), nullptr, /*sort=*/false);
  }
};

} // namespace

std::unique_ptr<Pass> createRequantizeTransposesPass(const TrainConfig &train) {
  return std::make_unique<RequantizeTransposes>(train);
}

} // namespace tgc
