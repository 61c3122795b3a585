#include "app/Init.h"

#include "support/Random.h"

#include "llvm/Support/Parallel.h"

#include <algorithm>

namespace tgc {

namespace {
/// Elements a task of the parallel fill takes.
constexpr int64_t kInitChunk = int64_t(1) << 20;
} // namespace

std::vector<NormalLeaf> normalLeaves(const Graph &graph, uint64_t seed) {
  std::vector<NormalLeaf> leaves;
  for (const Op *op : graph.ops()) {
    if ((op->kind() != OpKind::Param && op->kind() != OpKind::State) || op->attrs().getString("init") != "normal")
      continue;
    NormalLeaf leaf{op->result()->name(), mix64(seed) ^ hashName(op->result()->name()),
                    op->attrs().getFloat("std").value_or(0.02)};
    if (auto whole = shardedParamWhole(*op)) { // a shard: its part of the whole's draws
      int64_t n = op->result()->type().numElements();
      leaf.first = op->attrs().getInt("rank").value_or(0) * n;
      leaf.count = std::clamp<int64_t>(whole->numElements() - leaf.first, 0, n);
    }
    leaves.push_back(std::move(leaf));
  }
  return leaves;
}

llvm::Error initLeaves(Executor &executor, const Graph &graph, uint64_t seed, ZeroLeaves zeros) {
  std::set<std::string> drawn;
  for (const NormalLeaf &leaf : normalLeaves(graph, seed)) {
    if (leaf.count >= 0)
      continue; // a shard: drawn on the host (the executor fills whole tensors)
    auto filled = executor.fillNormal(leaf.name, leaf.stream, leaf.std);
    if (!filled)
      return filled.takeError();
    if (*filled)
      drawn.insert(leaf.name);
  }
  return executor.bindAll(initParams(graph, seed, zeros, drawn));
}

std::map<std::string, Tensor> initParams(const Graph &graph, uint64_t seed, ZeroLeaves zeros,
                                         const std::set<std::string> &skipped) {
  std::map<std::string, Tensor> params;
  struct NormalFill {
    std::vector<float> *data;
    uint64_t stream;
    double std;
    int64_t count; // the elements drawn (the rest stay zero)
  };
  std::vector<NormalFill> normals;
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    const Value *v = op->result();
    std::string init = op->attrs().getString("init").value_or("zeros");
    if ((init != "ones" && init != "normal" && zeros == ZeroLeaves::Omit) || skipped.count(v->name()) ||
        init == "prologue") // (made from the others: Executor::runPrologue)
      continue;
    Tensor &t = params.emplace(v->name(), Tensor::zeros(v->type())).first->second;
    if (init == "ones")
      std::fill(t.data.begin(), t.data.end(), 1.0f);
  }
  for (const NormalLeaf &leaf : normalLeaves(graph, seed))
    if (!skipped.count(leaf.name)) {
      std::vector<float> &data = params.at(leaf.name).data;
      // A shard's element i is the whole's first + i: the stream's draws 2(first + i), 2(first + i) + 1.
      normals.push_back({&data, leaf.stream + uint64_t(2 * leaf.first), leaf.std,
                         leaf.count < 0 ? int64_t(data.size()) : leaf.count});
    }
  // The normal draws, in chunks of every tensor on every core: element i of a tensor is the
  // normal of its stream's draws 2i and 2i+1, whichever task computes it.
  std::vector<std::pair<size_t, int64_t>> tasks; // (tensor, first element)
  for (size_t t = 0; t < normals.size(); ++t)
    for (int64_t begin = 0; begin < normals[t].count; begin += kInitChunk)
      tasks.emplace_back(t, begin);
  llvm::parallelFor(0, tasks.size(), [&](size_t k) {
    const NormalFill &fill = normals[tasks[k].first];
    int64_t begin = tasks[k].second, end = std::min<int64_t>(begin + kInitChunk, fill.count);
    Rng rng(fill.stream + uint64_t(2 * begin));
    for (int64_t i = begin; i < end; ++i)
      (*fill.data)[i] = float(rng.normal() * fill.std);
  });
  return params;
}

} // namespace tgc
