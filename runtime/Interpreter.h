// The CPU reference interpreter: runs any tgc graph in fp32, op by op, in program order.
// It is the ground truth for every other backend, so each op is written plainly.
#pragma once

#include "ir/Graph.h"
#include "runtime/Executor.h"
#include "runtime/Tensor.h"

#include "llvm/ADT/DenseMap.h"

#include <map>

namespace tgc {

class Interpreter : public Executor {
public:
  explicit Interpreter(const Graph &graph) : graph_(graph) {}

  llvm::Error bind(llvm::StringRef name, Tensor tensor) override;
  llvm::Expected<std::vector<Tensor>> run() override;
  llvm::Expected<Tensor> read(llvm::StringRef name) const override;
  std::string describe() const override { return "cpu (reference interpreter)"; }
  /// Accumulates the time spent in each op kind over the runs (see profile()).
  void enableProfile(bool enable) { profiling_ = enable; }
  /// Milliseconds per op name, summed over the runs since profiling was enabled.
  const std::map<std::string, double> &profile() const { return profile_; }

  /// A bound leaf, or a value of the last run that was still alive at its end (outputs).
  const Tensor *lookup(llvm::StringRef name) const;

private:
  const Graph &graph_;
  llvm::DenseMap<const Value *, Tensor> bound_;  // inputs and parameters
  llvm::DenseMap<const Value *, Tensor> values_; // intermediates of the last run
  bool profiling_ = false;
  std::map<std::string, double> profile_;
};

/// Evaluates one non-leaf op on host tensors.
llvm::Error evalOp(const Op &op, llvm::ArrayRef<const Tensor *> operands,
                   llvm::MutableArrayRef<Tensor> results);

} // namespace tgc
