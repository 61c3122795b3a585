#include "backends/cpu/Interpreter.h"

#include "backends/Prologue.h"
#include "backends/cpu/CpuKernels.h"
#include "support/Environment.h"
#include "support/Error.h"
#include "support/Numerics.h"
#include "support/Trace.h"

#include "llvm/ADT/SmallPtrSet.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <fstream>
#include <limits>
#include <mutex>
#include <thread>
#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace tgc {
namespace {


using EvalFn = llvm::Error (*)(const AttrMap &, cpu::Operands, cpu::Results);

/// The index of the last op that reads each value (run() frees the value after it).
llvm::DenseMap<const Value *, size_t> lastUses(llvm::ArrayRef<Op *> ops) {
  llvm::DenseMap<const Value *, size_t> last;
  for (size_t i = 0; i < ops.size(); ++i)
    for (const Value *v : ops[i]->operands())
      last[v] = i;
  return last;
}
const EvalFn kEvalFns[] = {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) &cpu::eval##Enum,
#include "ir/Ops.def"
};

/// Every op allocates its results and frees its temporaries, many of them above glibc's mmap
/// threshold: each such tensor was mapped afresh and returned to the kernel, so every op paid
/// the page faults of zeroing new pages (a third of a tiny-model step). Freed memory now stays in
/// the heap for the next op. The arithmetic is untouched.
void keepFreedMemoryInTheHeap() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); // the largest glibc takes; larger tensors are mapped still
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

} // namespace

llvm::Error evalOp(const Op &op, cpu::Operands operands, cpu::Results results) {
  return kEvalFns[static_cast<unsigned>(op.kind())](op.attrs(), operands, results);
}

llvm::Error Interpreter::runCollective(const Op &op, llvm::ArrayRef<const Tensor *> operands,
                                       llvm::MutableArrayRef<Tensor> results) {
  bool zero = op.kind() == OpKind::ReduceScatter || op.kind() == OpKind::AllGather;
  if (op.kind() != OpKind::AllReduce && !zero)
    return llvm::Error::success();
  int64_t ranks = zero ? *op.attrs().getInt("ranks") : 1;
  // dtype = "bf16": what crosses the ranks is rounded to BF16, and so is what comes back.
  bool bf16 = op.attrs().getString("dtype") == std::optional<std::string>("bf16");
  auto wire = [&](float *data, size_t count) {
    if (bf16)
      for (size_t i = 0; i < count; ++i)
        data[i] = roundToBf16(data[i]);
  };
  if (!communicator_) {
    if (ranks > 1) // (evalOp gave one rank's view)
      return makeError("{} over {} ranks needs the ranks' communicator (data-parallel training)", op.name().str(),
                       ranks);
    for (Tensor &t : results)
      wire(t.data.data(), t.data.size());
    return llvm::Error::success();
  }
  if (zero && ranks != communicator_->ranks())
    return makeError("the program shards over {} ranks; this run has {}", ranks, communicator_->ranks());
  if (op.kind() == OpKind::AllGather) {
    for (size_t i = 0; i < results.size(); ++i)
      if (auto err = communicator_->allGatherHost(operands[i]->data.data(), results[i].data.data(),
                                                  results[i].data.size()))
        return err;
    return llvm::Error::success();
  }
  ReduceOp reduce = *parseReduceOp(*op.attrs().getString("reduce"));
  if (op.kind() == OpKind::AllReduce) {
    for (Tensor &t : results) {
      wire(t.data.data(), t.data.size());
      if (auto err = communicator_->allReduceHost(t.data.data(), t.data.size(), reduce))
        return err;
      wire(t.data.data(), t.data.size());
    }
    return llvm::Error::success();
  }
  for (size_t i = 0; i < results.size(); ++i) { // each operand flattened, padded to ranks parts
    std::vector<float> padded(results[i].data.size() * size_t(ranks), 0.0f);
    std::copy(operands[i]->data.begin(), operands[i]->data.end(), padded.begin());
    wire(padded.data(), padded.size());
    if (auto err = communicator_->reduceScatterHost(padded.data(), results[i].data.data(), padded.size(), reduce))
      return err;
    wire(results[i].data.data(), results[i].data.size());
  }
  return llvm::Error::success();
}

Interpreter::Interpreter(const Graph &graph, Communicator *communicator)
    : graph_(graph), communicator_(communicator) {
  keepFreedMemoryInTheHeap();
  profiling_ = reportProfile_ = environmentSwitch("TGC_CPU_PROFILE", false);
  if (TraceLog::instance().enabled())
    traceProcess_ = TraceLog::instance().beginProcess("@" + graph.name() + " on the CPU interpreter");
}

