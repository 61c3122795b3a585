// Data-parallel training in a test: each rank a thread of this process with its own Trainer,
// on the CPU (LocalGroup's ranks) or on the GPUs (NCCL ranks), the same harness for both.
#pragma once

#include "app/Trainer.h"

#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace tgc::test {

/// What one rank's run gave: its losses, every parameter and state tensor at the end, or the
/// error that stopped it.
struct RankRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> state;
  std::string error;
};

/// Where rank r runs: its device and communicator (null: one rank alone). The communicator is
/// the caller's, and outlives the trainer.
struct RankPlace {
  Device device;
  Communicator *communicator = nullptr;
};

/// `steps` steps of `config` on `ranks` threads, rank r where `place(r)` puts it. `failed` runs
/// when a rank fails, so that the others do not wait for it in a collective (LocalGroup::abort);
/// `before` runs on each rank's trainer first (a resume).
inline std::vector<RankRun> trainRanks(const ModelConfig &config, int ranks, int64_t steps,
                                       const std::function<llvm::Expected<RankPlace>(int)> &place,
                                       const std::function<void()> &failed = [] {},
                                       const std::function<llvm::Error(Trainer &)> &before = {}) {
  std::vector<RankRun> runs(ranks);
  auto body = [&](int r) {
    RankRun &run = runs[r];
    auto fail = [&](llvm::Error err) {
      run.error = llvm::toString(std::move(err));
      failed();
    };
    auto where = place(r);
    if (!where)
      return fail(where.takeError());
    auto trainer = Trainer::create(config, "", where->device, where->communicator);
    if (!trainer)
      return fail(trainer.takeError());
    if (before)
      if (llvm::Error err = before(**trainer))
        return fail(std::move(err));
    for (int64_t i = 0; i < steps; ++i) {
      auto record = (*trainer)->step();
      if (!record)
        return fail(record.takeError());
      run.losses.push_back(record->loss);
    }
    auto checkpoint = (*trainer)->checkpoint();
    if (!checkpoint)
      return fail(checkpoint.takeError());
    run.state = std::move(checkpoint->tensors);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back(body, r);
  for (std::thread &t : threads)
    t.join();
  return runs;
}

} // namespace tgc::test
