#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "support/Error.h"
#include "transforms/Pass.h"
#include "transforms/Passes.h"

#include <fmt/format.h>

namespace tgc {

namespace {
struct PassEntry {
  const char *name;
  const char *summary;
  std::unique_ptr<Pass> (*create)(const PassOptions &);
};

const PassEntry kPasses[] = {
#define PASS(Name, Summary, Constructor)                                                           \
  {Name, Summary, [](const PassOptions &o) -> std::unique_ptr<Pass> { (void)o; return Constructor; }},
#include "transforms/Passes.def"
};

} // namespace

std::unique_ptr<Pass> createPass(llvm::StringRef name, const PassOptions &options) {
  for (const PassEntry &entry : kPasses)
    if (name == entry.name) {
      std::unique_ptr<Pass> pass = entry.create(options);
      pass->name_ = entry.name;
      pass->summary_ = entry.summary;
      return pass;
    }
  return nullptr;
}

std::vector<std::string> allPassNames() {
  std::vector<std::string> names;
  for (const PassEntry &entry : kPasses)
    names.push_back(entry.name);
  return names;
}

std::vector<std::string> fusionPasses() {
  // Larger patterns first: attention and the MLP before LayerNorm+Linear takes their norms;
  // softmax, residual-norm and the bias epilogues then fuse what those left (with them
  // disabled, say, or on the GPU, which does not lower all of them).
  return {"fuse-attention",       "fuse-softmax",       "fuse-layernorm-mlp",  "fuse-swiglu",
          "fuse-layernorm-linear", "fuse-residual-norm", "fuse-bias-activation",
          "fuse-bias",             "fuse-cross-entropy"};
}

// assign-precision runs after attention fusion and before the LayerNorm fusions: an FP8 linear
// layer's quantize ops then stand between its norm and its GEMM, so LayerNorm+Linear/MLP fuse
// only the BF16 and fp32 ones (fusing the FP8 cast into the norm is the GPU backend's part).
std::vector<std::string> forwardPipeline() {
  std::vector<std::string> passes{"cse"};
  for (const std::string &p : fusionPasses()) {
    passes.push_back(p);
    if (p == "fuse-attention")
      passes.push_back("assign-precision");
  }
  passes.push_back("prune-last-rows"); // (a prompt's program: nothing elsewhere)
  passes.push_back("dce");
  return passes;
}

// Fusion runs before autodiff: the backward comes from the fused ops' own gradient rules,
// which are fused too (and recompute instead of storing), so the backward needs no patterns
// of its own and stays as fused as the forward. fp8-update follows autodiff, which adds the
// gradients' quantize ops; data-parallel (a no-op on one rank) then reduces over the ranks what
// the optimizer and the scale updates read.
std::vector<std::string> trainingPipeline() {
  std::vector<std::string> passes = forwardPipeline();
  passes.pop_back(); // dce last
  for (const char *p : {"autodiff", "concat-pads", "fp8-update", "data-parallel", "adamw", "dce"})
    passes.push_back(p);
  return passes;
}

OpCounts countOps(const Graph &graph) {
  OpCounts counts;
  for (const Op *op : graph.ops())
    ++counts[op->name().str()];
  return counts;
}

void printOpCountTable(const OpCounts &before, const OpCounts &after, llvm::raw_ostream &os) {
  std::map<std::string, std::pair<int64_t, int64_t>> rows;
  int64_t totalBefore = 0, totalAfter = 0;
  for (const auto &[name, n] : before) {
    rows[name].first = n;
    totalBefore += n;
  }
  for (const auto &[name, n] : after) {
    rows[name].second = n;
    totalAfter += n;
  }
  os << fmt::format("{:<24}{:>10}{:>10}\n", "op", "before", "after");
  for (const auto &[name, counts] : rows)
    os << fmt::format("{:<24}{:>10}{:>10}\n", name, counts.first, counts.second);
  os << fmt::format("{:<24}{:>10}{:>10}\n", "total", totalBefore, totalAfter);
  // What runs: everything but leaves (inputs, parameters, state, constants) and assigns.
  auto computing = [](const OpCounts &counts) {
    int64_t n = 0;
    for (const auto &[name, count] : counts) {
      auto kind = parseOpKind(name);
      if (kind && !isLeaf(*kind) && !hasSideEffects(*kind))
        n += count;
    }
    return n;
  };
  os << fmt::format("{:<24}{:>10}{:>10}\n", "compute ops", computing(before), computing(after));
}

static llvm::Error unknownPass(llvm::StringRef name) {
  std::string known;
  for (const std::string &n : allPassNames())
    known += (known.empty() ? "" : ", ") + n;
  return makeError("error: unknown pass '{}' (passes: {})", name.str().c_str(), known.c_str());
}

llvm::Expected<PassPipeline> PassPipeline::create(llvm::ArrayRef<std::string> names,
                                                  PipelineOptions options) {
  for (const std::string &name : options.disabled)
    if (!createPass(name))
      return unknownPass(name);
  for (const std::string &name : options.dumpAfter)
    if (name != "all" && !createPass(name))
      return unknownPass(name);
  PassPipeline pipeline;
  for (const std::string &name : names) {
    auto pass = createPass(name, options.passOptions);
    if (!pass)
      return unknownPass(name);
    if (!llvm::is_contained(options.disabled, name))
      pipeline.passes_.push_back(std::move(pass));
  }
  pipeline.options_ = std::move(options);
  return std::move(pipeline);
}

std::vector<std::string> PassPipeline::passNames() const {
  std::vector<std::string> names;
  for (const auto &pass : passes_)
    names.push_back(pass->name().str());
  return names;
}

llvm::Error PassPipeline::run(Graph &graph) {
  if (auto err = verify(graph))
    return makeError("invalid input graph: {}", llvm::toString(std::move(err)).c_str());
  llvm::raw_ostream &dump = options_.dumpStream ? *options_.dumpStream : llvm::errs();
  for (const auto &pass : passes_) {
    auto changed = pass->run(graph);
    if (!changed)
      return makeError("pass {} failed: {}", pass->name().str().c_str(), llvm::toString(changed.takeError()).c_str());
    if (auto err = verify(graph))
      return makeError("pass {} produced an invalid graph: {}", pass->name().str().c_str(),
                       llvm::toString(std::move(err)).c_str());
    if (llvm::is_contained(options_.dumpAfter, "all") ||
        llvm::is_contained(options_.dumpAfter, pass->name().str())) {
      dump << "// ----- IR after " << pass->name() << (*changed ? "" : " (unchanged)")
           << " -----\n";
      printGraph(graph, dump);
    }
  }
  return llvm::Error::success();
}

} // namespace tgc
