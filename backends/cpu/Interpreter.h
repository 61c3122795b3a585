// The CPU reference interpreter: runs any tgc graph in fp32, op by op, in program order.
// It is the ground truth for every other backend, so each op is written plainly.
#pragma once

#include "backends/Communicator.h"
#include "backends/Executor.h"
#include "backends/Tensor.h"
#include "ir/Graph.h"
#include "support/Memory.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <map>
#include <optional>

namespace tgc {

class Interpreter : public Executor {
public:
  /// TGC_CPU_PROFILE=1 turns profiling on, and the destructor prints the time per op kind
  /// over the runs to stderr (as TGC_GPU_PROFILE does for the CUDA executor). TGC_TRACE=FILE
  /// records the ops of the first runs into a Chrome trace (support/Trace.h).
  /// `communicator`: the ranks its all_reduce ops reduce over (none: this rank alone).
  explicit Interpreter(const Graph &graph, Communicator *communicator = nullptr);
  ~Interpreter() override;

  llvm::Error bind(llvm::StringRef name, Tensor tensor) override;
  llvm::Expected<std::vector<Tensor>> run() override;
  llvm::Expected<Tensor> read(llvm::StringRef name) const override;
  llvm::Error runPrologue() override;
  std::string describe() const override { return "cpu (reference interpreter)"; }
  /// Accumulates the milliseconds of each op kind over the runs while on (TGC_CPU_PROFILE=1 keeps
  /// it on and prints them when the interpreter ends).
  void setProfiling(bool on) override {
    if (on && !profiling_)
      profile_.clear();
    profiling_ = on || reportProfile_;
  }
  std::map<std::string, double> profileByOp() const override { return profile_; }
  void setTracingValues(bool on) override { tracing_ = on; }
  std::vector<std::pair<std::string, Tensor>> tracedValues() const override { return traced_; }
  bool setRoundedValues(const std::vector<std::string> &names) override;

  /// A bound leaf, or a value of the last run that was still alive at its end (outputs).
  const Tensor *lookup(llvm::StringRef name) const;

private:
  const Graph &graph_;
  /// The collectives (all_reduce, reduce_scatter, all_gather) over the ranks through
  /// communicator_, after evalOp gave one rank's results; nothing for other ops.
  llvm::Error runCollective(const Op &op, llvm::ArrayRef<const Tensor *> operands, llvm::MutableArrayRef<Tensor> results);
  Communicator *communicator_ = nullptr;
  llvm::DenseMap<const Value *, Tensor> bound_;  // inputs and parameters
  llvm::DenseMap<const Value *, Tensor> values_; // intermediates of the last run
  bool profiling_ = false, reportProfile_ = false, tracing_ = false;
  std::vector<std::pair<std::string, Tensor>> traced_; // the last step's values (setTracingValues)
  llvm::DenseSet<const Value *> rounded_;              // rounded to BF16 when made (setRoundedValues)
  int traceProcess_ = -1; // TGC_TRACE: this program's process in the trace (support/Trace.h)
  int64_t runs_ = 0;
  std::map<std::string, double> profile_;
};

/// The host memory the interpreter holds at the peak of one run of `graph`, in bytes: every
/// leaf bound, the intermediates alive at once (each freed after its last reader), and the
/// assigned values it keeps until the step ends, and the fused attention's [B, H, T, T]
/// temporaries while it runs. A lower bound: the other kernels' temporaries (packed GEMM
/// operands, a fused op's recomputed activations) are not counted, and on the tiny model's
/// training step they take the resident size to about 4x this.
int64_t interpreterPeakBytes(const Graph &graph);

/// An error when interpreterPeakBytes(graph) is more than `availableBytes`, naming both, so
/// that a model too large for the CPU interpreter stops before it allocates anything.
llvm::Error checkHostMemory(const Graph &graph, int64_t availableBytes);
/// checkHostMemory against availableHostMemory(), when the machine says what it has.
llvm::Error checkHostMemory(const Graph &graph);

/// Evaluates one non-leaf op on host tensors.
llvm::Error evalOp(const Op &op, llvm::ArrayRef<const Tensor *> operands,
                   llvm::MutableArrayRef<Tensor> results);

} // namespace tgc