Interpreter::~Interpreter() {
  if (traceProcess_ >= 0)
    TraceLog::instance().write();
  if (!reportProfile_ || runs_ == 0)
    return;
  std::vector<std::pair<double, std::string>> rows;
  double total = 0;
  for (const auto &[name, ms] : profile_) {
    rows.emplace_back(ms / double(runs_), name);
    total += ms / double(runs_);
  }
  std::sort(rows.rbegin(), rows.rend());
  llvm::errs() << fmt::format("CPU time per run of @{} by op ({} runs, {:.1f} ms in ops):\n",
                              graph_.name(), runs_, total);
  for (const auto &[ms, name] : rows)
    llvm::errs() << fmt::format("  {:<30}{:>10.1f} ms {:>6.1f}%\n", name, ms, 100 * ms / total);
}

llvm::Error Interpreter::bind(llvm::StringRef name, Tensor tensor) {
  const Value *v = graph_.lookup(name);
  if (!v || !isLeaf(v->def()->kind()) || v->def()->kind() == OpKind::Constant)
    return makeError("graph @{} has no input, parameter or state named '{}'", graph_.name(),
                name.str());
  if (tensor.type != v->type())
    return makeError("'{}' is {}, but a {} was given", name.str(), v->type().str(), tensor.type.str());
  size_t expected = size_t(tensor.size());
  if ((isFloat(tensor.type.dtype) ? tensor.data.size() : tensor.ints.size()) != expected)
    return makeError("'{}' holds the wrong number of elements", name.str());
  bound_[v] = std::move(tensor);
  return llvm::Error::success();
}

llvm::Expected<Tensor> Interpreter::read(llvm::StringRef name) const {
  if (const Tensor *t = lookup(name))
    return *t;
  return makeError("graph @{} has no value '{}' to read", graph_.name(), name.str());
}

const Tensor *Interpreter::lookup(llvm::StringRef name) const {
  const Value *v = graph_.lookup(name);
  if (!v)
    return nullptr;
  auto it = bound_.find(v);
  if (it != bound_.end())
    return &it->second;
  auto jt = values_.find(v);
  return jt == values_.end() ? nullptr : &jt->second;
}

bool Interpreter::setRoundedValues(const std::vector<std::string> &names) {
  rounded_.clear();
  for (const std::string &name : names)
    if (const Value *v = graph_.lookup(name); v && v->def() && !isLeaf(v->def()->kind()))
      rounded_.insert(v);
  return true;
}

