// What runs a compiled program: the CPU interpreter, and the GPU executor when it is built.
// Leaves (inputs, parameters, state) are bound by name; a run executes one step and leaves the
// assigned parameters and state updated.
#pragma once

#include "backends/Tensor.h"
#include "support/Error.h"

#include "llvm/Support/Error.h"

#include <map>
#include <string>
#include <vector>

namespace tgc {

class Executor {
public:
  virtual ~Executor() = default;
  /// Binds an input, parameter or state by name; its type must match the graph's.
  virtual llvm::Error bind(llvm::StringRef name, Tensor tensor) = 0;
  /// Runs the program once; returns its outputs in order.
  virtual llvm::Expected<std::vector<Tensor>> run() = 0;
  /// Runs the program once without copying its outputs out: read() takes the ones wanted (a
  /// decode step reads its greedy tokens, not the logits).
  virtual llvm::Error step() {
    auto outputs = run();
    return outputs ? llvm::Error::success() : outputs.takeError();
  }
  /// Starts a step without waiting for it: a GPU queues it behind the work before it, so that the
  /// host can queue the next step meanwhile (the decode loop); the CPU runs it at once. read()
  /// and step() wait for it.
  virtual llvm::Error launch() { return step(); }
  /// Leaf `leaf` takes the value `value` (of the same type) has after the steps launched so far,
  /// in the device's order and without the host: a decode step's greedy tokens, the next step's
  /// input.
  virtual llvm::Error feed(llvm::StringRef value, llvm::StringRef leaf) {
    auto t = read(value);
    if (!t)
      return t.takeError();
    return bind(leaf, std::move(*t));
  }
  /// Queues a copy of `name`'s value as the steps launched so far leave it; collect(ticket)
  /// returns it once there, so that the host takes one step's tokens while the next runs.
  virtual llvm::Expected<unsigned> readLater(llvm::StringRef name) {
    auto t = read(name);
    if (!t)
      return t.takeError();
    later_.push_back(std::move(*t));
    return unsigned(later_.size() - 1);
  }
  virtual llvm::Expected<Tensor> collect(unsigned ticket) {
    if (ticket >= later_.size())
      return makeError("no read queued as ticket {}", ticket);
    return std::move(later_[ticket]);
  }
  /// Leaf `name` takes the current value of `from`'s leaf of that name and type (the KV caches
  /// a prefill program wrote, handed to the decode step): on the device when both are there.
  virtual llvm::Error copyLeafFrom(llvm::StringRef name, const Executor &from) {
    auto value = from.read(name);
    if (!value)
      return value.takeError();
    return bind(name, std::move(*value));
  }
  /// Leaf `name` becomes the memory of `owner`'s leaf of that name and type, where both
  /// executors can share it (two programs on one GPU: the prefill then writes the KV caches the
  /// decode step reads, with no copy). Returns false where they cannot, and nothing changes:
  /// the caller copies with copyLeafFrom instead.
  virtual llvm::Expected<bool> shareLeaf(llvm::StringRef name, Executor &owner) {
    (void)name, (void)owner;
    return false;
  }
  /// Whether leaf `name` lies in another executor's memory from the start (CudaOptions::
  /// regionsOf): it holds that executor's value, which binding it would overwrite.
  virtual bool borrowsLeaf(llvm::StringRef name) const {
    (void)name;
    return false;
  }
  /// Draws leaf `name` on the device as initParams draws a normal parameter from `stream` (each
  /// element from the stream's draws 2i and 2i + 1, times `std`): the same bits, with nothing
  /// made or copied on the host. False where this executor does not (the caller draws on the
  /// host and binds).
  virtual llvm::Expected<bool> fillNormal(llvm::StringRef name, uint64_t stream, double std) {
    (void)name, (void)stream, (void)std;
    return false;
  }
  /// While on, each op of the steps run is timed on its own (on the GPU the step runs eagerly,
  /// an event pair around each op); profileByOp() gives the milliseconds summed by op kind (a
  /// GEMM's label says its precision) since it was turned on.
  virtual void setProfiling(bool on) { (void)on; }
  virtual std::map<std::string, double> profileByOp() const { return {}; }
  /// While on, each step keeps a copy of every op's results as the op leaves them, as read()
  /// reads a value (on the GPU the step runs eagerly and reads each back: FP8 values as their
  /// codes times the scale_inv used, BF16 stores widened); tracedValues() gives the last step's
  /// by value name, in program order: where two devices' runs of one program part.
  virtual void setTracingValues(bool on) { (void)on; }
  virtual std::vector<std::pair<std::string, Tensor>> tracedValues() const { return {}; }
  /// The values this executor rounds to BF16 beyond their types in the program, by name: the
  /// GPU's storage rules (CudaProgram::bf16Rounding: a norm's output an FP8 cast reads, as
  /// Transformer Engine stores it, and others); none on the CPU.
  virtual std::vector<std::string> roundedValues() const { return {}; }
  /// Rounds the named values of the program to BF16 (to nearest, even) as their ops make them:
  /// another executor's roundedValues(), so that this one emulates that one's storage. False
  /// where this executor does not (names it does not hold are ignored).
  virtual bool setRoundedValues(const std::vector<std::string> &names) {
    (void)names;
    return false;
  }
  /// Makes the program's prologue leaves (backends/Prologue.h: the FP8 weights between steps)
  /// from the other leaves as they are now: run after the leaves are initialised or restored,
  /// before the first step. A program without them runs nothing.
  virtual llvm::Error runPrologue() = 0;
  /// The current value of a leaf (after the last run's assigns).
  virtual llvm::Expected<Tensor> read(llvm::StringRef name) const = 0;
  virtual std::string describe() const = 0;
  /// Device memory the program holds (buffers and workspace); 0 on the CPU.
  virtual int64_t deviceBytes() const { return 0; }
  /// That memory by class, as lines to print: what was allocated for each use, and what the
  /// arena holds at its fullest op by the memory plan; none on the CPU.
  virtual std::vector<std::string> memoryReport() const { return {}; }

  llvm::Error bindAll(const std::map<std::string, Tensor> &tensors) {
    for (const auto &[name, tensor] : tensors)
      if (auto err = bind(name, tensor))
        return err;
    return llvm::Error::success();
  }

private:
  std::vector<Tensor> later_; // readLater's values, where it reads at once
};

} // namespace tgc
