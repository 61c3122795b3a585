// The rewrite driver of the fusion passes. A pattern first matches completely (reading the graph
// only); then one call replaces the matched ops with a fused op. The driver applies a pattern
// until nothing matches, with a cap that turns a rewrite loop into an error.
#pragma once

#include "ir/Graph.h"
#include "transforms/Pass.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <optional>

namespace tgc {

/// The op whose result `v` is, if it is of `kind`.
Op *definedBy(Value *v, OpKind kind);
/// The only op that reads `v`, if exactly one op reads it (once) and it is not a graph output.
Op *soleUser(const Graph &graph, Value *v);
bool isGraphOutput(const Graph &graph, const Value *v);
/// The block layer a value's name belongs to ("h3.mlp.fc1..." -> 3); none for the embeddings,
/// the final norm and the head (what train.recompute_layers counts: TrainConfig::recomputes).
std::optional<int64_t> layerOf(llvm::StringRef name);
/// A matmul computing x @ w^T with a rank-2 w stored [out, in] (the builder's linear layer), not
/// yet quantized: the fusions leave FP8 GEMMs alone.
bool isLinear(const Op *matmul);
/// The add that applies a bias [N] to `y` and is `y`'s only user, if there is one.
Op *biasAddOf(const Graph &graph, Value *y);
/// Whether `reduce` is a reduce_to of `v` over every axis but its last (a bias's gradient).
bool isBiasSum(const Op &reduce, const Value *v);

/// Replaces a matched pattern by one op.
struct Replacement {
  OpKind kind;
  llvm::SmallVector<Value *, 8> operands;
  AttrMap attrs;
  /// Values of the pattern that the fused op's results take over, result by result.
  llvm::SmallVector<Value *, 2> replaces;
  /// The names of the results after those, which replace nothing (what the fused op keeps
  /// for its gradient).
  llvm::SmallVector<std::string, 1> newResults;
};

/// Creates the fused op, redirects every use of the replaced values to its results (which take
/// their names) and erases the pattern's ops that are left unused (adding them to `erased`
/// where given). With `sort`, it then restores program order; without, the caller sorts once
/// after many replacements (matching follows def-use chains, not the order).
llvm::Error applyReplacement(Graph &graph, llvm::ArrayRef<Op *> pattern, Replacement replacement,
                             llvm::DenseSet<const Op *> *erased = nullptr, bool sort = true);

/// What a fusion pattern found: the ops it covers (in program order) and what replaces them.
struct FusionMatch {
  llvm::SmallVector<Op *, 16> pattern;
  Replacement replacement;
};

/// A fusion pass: one pattern, one legality predicate inside `match`, applied to a fixed point.
class FusionPass : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override;
  /// Reads the graph only; returns the complete match rooted at `root`, if any.
  virtual std::optional<FusionMatch> match(const Graph &graph, Op *root) const = 0;
};

/// A copy of `op` (the same operands and attributes, each result named after `op`'s with
/// ".again") inserted before `before`: what recomputes a value in the backward instead of
/// keeping the forward's (requantize-transposes, fp8-weights under recompute).
Op *copyOpBefore(Graph &graph, const Op &op, Op *before);

/// Carries a GEMM's gemm_dtype (set by assign-precision) over to the op that absorbs it.
void copyGemmDType(const Op &gemm, AttrMap &fused);

/// The builder's SwiGLU of fc1's output h [..., 2F]: mul(silu(slice(h, gate)), slice(h, up)),
/// gate h's first half along its last axis, up its second; each intermediate read once, inside
/// the pattern, and h read by the two slices alone.
struct SwigluPattern {
  Op *mul, *silu, *gate, *up;
  Value *h;
};
std::optional<SwigluPattern> matchSwiglu(const Graph &graph, Op *mul);

/// The norm ops a fused op can absorb, and the attributes that describe one.
bool isNorm(const Op *op);
AttrMap normAttrs(const Op *norm);


} // namespace tgc