llvm::Error Interpreter::runPrologue() {
  std::vector<PrologueOp> prologue = prologueOps(graph_);
  // What the prologue's ops made for the ones after them that no leaf holds (those assigned to
  // a leaf are read from it).
  llvm::DenseMap<const Value *, Tensor> made;
  for (const PrologueOp &p : prologue) {
    llvm::SmallVector<const Tensor *, 4> operands;
    for (unsigned k = 0; k < p.op->numOperands(); ++k) {
      const Value *leaf = p.operandLeaves[k];
      auto &from = leaf ? bound_ : made;
      auto it = from.find(leaf ? leaf : p.op->operand(k));
      if (it == from.end())
        return makeError("the prologue's %{} reads %{}, which was not given a value", p.op->result()->name(),
                         (leaf ? leaf : p.op->operand(k))->name());
      operands.push_back(&it->second);
    }
    llvm::SmallVector<Tensor, 4> results;
    for (unsigned r = 0; r < p.op->numResults(); ++r)
      results.push_back(Tensor::zeros(p.op->result(r)->type()));
    llvm::Error err = evalOp(*p.op, operands, results);
    if (!err)
      err = runCollective(*p.op, operands, results);
    if (err)
      return makeError("%{} = {}: {}", p.op->result()->name(), p.op->name().str(), llvm::toString(std::move(err)));
    for (unsigned r = 0; r < p.op->numResults(); ++r)
      (p.resultLeaves[r] ? bound_[p.resultLeaves[r]] : made[p.op->result(r)]) = std::move(results[r]);
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<Tensor>> Interpreter::run() {
  values_.clear();
  traced_.clear();
  std::vector<Op *> ops = graph_.ops();
  // The last op that reads each value: after it the value is freed.
  llvm::DenseMap<const Value *, size_t> lastUse = lastUses(ops);
  auto get = [&](const Value *v) -> const Tensor * {
    auto it = bound_.find(v);
    if (it != bound_.end())
      return &it->second;
    auto jt = values_.find(v);
    return jt == values_.end() ? nullptr : &jt->second;
  };
  // Assigns take effect when the step ends, after every op has read the old values.
  std::vector<std::pair<const Value *, Tensor>> pending;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = *ops[i];
    if (isLeaf(op.kind()) && op.kind() != OpKind::Constant) {
      if (!bound_.count(op.result()))
        return makeError("{} %{} was not given a value", op.name().str(), op.result()->name());
      continue;
    }
    llvm::SmallVector<const Tensor *, 4> operands;
    for (const Value *v : op.operands())
      operands.push_back(get(v));
    if (op.kind() == OpKind::Assign) {
      pending.emplace_back(op.operand(0), *operands[1]);
    } else {
      bool traced = traceProcess_ >= 0 && runs_ < TraceLog::instance().runsTraced();
      double startUs = traced ? TraceLog::instance().nowUs() : 0;
      auto start = std::chrono::steady_clock::now();
      llvm::SmallVector<Tensor, 3> results;
      for (unsigned r = 0; r < op.numResults(); ++r)
        results.push_back(Tensor::zeros(op.result(r)->type()));
      if (auto err = evalOp(op, operands, results))
        return makeError("%{} = {}: {}", op.result()->name(), op.name().str(),
                    llvm::toString(std::move(err)));
      if (auto err = runCollective(op, operands, results))
        return makeError("%{} = {}: {}", op.result()->name(), op.name().str(), llvm::toString(std::move(err)));
      if (profiling_)
        profile_[op.name().str()] += std::chrono::duration<double, std::milli>(
                                         std::chrono::steady_clock::now() - start)
                                         .count();
      if (traced)
        TraceLog::instance().add(traceProcess_, {op.name().str(), "op", "%" + op.result()->name(), startUs,
                                                 TraceLog::instance().nowUs() - startUs, runs_});
      for (unsigned r = 0; r < op.numResults(); ++r) {
        if (rounded_.count(op.result(r)))
          for (float &v : results[r].data)
            v = roundToBf16(v);
        if (tracing_)
          traced_.emplace_back(op.result(r)->name(), results[r]);
        values_[op.result(r)] = std::move(results[r]);
      }
    }
    for (const Value *v : op.operands()) {
      bool isOutput = llvm::is_contained(graph_.outputs(), v);
      if (lastUse[v] == i && !isOutput && !bound_.count(v))
        values_.erase(v);
    }
  }
  ++runs_;
  std::vector<Tensor> outputs;
  for (const Value *v : graph_.outputs())
    outputs.push_back(*get(v));
  for (auto &[leaf, value] : pending)
    bound_[leaf] = std::move(value);
  return outputs;
}

namespace {

/// What an op's CPU kernel allocates beyond its results while it runs: the fused attention and
/// its gradient materialise the unfused graph's [B, H, T, T] tensors (scores, scaled, masked and
/// the probabilities; the gradient also dprobs, dmasked, dscaled and dscores), and q, k, v and
/// their gradients head-major.
int64_t opScratchBytes(const Op &op) {
  if (op.kind() != OpKind::Attention && op.kind() != OpKind::AttentionBackward)
    return 0;
  bool forward = op.kind() == OpKind::Attention;
  // The packed qkv: the forward's operand, the gradient's result (its operand may be head-major).
  const TensorType &qkv = forward ? op.operand(0)->type() : op.result(0)->type();
  int64_t B = qkv.dim(0), T = qkv.dim(1), H = *op.attrs().getInt("heads");
  int64_t scores = B * H * T * T * int64_t(sizeof(float)), heads = qkv.numElements() * int64_t(sizeof(float));
  return forward ? 4 * scores + heads : 8 * scores + 3 * heads;
}

} // namespace

int64_t interpreterPeakBytes(const Graph &graph) {
  // run()'s schedule: bound leaves throughout, each intermediate from its op to its last
  // reader (outputs to the end), assigned values from their assign to the end.
  std::vector<Op *> ops = graph.ops();
  llvm::DenseMap<const Value *, size_t> lastUse = lastUses(ops);
  auto bytes = [](const Value *v) { return v->type().numElements() * int64_t(sizeof(float)); };
  int64_t live = 0, peak = 0;
  for (const Op *op : ops)
    if (isLeaf(op->kind()) && op->kind() != OpKind::Constant)
      live += bytes(op->result());
  peak = live;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = *ops[i];
    if (isLeaf(op.kind()) && op.kind() != OpKind::Constant)
      continue;
    if (op.kind() == OpKind::Assign) {
      live += bytes(op.operand(1));
    } else {
      for (unsigned r = 0; r < op.numResults(); ++r)
        live += bytes(op.result(r));
    }
    peak = std::max(peak, live + opScratchBytes(op));
    llvm::SmallPtrSet<const Value *, 4> freed;
    for (const Value *v : op.operands()) {
      const Op *def = v->def();
      bool leaf = isLeaf(def->kind()) && def->kind() != OpKind::Constant;
      if (lastUse[v] == i && !leaf && !llvm::is_contained(graph.outputs(), v) &&
          freed.insert(v).second)
        live -= bytes(v);
    }
  }
  return peak;
}

llvm::Error checkHostMemory(const Graph &graph, int64_t availableBytes) {
  int64_t need = interpreterPeakBytes(graph);
  if (need <= availableBytes)
    return llvm::Error::success();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return makeError("@{} needs at least {:.1f} GiB of memory on the CPU interpreter, and this machine has "
              "{:.1f} GiB available: use a smaller --batch or model, or a GPU",
              graph.name(), need / kGiB, availableBytes / kGiB);
}

llvm::Error checkHostMemory(const Graph &graph) {
  std::optional<int64_t> available = availableHostMemory();
  return available ? checkHostMemory(graph, *available) : llvm::Error::success();
}

} // namespace tgc
