// Training: compiles the training program of a model description, owns its executor and data
// stream, runs steps, and saves and restores checkpoints.
#pragma once

#include "app/Checkpoint.h"
#include "app/Data.h"
#include "backends/Executor.h"
#include "driver/Program.h"
#include "ir/Graph.h"
#include "models/ModelConfig.h"

#include <cmath>
#include <memory>

namespace tgc {

struct StepRecord {
  int64_t step = 0; // 1-based
  double loss = 0;
  double lr = 0;
  double gradNorm = 0; // before clipping
  double stepMs = 0;
  /// A step whose loss or gradients are not finite. Where the gradients are not, the update
  /// was skipped on the device (clip_scale's 0: the weights and moments did not change).
  bool notFinite() const { return !std::isfinite(loss) || !std::isfinite(gradNorm); }
};


/// A checkpoint's metadata: the model description (and its digest), the step, the seed, the
/// data (its description and file, and the position: the steps trained on it) and the recipe.
llvm::json::Object checkpointMetadata(const ModelConfig &config, int64_t step, llvm::StringRef dataSource,
                                      llvm::StringRef dataPath);

class Trainer {
public:
  /// `config.train` holds the effective settings (flags already applied). `dataPath` empty
  /// means the arithmetic task. On the GPU the program is compiled by gpuPipeline (see
  /// compileForDevice).
  ///
  /// With a `communicator` of N ranks, this trainer is one rank of a data-parallel run:
  /// config.train.batch stays the global batch, of which this rank trains rows [rank * B / N,
  /// (rank + 1) * B / N) at each step (the rows one rank would train there, so that the data of a
  /// rank is a function of seed, step and rank, and resuming on any number of ranks continues
  /// the same stream); the gradients, the loss and the FP8 amaxes are reduced over the ranks
  /// (the data-parallel pass), so every rank holds the same weights and state after each step.
  static llvm::Expected<std::unique_ptr<Trainer>> create(const ModelConfig &config,
                                                         llvm::StringRef dataPath = "",
                                                         Device device = Device::cpu(),
                                                         Communicator *communicator = nullptr);

  /// Runs the next step: nextBatch() then step(batch).
  llvm::Expected<StepRecord> step();
  /// The next step's batch (the whole global batch). An error here (the data cannot be read)
  /// leaves the trainer at its last finished step, which can still be saved.
  llvm::Expected<Batch> nextBatch() const { return data_->batch(stepsDone_, config_.train.batch); }
  /// Runs the next step on `batch`, from nextBatch().
  llvm::Expected<StepRecord> step(Batch batch);
  int64_t stepsDone() const { return stepsDone_; }
  const ModelConfig &config() const { return config_; }
  /// What recompute: auto chose (driver/RecomputeBudget.h), empty where it chose nothing.
  const std::string &recomputeNote() const { return recomputeNote_; }
  const Graph &program() const { return *program_; }
  const DataSource &data() const { return *data_; }
  const Executor &executor() const { return *executor_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  Executor &executor() { return *executor_; }

  /// Every parameter and state tensor plus the metadata to resume. Under shard: optimizer the
  /// moments are gathered from every rank (each rank calls it, at the same step), so that the
  /// checkpoint is an unsharded run's and resumes on any number of ranks.
  llvm::Expected<Checkpoint> checkpoint() const;
  /// The FP8 scaling state alone (what summarizeFp8State reads): a few small tensors, where
  /// checkpoint() copies every parameter and moment to the host.
  llvm::Expected<std::map<std::string, Tensor>> fp8State() const;
  /// Continues from a checkpoint of the same model: weights, optimizer state, step, data
  /// position. A checkpoint of another model is an error naming the difference.
  llvm::Error resume(const Checkpoint &checkpoint, llvm::StringRef path);
  /// Starts from a checkpoint's weights alone (fine-tuning: a converted Hugging Face model, or
  /// another run's weights): the optimizer's moments, the FP8 scaling state, the step and the
  /// data start afresh. The checkpoint's model must have this one's architecture.
  llvm::Error initFrom(const Checkpoint &checkpoint, llvm::StringRef path);
  /// The tokenizer (its file's text) the model reads and writes, which its checkpoints carry.
  void setTokenizer(std::string text) { tokenizer_ = std::move(text); }

private:
  /// Binds the checkpoint's parameters (and with `withState` its state: the optimizer's moments,
  /// the FP8 scaling state); an error names a missing tensor or one of another shape.
  llvm::Error bindFrom(const Checkpoint &checkpoint, llvm::StringRef path, bool withState);
  /// The checkpoint's model, or an error (`message`'s three {}: its name, this model's, what
  /// differs) where its architecture is not this one's.
  llvm::Expected<ModelConfig> fittingModel(const Checkpoint &checkpoint, llvm::StringRef path,
                                           const char *message) const;

  /// Under shard: optimizer, the type of the whole tensor of which leaf `op` holds this rank's
  /// shard: an AdamW moment's parameter's (a state of the shard's size), or a parameter kept as
  /// its shard's ({whole}: an FP8 weight, ShardedFp8Weights.h). Else none.
  std::optional<TensorType> wholeOf(const Op &op) const;
  /// This rank's part of `whole` flattened and zero-padded: a tensor of type `shard`.
  Tensor shardOf(const Tensor &whole, const TensorType &shard) const;
  /// Every rank's `shard` gathered into a tensor of type `whole` (a collective: every rank calls
  /// it, in the same order).
  llvm::Expected<Tensor> gatherShards(const Tensor &shard, const TensorType &whole) const;

  ModelConfig config_;
  std::unique_ptr<Graph> program_;
  std::unique_ptr<Executor> executor_;
  struct OutputIndices {
    size_t loss = 0, learningRate = 0, gradNormSquared = 0;
  } outputs_; // where the run's results hold what the trainer reads
  std::unique_ptr<DataSource> data_;
  std::string dataPath_;
  std::string recomputeNote_;
  int64_t stepsDone_ = 0;
  std::string tokenizer_;
  int rank_ = 0, ranks_ = 1;
  Communicator *communicator_ = nullptr; // the ranks', where there are several
};

/// The model description stored in a checkpoint.
llvm::Expected<ModelConfig> checkpointModel(const Checkpoint &checkpoint, llvm::StringRef path);
/// The first architecture field in which two descriptions differ, or "" when they agree.
std::string architectureDifference(const ModelConfig &a, const ModelConfig &b);

} // namespace tgc
