// prune-last-rows: a prompt's program (prefill) takes the last layer's output at one row a
// sequence (%last = embedding(reshape(%x), %last_rows)), so the row-wise ops that make %x
// after the last attention (its projection, the residual adds and norms, the MLP) need only
// those rows. They run on them alone: each operand such an op takes from before (the
// attention's output, the residual stream) is gathered at the rows first, and the gather of %x
// becomes the pruned value itself. Each row's arithmetic is the same, so the logits are; at 32
// prompts of 1000 tokens the last layer's products run on 32 rows instead of 32,000.
#include "ir/Attributes.h"
#include "models/ProgramInterface.h"
#include "transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <fmt/format.h>

namespace tgc {
namespace {

/// The operands of `op` that hold one row a position (the rest, weights and biases, are the
/// same for every row), where `op` computes each row of its results from those rows alone;
/// empty otherwise.
std::vector<unsigned> rowOperands(const Op &op) {
  switch (op.kind()) {
  case OpKind::Add:
  case OpKind::Mul:
  case OpKind::ResidualNorm:
    return {0, 1};
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::Swiglu:
  case OpKind::LayerNorm:
  case OpKind::RMSNorm:
  case OpKind::LayerNormLinear:
  case OpKind::LayerNormMLP:
    return {0};
  case OpKind::MatMul:
  case OpKind::MatMulBias:
  case OpKind::MatMulBiasGelu:
    if (op.attrs().getBool("transpose_a").value_or(false) || op.operand(1)->type().rank() != 2)
      return {};
    return {0};
  default:
    return {};
  }
}

class PruneLastRows : public Pass {
public:
  llvm::Expected<bool> run(Graph &graph) override {
    Value *rowsIndex = graph.lookup(program::kLastRows);
    if (!rowsIndex)
      return false;
    for (Op *gather : graph.ops())
      if (gather->kind() == OpKind::Embedding && gather->operand(1) == rowsIndex)
        if (auto pruned = prune(graph, *gather))
          return pruned;
    return false;
  }

private:
  /// The ops whose rows only `gather` reads, through `x` = the value it gathers from: `x`'s op
  /// and, back through row operands, each row-wise op all of whose results' readers are among
  /// them (in program order).
  static std::vector<Op *> prunable(const Graph &graph, const Op &reshape, const Value *x) {
    llvm::DenseSet<const Op *> taken;
    std::vector<Op *> ops = graph.ops(), order;
    auto leading = [&](const Value *v) {
      return v->type().rank() == 3 && v->type().dim(0) == x->type().dim(0) && v->type().dim(1) == x->type().dim(1);
    };
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      Op *op = *it;
      std::vector<unsigned> rows = rowOperands(*op);
      if (rows.empty() || !llvm::all_of(rows, [&](unsigned k) { return leading(op->operand(k)); }))
        continue;
      bool wanted = op == x->def(), within = true;
      for (unsigned r = 0; r < op->numResults(); ++r) {
        if (llvm::is_contained(graph.outputs(), op->result(r)) || !leading(op->result(r)))
          within = false;
        for (const Op *user : op->result(r)->users()) {
          bool inside = taken.count(user) || (user == &reshape && op->result(r) == x);
          within &= inside;
          wanted |= inside;
        }
      }
      if (wanted && within) {
        taken.insert(op);
        order.insert(order.begin(), op);
      }
    }
    return order;
  }

  llvm::Expected<bool> prune(Graph &graph, Op &gather) {
    const Op *reshape = gather.operand(0)->def();
    if (!reshape || reshape->kind() != OpKind::Reshape || gather.operand(0)->users().size() != 1)
      return false;
    Value *x = reshape->operand(0);
    if (!x->def() || x->type().rank() != 3 || x->users().size() != 1)
      return false;
    std::vector<Op *> ops = prunable(graph, *reshape, x);
    if (ops.empty() || ops.back() != x->def())
      return false;
    const int64_t B = x->type().dim(0), T = x->type().dim(1);
    Builder b(graph);
    b.setInsertionPoint(&gather);
    llvm::DenseMap<const Value *, Value *> pruned; // a value of the pruned ops -> its rows
    auto rowsOf = [&](Value *v) -> Value * {        // an operand from before: gathered at the rows
      if (Value *known = pruned.lookup(v))
        return known;
      int64_t width = v->type().dim(2);
      Value *flat = b.create(OpKind::Reshape, {v}, attrs({{"shape", std::vector<int64_t>{B * T, width}}}),
                             graph.uniqueName(v->name() + ".rows"));
      Value *rows = b.create(OpKind::Embedding, {flat, gather.operand(1)}, {}, graph.uniqueName(v->name() + ".last"));
      return pruned[v] = rows;
    };
    for (Op *op : ops) {
      std::vector<Value *> operands(op->operands().begin(), op->operands().end());
      for (unsigned k : rowOperands(*op))
        operands[k] = rowsOf(operands[k]);
      Op *made = b.createOp(op->kind(), operands, op->attrs(), graph.uniqueName(op->result()->name() + ".last"));
      if (!made)
        break;
      for (unsigned r = 0; r < op->numResults(); ++r)
        pruned[op->result(r)] = made->result(r);
    }
    if (auto err = b.takeError())
      return std::move(err);
    graph.replaceAllUsesWith(gather.result(), pruned.lookup(x));
    return true;
  }
};

} // namespace

std::unique_ptr<Pass> createPruneLastRowsPass() { return std::make_unique<PruneLastRows>(); }

} // namespace tgc
