// Operand layouts of the fused norm ops, whose optional operands follow their attributes:
// beta exists for norm=layer_norm, the biases for bias=true, dnorm for return_norm=true; an MLP
// gradient reads its forward's h after dy.
// The type rules, the interpreter, the gradient rules and the fusion passes all read operand
// positions from here.
#pragma once

#include "ir/Graph.h"

namespace tgc {

/// Hidden: the fc1 output h a layer_norm_mlp_backward reads (its forward's second result).
enum class FusedSlot { Dy, DNorm, Hidden, X, Gamma, Beta, W1, B1, W2, B2 };

class FusedLayout {
public:
  /// For layer_norm_linear(_backward) and layer_norm_mlp(_backward).
  FusedLayout(OpKind kind, const AttrMap &attrs);

  /// Position of the slot among the operands, or -1 when the op has no such operand.
  int operator[](FusedSlot slot) const { return index_[static_cast<int>(slot)]; }
  bool has(FusedSlot slot) const { return (*this)[slot] >= 0; }
  unsigned numOperands() const { return count_; }
  /// Where the forward op's operands start (after dy and dnorm or h in a backward op).
  unsigned forwardBegin() const { return forwardBegin_; }

private:
  int index_[10];
  unsigned count_ = 0, forwardBegin_ = 0;
};

/// The attribute values the layouts read.
inline bool isLayerNorm(const AttrMap &attrs) {
  return attrs.getString("norm").value_or("layer_norm") == "layer_norm";
}

} // namespace tgc
