// Checkpoints: safetensors files (every param and state tensor, fp32, by its IR name) with tgc's
// metadata as JSON under the "tgc" key of __metadata__. Written atomically: a crash or a bad
// input never leaves a half-written file under the target name.
#pragma once

#include "backends/Tensor.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"

#include <functional>
#include <map>
#include <string>

namespace tgc {

struct Checkpoint {
  std::map<std::string, Tensor> tensors;
  llvm::json::Object meta; // model (YAML text), step, seed, data position, precision, ...
};

llvm::Error writeCheckpoint(llvm::StringRef path, const Checkpoint &checkpoint);

/// A tensor of a checkpoint written a tensor at a time: its name and shape (stored F32).
struct CheckpointEntry {
  std::string name;
  TensorType type;
};
using TensorProducer = std::function<llvm::Expected<std::vector<float>>(const CheckpointEntry &)>;
/// Writes the checkpoint of `entries` and `meta`, asking `produce` for each tensor's values in
/// turn (in name order): one tensor is held at a time, so a checkpoint converted from a
/// multi-GB one is never in memory whole. The bytes writeCheckpoint writes for the same tensors;
/// atomically, and nothing is left where `produce` fails.
llvm::Error writeCheckpointStreamed(llvm::StringRef path, std::vector<CheckpointEntry> entries,
                                    const llvm::json::Object &meta, const TensorProducer &produce);
/// The bytes writeCheckpoint writes (`path` names the file in errors).
llvm::Expected<std::string> formatCheckpoint(const Checkpoint &checkpoint, llvm::StringRef path);
/// Reads and checks the file: header, offsets, dtypes and shapes; errors name the file. Only the
/// tensors `wanted` accepts are copied out (all by default; the layout is checked whole).
llvm::Expected<Checkpoint> readCheckpoint(llvm::StringRef path,
                                          const std::function<bool(llvm::StringRef)> &wanted = nullptr);
/// readCheckpoint of a file's bytes (the fuzzer's entry, tests/fuzz/FuzzCheckpoint.cpp).
llvm::Expected<Checkpoint> parseCheckpoint(llvm::StringRef bytes, llvm::StringRef path,
                                           const std::function<bool(llvm::StringRef)> &wanted = nullptr);
/// An error naming the tensors of `checkpoint` that hold NaN or Inf (a run that diverged wrote
/// it), or success.
llvm::Error checkFinite(const Checkpoint &checkpoint, llvm::StringRef path);

/// How many checkpoints a run's saves hold on disk at once, at most: a save is written beside
/// the checkpoints still there (the last save, or with `keep` > 1 the last `keep` kept as
/// FILE.step-N) before the rename and the rotation free one. The run trains steps (start,
/// total], saves every `saveEvery` steps (0: never) before the last and once at the end.
int64_t checkpointsAtOnce(int64_t start, int64_t total, int64_t saveEvery, int64_t keep);

} // namespace tgc
