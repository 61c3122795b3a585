// assign-precision: makes the recipe explicit in the program. fp32 changes nothing. bf16 marks
// every GEMM gemm_dtype="bf16" (BF16 operands, fp32 accumulation and output). fp8 quantizes both
// operands of each linear layer that chooseGemmPrecision lets through (E4M3, with scaling state
// per tensor) and tells autodiff how to quantize its output gradient (E5M2 under hybrid); the
// other GEMMs run in BF16, attention's too unless fp8_attention makes it fp8_attention (q, k and v
// quantized with state of their own, the probabilities at S's; autodiff quantizes dout).
// Master weights, optimizer state and reductions stay fp32.
#include "ir/Attributes.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Passes.h"
#include "transforms/Rewrite.h"
#include "transforms/precision/Precision.h"

#include <fmt/format.h>

namespace tgc {
namespace {

/// The GEMMs, and the KV-cache writes: under BF16 a cache holds its keys and values as BF16,
/// as the attention over it reads them.
bool isGemm(OpKind kind) {
  return kind == OpKind::MatMul || kind == OpKind::Attention || kind == OpKind::DecodeAttention ||
         kind == OpKind::KvWrite ||
         kind == OpKind::LayerNormLinear ||
         kind == OpKind::LayerNormMLP || kind == OpKind::MatMulBias ||
         kind == OpKind::MatMulBiasGelu;
}

class AssignPrecision : public Pass {
public:
  explicit AssignPrecision(PrecisionConfig config) : config_(std::move(config)) {}
  llvm::Expected<bool> run(Graph &graph) override {
    Recipe recipe = config_.recipe;
    if (recipe == Recipe::Auto)
      return makeError("assign-precision needs the recipe fp32, bf16 or fp8, not 'auto'");
    if (recipe == Recipe::Fp32)
      return false;
    bool changed = false;
    Builder b(graph);
    if (recipe == Recipe::Fp8 && config_.fp8Attention && config_.fp8Scaling != Fp8Scaling::Delayed)
      return makeError("fp8_attention takes delayed scaling (cuDNN's FP8 attention reads every scale before it "
                       "runs), not {}",
                       fp8ScalingName(config_.fp8Scaling).str().c_str());
    for (Op *op : graph.ops()) {
      if (!isGemm(op->kind()) || op->attrs().has(kGemmDtype) || hasFp8GemmChoice(op->attrs()))
        continue;
      changed = true;
      if (recipe == Recipe::Fp8 && config_.fp8Attention && fp8AttentionFits(*op)) {
        quantizeAttention(b, op);
        continue;
      }
      if (recipe == Recipe::Fp8 && isLinear(op) && choose(*op).fp8) {
        quantizeOperands(b, op);
        continue;
      }
      setBf16Gemms(op->attrs());
    }
    if (auto err = b.takeError())
      return std::move(err);
    if (changed)
      graph.sortTopologically(); // the new state leaves and quantize ops come before their users
    return changed;
  }

private:
  GemmChoice choose(const Op &linear) const {
    const TensorType &x = linear.operand(0)->type(), &w = linear.operand(1)->type();
    int64_t k = x.dim(-1), n = w.dim(0), m = x.numElements() / k;
    return chooseGemmPrecision(config_, gemmSite(linear), m, k, n);
  }

  /// What cuDNN's FP8 attention takes: one KV head a query head, no rope inside the op, a head
  /// dimension a multiple of 16.
  static bool fp8AttentionFits(const Op &op) {
    if (op.kind() != OpKind::Attention || isHeadMajor(op.attrs()))
      return false;
    AttentionHeads h = attentionHeads(op.attrs());
    int64_t width = op.operand(0)->type().dim(-1);
    return h.heads > 0 && width % (3 * h.heads) == 0 && !fp8AttentionRefusal(h, width / (3 * h.heads));
  }

