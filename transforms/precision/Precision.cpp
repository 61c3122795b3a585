#include "transforms/precision/Precision.h"

#include "ir/Attributes.h"
#include "models/ProgramInterface.h"
#include "support/Error.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/GlobPattern.h"

#include <fmt/format.h>

namespace tgc {

std::pair<Value *, Value *> scalingState(Builder &b, const std::string &prefix, int64_t historyLength) {
  auto state = [&](const char *suffix, TensorType type, const char *init) {
    AttrMap attrs;
    attrs.set("init", std::string(init));
    return b.state(prefix + suffix, std::move(type), std::move(attrs));
  };
  TensorType scalar(DType::F32, {});
  Value *scale = state(".scale", scalar, "ones");
  Value *scaleInv = state(".scale_inv", scalar, "ones");
  state(".amax_history", TensorType(DType::F32, {historyLength}), "zeros");
  state(".saturations", scalar, "zeros");
  return {scale, scaleInv};
}

std::optional<std::string> fp8AttentionRefusal(const AttentionHeads &h, int64_t headDim) {
  if (h.grouped())
    return fmt::format("{} KV heads for {} query heads: cuDNN's FP8 attention takes one a query head", h.kvHeads,
                       h.heads);
  if (h.ropeTheta)
    return std::string("rope inside the attention: cuDNN's FP8 attention takes q and k as they are");
  if (headDim % 16)
    return fmt::format("head dimension {}: cuDNN's FP8 attention takes multiples of 16", headDim);
  return std::nullopt;
}

std::string attentionSite(const Op &attention) {
  llvm::StringRef name = attention.result(0)->name();
  size_t at = name.find(".attn.");
  return (at == llvm::StringRef::npos ? name : name.take_front(at + 5)).str() + ".sdpa";
}

std::string attentionStatePrefix(llvm::StringRef site, llvm::StringRef role) {
  return (site + program::kFp8Marker + role).str();
}

Value *quantizeWithState(Builder &b, Value *x, const std::string &prefix, Fp8Format format,
                         int64_t historyLength, Fp8ScalingChoice scaling) {
  auto [scale, scaleInv] = scalingState(b, prefix, historyLength);
  AttrMap attrs;
  setFp8Format(attrs, format);
  if (scaling.blockRows)
    setBlockScaling(attrs, scaling.blockRows);
  else if (scaling.current)
    setCurrentScaling(attrs, scaling.margin);
  return b.create(OpKind::Quantize, {x, scale, scaleInv}, std::move(attrs), prefix + ".q");
}

const std::string *matchingPattern(const std::vector<std::string> &patterns, llvm::StringRef site) {
  for (const std::string &pattern : patterns) {
    auto glob = llvm::GlobPattern::create(pattern);
    if (!glob) {
      llvm::consumeError(glob.takeError());
      continue;
    }
    if (glob->match(site))
      return &pattern;
  }
  return nullptr;
}

llvm::Expected<std::string> scalingStatePrefix(const Op &op, llvm::StringRef pass, unsigned scaleOperand) {
  const Value *scale = op.operand(scaleOperand);
  llvm::StringRef prefix = scale->name();
  if (!prefix.consume_back(".scale") || !scale->def() || scale->def()->kind() != OpKind::State)
    return stringError(fmt::format("{}: {} %{} does not read a '<prefix>.scale' state", pass.str(), op.name().str(),
                                   op.result()->name()));
  return prefix.str();
}

std::string layerPattern(llvm::StringRef site) {
  llvm::StringRef rest = site;
  if (!rest.consume_front("h"))
    return site.str();
  size_t digits = 0;
  while (digits < rest.size() && llvm::isDigit(rest[digits]))
    ++digits;
  if (digits == 0 || digits == rest.size() || rest[digits] != '.')
    return site.str();
  return "h*" + rest.drop_front(digits).str();
}

namespace {

/// The measurement behind auto's choice for the layers of `site`'s kind, if auto measured one.
std::string measuredReason(const PrecisionConfig &config, llvm::StringRef site) {
  for (const GemmMeasurement &m : config.measured)
    if (layerPattern(m.site) == layerPattern(site))
      return fmt::format("measured{}: a probe step of {:.3f} ms with every kind in FP8, {:.3f} with this one in "
                         "BF16",
                         m.cached ? " (cached)" : "", m.fp8Ms, m.bf16Ms);
  return "";
}

} // namespace

GemmChoice chooseGemmPrecision(const PrecisionConfig &config, llvm::StringRef site, int64_t m,
                               int64_t k, int64_t n) {
  if (const std::string *pattern = matchingPattern(config.keepBf16, site))
    return {false, fmt::format("kept in BF16 by keep_bf16 '{}'", *pattern)};
  if (k % 16 || n % 16)
    return {false, fmt::format("K={} or N={} is not a multiple of 16 (cuBLASLt FP8)", k, n)};
  if (!config.forwardOnly && m % 16)
    return {false, fmt::format("M={} is not a multiple of 16 (the FP8 weight gradient contracts over it)", m)};
  if (config.fp8Scaling == Fp8Scaling::Block) {
    // 128 x 128 weight blocks along K and N; the gradient's 1 x 128 blocks along N, and the
    // wgrad's along M.
    if (k % kFp8BlockSize || n % kFp8BlockSize)
      return {false, fmt::format("K={} or N={} is not a multiple of 128 (block scaling's blocks)", k, n)};
    if (!config.forwardOnly && m % kFp8BlockSize)
      return {false, fmt::format("M={} is not a multiple of 128 (block scaling's blocks along the weight gradient's "
                                 "reduction)", m)};
  }
  if (k < config.fp8MinDim || n < config.fp8MinDim)
    return {false, fmt::format("K={} or N={} below fp8_min_dim {}", k, n, config.fp8MinDim)};
  std::string measured = measuredReason(config, site);
  if (config.fp8Layers) {
    const std::string *pattern = matchingPattern(*config.fp8Layers, site);
    if (!pattern)
      return {false, measured.empty() ? "not named by fp8_layers" : measured};
    return {true, measured.empty() ? fmt::format("fp8_layers '{}'", *pattern) : measured};
  }
  return {true, "every legal linear layer (the fp8 recipe)"};
}

std::string gemmSite(const Op &linear) {
  llvm::StringRef weight = linear.operand(1)->name();
  if (weight == "wte") // a tied LM head reads the embedding table: it is still the LM head
    return "lm_head";
  weight.consume_back(".weight");
  return weight.str();
}

} // namespace tgc
