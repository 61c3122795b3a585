// fuse-cross-entropy: log_softmax -> nll_loss becomes cross_entropy, whose gradient
// (softmax - onehot) / N comes straight from the logits: no log-probabilities in memory.
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"

namespace tgc {
namespace {

class FuseCrossEntropy : public FusionPass {
public:
  std::optional<FusionMatch> match(const Graph &graph, Op *loss) const override {
    if (loss->kind() != OpKind::NLLLoss)
      return std::nullopt;
    Op *logSoftmax = definedBy(loss->operand(0), OpKind::LogSoftmax);
    // Legality: nothing else reads the log-probabilities.
    if (!logSoftmax || soleUser(graph, logSoftmax->result()) != loss)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {logSoftmax, loss};
    m.replacement.kind = OpKind::CrossEntropy;
    m.replacement.operands = {logSoftmax->operand(0), loss->operand(1)};
    m.replacement.replaces = {loss->result()};
    return m;
  }
};

} // namespace

std::unique_ptr<Pass> createFuseCrossEntropyPass() { return std::make_unique<FuseCrossEntropy>(); }

} // namespace tgc
