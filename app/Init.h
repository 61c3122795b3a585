// Parameter initialisation from the init attributes the builder puts on each param op.
#pragma once

#include "backends/Tensor.h"
#include "ir/Graph.h"

#include <map>
#include <string>

namespace tgc {

/// One tensor per param and state op, keyed by name. Each parameter draws from its own stream seeded by
/// (seed, name), so a parameter's values do not depend on the order of the graph.
std::map<std::string, Tensor> initParams(const Graph &graph, uint64_t seed);

} // namespace tgc
