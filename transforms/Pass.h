// The pass interface and the pipeline that runs passes, verifying after each.
#pragma once

#include "ir/Graph.h"
#include "models/ModelConfig.h"

#include "llvm/Support/raw_ostream.h"

#include <map>
#include <memory>
#include <vector>

namespace tgc {

struct PassOptions;

/// A pass rewrites a graph in place. Passes keep no state across runs. Each is a row of
/// Passes.def, which gives its name and summary; createPass makes it.
class Pass {
public:
  virtual ~Pass() = default;
  /// Its name in Passes.def (a pass made outside the table, in a test, names itself).
  virtual llvm::StringRef name() const { return name_; }
  virtual llvm::StringRef description() const { return summary_; }
  /// Returns whether the graph changed.
  virtual llvm::Expected<bool> run(Graph &graph) = 0;

private:
  friend std::unique_ptr<Pass> createPass(llvm::StringRef name, const PassOptions &options);
  std::string name_, summary_;
};

/// The data-parallel pass's settings: how many ranks share the global batch, and the bytes of
/// gradients each all_reduce takes (PyTorch DDP's bucket_cap_mb is 25 MiB).
struct DataParallelOptions {
  int ranks = 1;
  int rank = 0; // this program's rank (ZeRO's shards are the rank's own)
  int64_t bucketBytes = int64_t(25) << 20;
  /// ZeRO: AdamW's moments and update on this rank's shard of each parameter, the parameters
  /// all-gathered after (TrainConfig::shardOptimizer); with shardGradients (ZeRO-2) the gradients
  /// reduce-scattered instead of all-reduced.
  bool shardOptimizer = false, shardGradients = false;
  /// The gradients reduced in BF16 (TrainConfig::bf16GradientReduce): the buckets' collectives
  /// carry dtype = "bf16".
  bool bf16Gradients = false;
};

/// What passes that need settings read (the optimizer's hyperparameters).
struct PassOptions {
  PassOptions() { precision.recipe = Recipe::Fp32; }
  TrainConfig train;
  PrecisionConfig precision; // the recipe resolved: fp32, bf16 or fp8 (see resolveRecipe)
  DataParallelOptions dataParallel;
};

/// Every pass tgc has, by name.
std::unique_ptr<Pass> createPass(llvm::StringRef name, const PassOptions &options = {});
std::vector<std::string> allPassNames();
/// The fusion passes in the order the pipelines run them.
std::vector<std::string> fusionPasses();
/// The passes that turn the builder's forward graph into the inference program.
std::vector<std::string> forwardPipeline();
/// The passes that turn it into the training program: forward, loss, backward, update.
std::vector<std::string> trainingPipeline();

/// Op counts by kind, in op-table order.
using OpCounts = std::map<std::string, int64_t>;
OpCounts countOps(const Graph &graph);
void printOpCountTable(const OpCounts &before, const OpCounts &after, llvm::raw_ostream &os);

struct PipelineOptions {
  /// Pass names after which to print the IR; "all" prints after every pass.
  std::vector<std::string> dumpAfter;
  std::vector<std::string> disabled;
  llvm::raw_ostream *dumpStream = nullptr; // defaults to errs()
  PassOptions passOptions;
};

class PassPipeline {
public:
  /// Fails on unknown pass names, in the list or in the options.
  static llvm::Expected<PassPipeline> create(llvm::ArrayRef<std::string> names,
                                             PipelineOptions options);
  /// Appends a pass object (tests use this for passes outside the registry).
  void addPass(std::unique_ptr<Pass> pass) { passes_.push_back(std::move(pass)); }
  /// Runs the passes in order; the graph is verified before the first and after every pass.
  llvm::Error run(Graph &graph);
  std::vector<std::string> passNames() const;

private:
  std::vector<std::unique_ptr<Pass>> passes_;
  PipelineOptions options_;
};

} // namespace tgc
