// The CPU reference interpreter: runs any tgc graph in fp32, op by op, in program order.
// It is the ground truth for every other backend, so each op is written plainly.
#pragma once

#include "ir/Graph.h"
#include "runtime/Tensor.h"

#include "llvm/ADT/DenseMap.h"

#include <map>

namespace tgc {

class Interpreter {
public:
  explicit Interpreter(const Graph &graph) : graph_(graph) {}

  /// Binds an input or parameter by name; its type must match the graph's.
  llvm::Error bind(llvm::StringRef name, Tensor tensor);
  /// Binds every tensor of the map (e.g. from initParams).
  llvm::Error bindAll(const std::map<std::string, Tensor> &tensors);
  /// Keeps every intermediate value after run() instead of freeing it at its last use.
  void keepIntermediates(bool keep) { keepAll_ = keep; }

  /// Runs the graph; returns the graph's outputs in order.
  llvm::Expected<std::vector<Tensor>> run();
  /// A bound leaf, or (with keepIntermediates) any value of the last run.
  const Tensor *lookup(llvm::StringRef name) const;

private:
  const Graph &graph_;
  llvm::DenseMap<const Value *, Tensor> bound_;  // inputs and parameters
  llvm::DenseMap<const Value *, Tensor> values_; // intermediates of the last run
  bool keepAll_ = false;
};

/// Evaluates one non-leaf op on host tensors (exposed for per-op tests).
llvm::Error evalOp(const Op &op, llvm::ArrayRef<const Tensor *> operands,
                   llvm::MutableArrayRef<Tensor> results);

} // namespace tgc
