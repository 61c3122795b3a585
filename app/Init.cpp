#include "app/Init.h"

#include "support/Random.h"

namespace tgc {

std::map<std::string, Tensor> initParams(const Graph &graph, uint64_t seed) {
  std::map<std::string, Tensor> params;
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::Param && op->kind() != OpKind::State)
      continue;
    const Value *v = op->result();
    Tensor t = Tensor::zeros(v->type());
    std::string init = op->attrs().getString("init").value_or("zeros");
    if (init == "ones") {
      std::fill(t.data.begin(), t.data.end(), 1.0f);
    } else if (init == "normal") {
      double std = op->attrs().getFloat("std").value_or(0.02);
      Rng rng(mix64(seed) ^ hashName(v->name()));
      for (float &x : t.data)
        x = float(rng.normal() * std);
    }
    params.emplace(v->name(), std::move(t));
  }
  return params;
}

} // namespace tgc
