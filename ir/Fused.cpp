#include "ir/Fused.h"

namespace tgc {

FusedLayout::FusedLayout(OpKind kind, const AttrMap &attrs) {
  std::fill(std::begin(index_), std::end(index_), -1);
  bool backward = kind == OpKind::LayerNormLinearBackward || kind == OpKind::LayerNormMLPBackward;
  bool mlp = kind == OpKind::LayerNormMLP || kind == OpKind::LayerNormMLPBackward;
  bool bias = attrs.getBool("bias").value_or(false);
  auto add = [&](FusedSlot slot) { index_[static_cast<int>(slot)] = int(count_++); };
  if (backward) {
    add(FusedSlot::Dy);
    if (kind == OpKind::LayerNormLinearBackward && attrs.getBool("return_norm").value_or(false))
      add(FusedSlot::DNorm);
    if (mlp)
      add(FusedSlot::Hidden);
  }
  forwardBegin_ = count_;
  add(FusedSlot::X);
  add(FusedSlot::Gamma);
  if (isLayerNorm(attrs))
    add(FusedSlot::Beta);
  add(FusedSlot::W1);
  if (bias)
    add(FusedSlot::B1);
  if (mlp) {
    add(FusedSlot::W2);
    if (bias)
      add(FusedSlot::B2);
  }
}

} // namespace tgc