  /// attention(qkv) -> fp8_attention(quantize(qkv), S's scale, scale_inv), the results keeping
  /// their names; the choice of dout's format and history for autodiff on the op.
  void quantizeAttention(Builder &b, Op *attention) const {
    std::string site = attentionSite(*attention);
    int64_t history = config_.amaxHistoryLen;
    b.setInsertionPoint(attention); // delayed scaling (run() refuses the others)
    Value *q = quantizeWithState(b, attention->operand(0), attentionStatePrefix(site, program::kAttentionQkv),
                                 Fp8Format::E4M3, history, Fp8ScalingChoice{});
    auto [sScale, sScaleInv] = scalingState(b, attentionStatePrefix(site, program::kAttentionS), history);
    AttrMap attrs = attention->attrs();
    attrs.erase(kGemmDtype);
    Fp8GemmChoice choice;
    choice.site = site;
    // dout and dS in E4M3 under either format: the FP8 gradient cuDNN's attention is built and
    // tested for (cudnn_frontend's FP8 backward takes E4M3 inputs); per-tensor scales give
    // them the range.
    choice.gradFormat = Fp8Format::E4M3;
    choice.history = history;
    setFp8GemmChoice(attrs, choice);
    Op *fp8 = q ? b.createOp(OpKind::Fp8Attention, {q, q->def()->operand(2), sScale, sScaleInv}, std::move(attrs),
                             attention->result(0)->name() + ".fp8")
                : nullptr;
    b.setInsertionPoint(nullptr);
    if (!fp8)
      return;
    Graph &graph = b.graph();
    std::vector<std::string> names;
    for (unsigned i = 0; i < 2; ++i) {
      names.push_back(attention->result(i)->name());
      graph.replaceAllUsesWith(attention->result(i), fp8->result(i));
    }
    graph.eraseOp(attention);
    for (unsigned i = 0; i < 2; ++i)
      graph.rename(fp8->result(i), names[i]);
    graph.rename(fp8->result(2), graph.uniqueName(site + ".amax_s"));
  }

  void quantizeOperands(Builder &b, Op *linear) const {
    std::string site = gemmSite(*linear);
    int64_t history = config_.amaxHistoryLen;
    // Mixed: the activation's delayed scale, the weight's and the output gradient's current one.
    bool all = config_.fp8Scaling == Fp8Scaling::Current, mixed = config_.fp8Scaling == Fp8Scaling::Mixed;
    Fp8ScalingChoice activation{all, config_.margin}, scaling{all || mixed, config_.margin};
    // Block: 1 x 128 blocks for the input (and the output gradient), 128 x 128 for the weight.
    if (config_.fp8Scaling == Fp8Scaling::Block) {
      activation.blockRows = 1;
      scaling.blockRows = kFp8BlockSize;
    }
    Value *input = quantizeWithState(b, linear->operand(0), program::fp8StatePrefix(site, program::Fp8Role::Input),
                                     Fp8Format::E4M3, history, activation);
    Value *weight = quantizeWithState(b, linear->operand(1), program::fp8StatePrefix(site, program::Fp8Role::Weight),
                                      Fp8Format::E4M3, history, scaling);
    if (!input || !weight)
      return;
    linear->setOperand(0, input);
    linear->setOperand(1, weight);
    Fp8GemmChoice choice;
    choice.site = site;
    choice.gradFormat = config_.fp8Format == Fp8Formats::Hybrid ? Fp8Format::E5M2 : Fp8Format::E4M3;
    choice.history = history;
    if (scaling.current) // the output gradient's quantize, made by autodiff, scales the same way
      choice.currentMargin = scaling.margin;
    choice.block = config_.fp8Scaling == Fp8Scaling::Block;
    setFp8GemmChoice(linear->attrs(), choice);
  }

  PrecisionConfig config_;
};

} // namespace

std::unique_ptr<Pass> createAssignPrecisionPass(const PrecisionConfig &config) {
  return std::make_unique<AssignPrecision>(config);
}

std::vector<std::string> explainPrecision(const Graph &graph, const PrecisionConfig &config) {
  std::vector<std::string> lines;
  for (const Op *op : graph.ops()) {
    if (!isLinear(op))
      continue;
    const TensorType &x = op->operand(0)->type(), &w = op->operand(1)->type();
    int64_t k = x.dim(-1), n = w.dim(0), m = x.numElements() / k;
    std::string site = gemmSite(*op);
    if (config.recipe != Recipe::Fp8) {
      lines.push_back(fmt::format("{:<24} {:>6} x {:>5} x {:>6}  {}", site, m, k, n,
                                  config.recipe == Recipe::Bf16 ? "bf16" : "fp32"));
      continue;
    }
    GemmChoice choice = chooseGemmPrecision(config, site, m, k, n);
    lines.push_back(fmt::format("{:<24} {:>6} x {:>5} x {:>6}  {}  ({})", site, m, k, n,
                                choice.fp8 ? "fp8 " : "bf16", choice.reason));
  }
  return lines;
}

} // namespace tgc
