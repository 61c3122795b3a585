#include "transforms/Rewrite.h"
#include "support/Error.h"

#include "ir/Attributes.h"
#include "ir/Infer.h"

namespace tgc {

Op *definedBy(Value *v, OpKind kind) {
  return v && v->def()->kind() == kind ? v->def() : nullptr;
}

std::optional<int64_t> layerOf(llvm::StringRef name) {
  if (!name.consume_front("h"))
    return std::nullopt;
  int64_t layer = 0;
  if (name.consumeInteger(10, layer) || !name.starts_with("."))
    return std::nullopt;
  return layer;
}

bool isGraphOutput(const Graph &graph, const Value *v) {
  return llvm::is_contained(graph.outputs(), v);
}

Op *soleUser(const Graph &graph, Value *v) {
  if (v->users().size() != 1 || isGraphOutput(graph, v))
    return nullptr;
  return v->users()[0];
}

bool isLinear(const Op *op) {
  auto fp8 = [](const Value *v) {
    return v->type().dtype == DType::F8E4M3 || v->type().dtype == DType::F8E5M2;
  };
  return op && op->kind() == OpKind::MatMul && op->operand(1)->type().rank() == 2 &&
         !fp8(op->operand(0)) && !fp8(op->operand(1)) &&
         matmulLayout(op->attrs()).transposeB && !matmulLayout(op->attrs()).transposeA;
}

bool isBiasSum(const Op &reduce, const Value *v) {
  if (reduce.kind() != OpKind::ReduceTo || reduce.operand(0) != v)
    return false;
  const TensorType &x = v->type(), &sum = reduce.result()->type();
  return x.rank() >= 1 && sum.rank() == 1 && sum.dim(0) == x.dim(-1);
}

Op *biasAddOf(const Graph &graph, Value *y) {
  Op *add = soleUser(graph, y);
  if (!add || add->kind() != OpKind::Add || add->operand(0) != y || add->operand(1) == y)
    return nullptr;
  const TensorType &bias = add->operand(1)->type();
  return bias.rank() == 1 && bias.dim(0) == y->type().dim(-1) ? add : nullptr;
}

llvm::Error applyReplacement(Graph &graph, llvm::ArrayRef<Op *> pattern, Replacement r,
                             llvm::DenseSet<const Op *> *erased, bool sort) {
  auto types = inferResultTypes(r.kind, r.operands, r.attrs);
  if (!types)
    return types.takeError();
  if (types->size() != r.replaces.size() + r.newResults.size())
    return makeError("fused {} has {} results but replaces {} values and adds {}", opInfo(r.kind).name.str().c_str(),
                     types->size(), r.replaces.size(), r.newResults.size());
  std::vector<std::string> temporary;
  for (Value *old : r.replaces)
    temporary.push_back(graph.uniqueName(old->name() + ".fused"));
  for (const std::string &name : r.newResults)
    temporary.push_back(graph.uniqueName(name));
  Op *fused = graph.createOp(r.kind, r.operands, r.attrs, *types, temporary, pattern.back());
  for (unsigned i = 0; i < r.replaces.size(); ++i)
    graph.replaceAllUsesWith(r.replaces[i], fused->result(i));
  // Erase from the last op of the pattern up, as each becomes unused.
  for (auto it = pattern.rbegin(); it != pattern.rend(); ++it) {
    bool unused = true;
    for (unsigned i = 0; i < (*it)->numResults(); ++i)
      unused &= !(*it)->result(i)->hasUses() && !isGraphOutput(graph, (*it)->result(i));
    if (unused) {
      if (erased)
        erased->insert(*it);
      graph.eraseOp(*it);
    }
  }
  for (unsigned i = 0; i < r.replaces.size(); ++i) {
    std::string name = temporary[i].substr(0, temporary[i].rfind(".fused"));
    if (!graph.lookup(name))
      graph.rename(fused->result(i), name);
  }
  if (sort)
    graph.sortTopologically();
  return llvm::Error::success();
}

Op *copyOpBefore(Graph &graph, const Op &op, Op *before) {
  std::vector<TensorType> types;
  std::vector<std::string> names;
  for (unsigned r = 0; r < op.numResults(); ++r) {
    types.push_back(op.result(r)->type());
    names.push_back(graph.uniqueName(op.result(r)->name() + ".again"));
  }
  llvm::SmallVector<Value *, 5> operands(op.operands().begin(), op.operands().end());
  return graph.createOp(op.kind(), operands, op.attrs(), types, names, before);
}

void copyGemmDType(const Op &gemm, AttrMap &fused) {
  copyGemmPrecision(gemm.attrs(), fused);
}

bool isNorm(const Op *op) {
  return op && (op->kind() == OpKind::LayerNorm || op->kind() == OpKind::RMSNorm);
}

AttrMap normAttrs(const Op *norm) {
  AttrMap attrs;
  attrs.set("norm", std::string(norm->kind() == OpKind::LayerNorm ? "layer_norm" : "rms_norm"));
  attrs.set("eps", *norm->attrs().getFloat("eps"));
  return attrs;
}

llvm::Expected<bool> FusionPass::run(Graph &graph) {
  // Sweeps over the ops until one rewrites nothing. A sweep goes on past each rewrite (skipping
  // the ops it erased) and the graph is put back in order once a sweep: restarting and sorting
  // after every rewrite made deep models quadratic (a 512-layer GPT took seconds a pass).
  size_t maxRewrites = 4 * graph.numOps() + 64, rewrites = 0;
  bool changed = false, progress = true;
  while (progress) {
    progress = false;
    llvm::DenseSet<const Op *> erased; // (their addresses may be reused by later ops: per sweep)
    for (Op *op : graph.ops()) {
      if (erased.count(op))
        continue;
      std::optional<FusionMatch> m = match(graph, op);
      if (!m)
        continue;
      if (auto err = applyReplacement(graph, m->pattern, std::move(m->replacement), &erased, /*sort=*/false))
        return std::move(err);
      if (++rewrites > maxRewrites)
        return makeError("{} did not reach a fixed point after {} rewrites (a pattern that keeps "
                         "matching its own output?)",
                         name().str().c_str(), maxRewrites);
      changed = progress = true;
    }
    if (progress)
      graph.sortTopologically();
  }
  return changed;
}

std::optional<SwigluPattern> matchSwiglu(const Graph &graph, Op *mul) {
  if (!mul || mul->kind() != OpKind::Mul)
    return std::nullopt;
  Op *silu = definedBy(mul->operand(0), OpKind::Silu);
  Op *up = definedBy(mul->operand(1), OpKind::Slice);
  Op *gate = silu ? definedBy(silu->operand(0), OpKind::Slice) : nullptr;
  if (!silu || !up || !gate || gate->operand(0) != up->operand(0) || soleUser(graph, mul->operand(0)) != mul ||
      soleUser(graph, mul->operand(1)) != mul || soleUser(graph, silu->operand(0)) != silu)
    return std::nullopt;
  Value *h = gate->operand(0);
  int64_t width = h->type().dim(-1), axis = int64_t(h->type().rank()) - 1;
  auto isHalf = [&](Op *slice, int64_t start) {
    return slice->attrs().getInt("axis") == axis && slice->attrs().getInt("start") == start &&
           slice->attrs().getInt("size") == width / 2 && width % 2 == 0;
  };
  if (!isHalf(gate, 0) || !isHalf(up, width / 2) || h->users().size() != 2 || isGraphOutput(graph, h))
    return std::nullopt;
  return SwigluPattern{mul, silu, gate, up, h};
}

} // namespace tgc
