// Parameter initialisation from the init attributes the builder puts on each param op.
#pragma once

#include "backends/Executor.h"
#include "backends/Tensor.h"
#include "ir/Graph.h"

#include <map>
#include <set>
#include <string>
#include <vector>

namespace tgc {

/// Which leaves initParams makes.
enum class ZeroLeaves {
  Include, // every param and state op (the CPU interpreter needs each leaf bound)
  Omit,    // not those whose init is zeros: an executor whose buffers start at zero (the GPU's)
};

/// One tensor per param and state op, keyed by name. Each parameter draws from its own stream
/// seeded by (seed, name), so a parameter's values do not depend on the order of the graph;
/// element i takes the stream's draws 2i and 2i+1, so the tensors are filled on all cores with
/// the same bits as on one.
std::map<std::string, Tensor> initParams(const Graph &graph, uint64_t seed,
                                         ZeroLeaves zeros = ZeroLeaves::Include,
                                         const std::set<std::string> &skipped = {});

/// A leaf initialised from a normal distribution: its stream (from the seed and its name) and
/// standard deviation. A parameter held as this rank's shard (a param {whole, rank, ranks}:
/// ShardedFp8Weights.h) takes the whole's elements from `first` on, `count` of them (its
/// padding past the whole's end stays zero): the bits its part of the whole would have.
struct NormalLeaf {
  std::string name;
  uint64_t stream;
  double std;
  int64_t first = 0;
  int64_t count = -1; // all
};
std::vector<NormalLeaf> normalLeaves(const Graph &graph, uint64_t seed);

/// Binds initParams' leaves to `executor`; the normal ones the executor draws itself
/// (Executor::fillNormal: the GPU, from the same streams, nothing copied) it is left to.
llvm::Error initLeaves(Executor &executor, const Graph &graph, uint64_t seed, ZeroLeaves zeros);

} // namespace tgc
