#include "transforms/precision/Precision.h"

#include "ir/Attributes.h"

#include "llvm/Support/GlobPattern.h"

#include <fmt/format.h>

namespace tgc {

Value *quantizeWithState(Builder &b, Value *x, const std::string &prefix, Fp8Format format,
                         int64_t historyLength, Fp8ScalingChoice scaling) {
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
  AttrMap attrs;
  setFp8Format(attrs, format);
  if (scaling.current)
    setCurrentScaling(attrs, scaling.margin);
  return b.create(OpKind::Quantize, {x, scale, scaleInv}, std::move(attrs), prefix + ".q");
}

GemmChoice chooseGemmPrecision(const PrecisionConfig &config, llvm::StringRef site, int64_t m,
                               int64_t k, int64_t n) {
  for (const std::string &pattern : config.keepBf16) {
    auto glob = llvm::GlobPattern::create(pattern);
    if (glob && glob->match(site))
      return {false, fmt::format("kept in BF16 by keep_bf16 '{}'", pattern)};
    if (!glob)
      llvm::consumeError(glob.takeError());
  }
  if (m % 16 || k % 16 || n % 16)
    return {false, fmt::format("{}x{}x{} is not a multiple of 16 (cuBLASLt FP8)", m, k, n)};
  if (k < config.fp8MinDim || n < config.fp8MinDim)
    return {false, fmt::format("K={} or N={} below fp8_min_dim {}: FP8 would not pay", k, n,
                               config.fp8MinDim)};
  return {true, fmt::format("K and N >= fp8_min_dim {}", config.fp8MinDim)};
}

std::string gemmSite(const Op &linear) {
  llvm::StringRef weight = linear.operand(1)->name();
  if (weight == "wte") // a tied LM head reads the embedding table: it is still the LM head
    return "lm_head";
  weight.consume_back(".weight");
  return weight.str();
}

} // namespace tgc
