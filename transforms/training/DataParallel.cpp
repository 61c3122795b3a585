// data-parallel: the training program of one rank of a data-parallel run. Each rank runs the
// forward and backward of its share of the global batch; this pass makes the ranks agree before
// anything depends on the whole batch:
// - the parameters' gradients are averaged over the ranks (all_reduce {reduce = "avg"}), in
//   buckets of about PassOptions::dataParallel.bucketBytes in the order the backward produces
//   them, each placed right after its last gradient, so that the GPU reduces a bucket while the
//   backward computes the next (PyTorch DDP's buckets); the clipping norm and AdamW then read the
//   averages, and every rank takes the same step;
// - the loss output is the average of the ranks' losses (the loss of the global batch, each
//   rank's share being equal);
// - under FP8, each quantized tensor's amax is the maximum over the ranks before its scale is
//   updated (Transformer Engine's reduce_amax) and the saturation counts are summed, so every
//   rank keeps the same scaling state.
// Under shard: gradients (ZeRO-2) the buckets are reduce_scatter {reduce = "avg"}: each rank keeps
// its shard of each averaged gradient (what the adamw pass then updates), the loss gets an
// all_reduce of its own. Under shard: optimizer (ZeRO-1) they are all-reduced as unsharded, and
// the adamw pass takes each rank's part of them.
// Under grad_reduce: bf16 the gradients' collectives carry dtype = "bf16": each rank's values
// cross the ranks rounded to BF16 (half the bytes), and the results are rounded to BF16 too.
// Runs after fp8-update and before adamw. With one rank it changes nothing.
#include "models/ProgramInterface.h"
#include "support/Error.h"
#include "transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"

#include <algorithm>
#include <fmt/format.h>

namespace tgc {
namespace {

class DataParallelPass : public Pass {
public:
  explicit DataParallelPass(DataParallelOptions options) : options_(options) {}
  llvm::Expected<bool> run(Graph &graph) override {
    if (options_.ranks <= 1)
      return false;
    if (graph.lookup(program::kStep))
      return stringError("data-parallel runs before adamw: the graph already has its optimizer");
    std::vector<Op *> ops = graph.ops();
    llvm::DenseMap<const Op *, size_t> index;
    for (size_t i = 0; i < ops.size(); ++i) {
      index[ops[i]] = i;
      if (ops[i]->kind() == OpKind::AllReduce)
        return stringError("data-parallel already ran on this graph");
    }
    // The parameters' gradients in the order the backward produces them.
    std::vector<Value *> grads;
    for (Op *op : ops)
      if (op->kind() == OpKind::Param)
        if (Value *g = graph.lookup(program::gradientOf(op->result()->name())); g && g->def())
          grads.push_back(g);
    if (grads.empty())
      return stringError("no parameter has a gradient: run autodiff before data-parallel");
    std::stable_sort(grads.begin(), grads.end(),
                     [&](Value *a, Value *b) { return index.lookup(a->def()) < index.lookup(b->def()); });
    std::vector<std::vector<Value *>> buckets(1);
    int64_t bytes = 0;
    for (Value *g : grads) {
      if (bytes >= options_.bucketBytes) {
        buckets.emplace_back();
        bytes = 0;
      }
      buckets.back().push_back(g);
      bytes += g->type().numElements() * 4;
    }
    auto loss = program::outputIndex(graph, program::kLoss);
    Builder b(graph);
    const bool shard = options_.shardGradients; // ZeRO-2 (ZeRO-1 all-reduces as unsharded)
    for (size_t k = 0; k < buckets.size(); ++k) {
      std::vector<Value *> operands = buckets[k];
      bool withLoss = loss && k + 1 == buckets.size();
      // Right after the bucket's last gradient (or at the end).
      size_t last = index.lookup(buckets[k].back()->def());
      b.setInsertionPoint(last + 1 < ops.size() ? ops[last + 1] : nullptr);
      // The loss goes with the last bucket, or alone where the gradients are reduced otherwise
      // (in shards, or in BF16).
      bool lossAlone = shard || options_.bf16Gradients;
      if (lossAlone && withLoss &&
          !reduceOver(graph, b, {graph.outputs()[*loss]}, OpKind::AllReduce, graph.outputs()[*loss], false))
        break;
      if (withLoss && !lossAlone)
        operands.push_back(graph.outputs()[*loss]);
      OpKind kind = shard ? OpKind::ReduceScatter : OpKind::AllReduce;
      if (!reduceOver(graph, b, operands, kind, /*outputOnly=*/withLoss && !lossAlone ? operands.back() : nullptr))
        break;
    }
    // FP8: the amaxes and saturation counts of this step, before the first scale update.
    std::vector<Op *> updates;
    for (Op *op : ops)
      if (op->kind() == OpKind::Fp8Update)
        updates.push_back(op);
    if (!updates.empty()) {
      b.setInsertionPoint(updates.front());
      for (auto [operand, reduce] : {std::pair{2u, "max"}, std::pair{4u, "sum"}}) {
        std::vector<Value *> values;
        for (Op *u : updates)
          values.push_back(u->operand(operand));
        Op *all = b.createOp(OpKind::AllReduce, values, attrs({{"reduce", std::string(reduce)}}),
                             graph.uniqueName(values.front()->name() + ".all"));
        if (!all)
          break;
        for (size_t i = 0; i < updates.size(); ++i) {
          if (i > 0) // each result named after its operand
            graph.rename(all->result(unsigned(i)), graph.uniqueName(values[i]->name() + ".all"));
          updates[i]->setOperand(operand, all->result(unsigned(i)));
        }
      }
    }
    if (auto err = b.takeError())
      return std::move(err);
    return true;
  }

private:
  /// One all_reduce {reduce = "avg"} over `values` (reduce_scatter: this rank's shards), whose
  /// results take their names (the values become NAME.local) and their uses; `outputOnly`'s
  /// result replaces it only as a graph output.
  Op *reduceOver(Graph &graph, Builder &b, const std::vector<Value *> &values, OpKind kind, Value *outputOnly,
                 bool gradients = true) const {
    std::vector<std::string> names;
    for (Value *v : values) {
      names.push_back(v->name());
      graph.rename(v, graph.uniqueName(v->name() + ".local"));
    }
    AttrMap a = attrs({{"reduce", std::string("avg")}});
    if (gradients && options_.bf16Gradients)
      a.set("dtype", std::string("bf16"));
    if (kind == OpKind::ReduceScatter) {
      a.set("ranks", int64_t(options_.ranks));
      a.set("rank", int64_t(options_.rank));
    }
    Op *all = b.createOp(kind, values, std::move(a), graph.uniqueName(names.front() + ".all"));
    if (!all)
      return nullptr;
    for (size_t i = 0; i < values.size(); ++i) {
      Value *result = all->result(unsigned(i));
      graph.rename(result, names[i]);
      if (values[i] == outputOnly) {
        for (unsigned o = 0; o < graph.outputs().size(); ++o)
          if (graph.outputs()[o] == values[i])
            graph.setOutput(o, result);
        continue;
      }
      graph.replaceAllUsesWith(values[i], result);
      all->setOperand(unsigned(i), values[i]); // its own operand stays the rank's value
    }
    return all;
  }
  DataParallelOptions options_;
};

} // namespace

std::unique_ptr<Pass> createDataParallelPass(const DataParallelOptions &options) {
  return std::make_unique<DataParallelPass>(options);
}

} // namespace tgc
