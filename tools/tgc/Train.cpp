// tgc train: trains a model, printing the loss per step, and saves a checkpoint.
#include "app/Trainer.h"
#include "support/Files.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

#include <cmath>
#include <fmt/format.h>
#include <optional>

namespace tgc::cli {

namespace {

static cl::opt<int64_t> Fp8SummaryEvery("fp8-summary-every",
                                        cl::desc("Print the FP8 scaling summary every N steps"),
                                        cl::init(0), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<std::string> SavePath("save", cl::desc("Write a checkpoint here at the end (atomically)"),
                                     cl::value_desc("file.safetensors"), cl::sub(trainCommand()),
                                     cl::cat(category()));
static cl::opt<std::string> ResumePath("resume", cl::desc("Continue from a checkpoint of the same model"),
                                       cl::value_desc("file.safetensors"), cl::sub(trainCommand()),
                                       cl::cat(category()));
static cl::opt<std::string> LogPath("log", cl::desc("Write one JSON record per step"),
                                    cl::value_desc("file.jsonl"), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<std::string> DataPath("data", cl::desc("Train on a file: bytes of text, or uint16 tokens (.bin, .u16, .tokens)"),
                                     cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> LogEvery("log-every", cl::desc("Print every N steps (default: about 20 lines)"),
                                 cl::init(0), cl::sub(trainCommand()), cl::cat(category()));

/// Fails early, before any training, when the checkpoint could not be written there.
llvm::Error checkWritable(llvm::StringRef path) {
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  if (!llvm::sys::fs::is_directory(dir))
    return flagError(fmt::format("{}: error: folder '{}' does not exist", path.str(), dir.str().str()));
  if (llvm::sys::fs::is_directory(path))
    return flagError(fmt::format("{}: error: is a folder, not a file", path.str()));
  if (llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write))
    return flagError(fmt::format("{}: error: folder '{}' is not writable", path.str(), dir.str().str()));
  return llvm::Error::success();
}

/// Fails before training when the folder of `path` has no room for the checkpoint (the
/// parameters and the state, in fp32, and a header), rather than after the run.
llvm::Error checkFreeSpace(llvm::StringRef path, const Graph &program) {
  int64_t bytes = 1 << 20; // the header, generously
  for (const Op *op : program.ops())
    if (op->kind() == OpKind::Param || op->kind() == OpKind::State)
      bytes += op->result()->type().numElements() * 4;
  llvm::SmallString<256> dir(path);
  llvm::sys::path::remove_filename(dir);
  if (dir.empty())
    dir = ".";
  auto space = llvm::sys::fs::disk_space(dir);
  if (!space || int64_t(space->available) >= bytes)
    return llvm::Error::success();
  return flagError(fmt::format("{}: error: the checkpoint needs {:.1f} MiB and its folder has {:.1f} MiB free: "
                               "nothing was trained",
                               path.str(), bytes / 1048576.0, space->available / 1048576.0));
}

} // namespace

int runTrain() {
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  auto device = resolveDevice();
  if (!device)
    return report(device.takeError());
  // Before anything is opened for writing. --save may replace the checkpoint --resume names:
  // it is read whole first, and the new one moved into place atomically at the end.
  if (auto err = checkDistinctFiles({{"the model file", ModelPath}, {"--data", DataPath}, {"--resume", ResumePath},
                                     {"--save", SavePath}, {"--log", LogPath}},
                                    {{"--resume", "--save"}}))
    return report(std::move(err));
  for (const std::string *path : {&SavePath.getValue(), &LogPath.getValue()})
    if (!path->empty())
      if (auto err = checkWritable(*path))
        return report(std::move(err));
  std::optional<Checkpoint> resumeFrom;
  if (!ResumePath.empty()) {
    auto checkpoint = readCheckpoint(ResumePath);
    if (!checkpoint)
      return report(checkpoint.takeError());
    if (!AllowNonFinite)
      if (auto err = checkFinite(*checkpoint, ResumePath))
        return report(std::move(err));
    resumeFrom = std::move(*checkpoint);
  }
  uint64_t fileSeed = config->train.seed;
  if (resumeFrom) {
    // The data stream continues from the checkpoint's seed: a different --seed would be ignored.
    uint64_t saved = 0;
    auto savedText = resumeFrom->meta.getString("seed");
    if (savedText && !savedText->getAsInteger(10, saved) && Seed.getNumOccurrences() && saved != Seed)
      return report(flagError(fmt::format("{}: error: --seed {} conflicts with the checkpoint's seed {} (its data "
                                          "stream continues from there): drop --seed",
                                          ResumePath.getValue(), uint64_t(Seed), saved)));
  }
  auto trainer = Trainer::create(*config, DataPath, *device);
  if (!trainer)
    return report(trainer.takeError());
  Trainer &t = **trainer;
  if (resumeFrom) {
    if (auto err = t.resume(*resumeFrom, ResumePath))
      return report(std::move(err));
    if (t.stepsDone() >= t.config().train.steps)
      return report(flagError(fmt::format("{}: error: the checkpoint is at step {} and the run ends at step {}: "
                                          "nothing to train (give --steps above {}); nothing was written",
                                          ResumePath.getValue(), t.stepsDone(), t.config().train.steps,
                                          t.stepsDone())));
  }
  if (!SavePath.empty())
    if (auto err = checkFreeSpace(SavePath, t.program()))
      return report(std::move(err));
  const ModelConfig &c = t.config();
  int64_t total = c.train.steps, tokensPerStep = c.train.batch * c.seqLen;
  llvm::outs() << fmt::format("model {}: {} parameters, batch {} x {} tokens, {} steps, lr {}, "
                              "seed {}\n",
                              c.name, c.numParams(), c.train.batch, c.seqLen, total,
                              formatDouble(c.train.lr), c.train.seed);
  Recipe recipe = c.precision.recipe; // resolved by the trainer for its device
  bool emulated = recipe != Recipe::Fp32 && llvm::StringRef(t.executor().describe()).starts_with("cpu");
  llvm::outs() << fmt::format("device: {}, precision {}{}\ndata: {}\n", t.executor().describe(),
                              recipeName(recipe).str(), emulated ? " (emulated)" : "", t.data().describe());
  if (t.stepsDone())
    llvm::outs() << fmt::format("resumed from {} at step {}{}\n", ResumePath.getValue(), t.stepsDone(),
                                c.train.seed != fileSeed
                                    ? fmt::format(" (seed {} from the checkpoint; the model file says {})",
                                                  c.train.seed, fileSeed)
                                    : "");

  std::unique_ptr<llvm::raw_fd_ostream> log;
  if (!LogPath.empty()) {
    std::error_code ec;
    log = std::make_unique<llvm::raw_fd_ostream>(LogPath, ec);
    if (ec)
      return report(flagError(fmt::format("{}: error: cannot write: {}", LogPath.getValue(), ec.message())));
  }
  bool terminal = llvm::sys::Process::StandardOutIsDisplayed();
  int64_t every = LogEvery > 0 ? int64_t(LogEvery) : std::max<int64_t>(1, total / 20);
  std::vector<double> losses;
  double totalMs = 0;
  while (t.stepsDone() < total) {
    auto record = t.step();
    if (!record)
      return report(record.takeError());
    losses.push_back(record->loss);
    totalMs += record->stepMs;
    double tokensPerSecond = tokensPerStep / (record->stepMs / 1000.0);
    std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  "
                                   "{:.1f} ms  {:.0f} tok/s",
                                   record->step, total, record->loss, record->lr,
                                   record->gradNorm, record->stepMs, tokensPerSecond);
    bool print = record->step % every == 0 || record->step == 1 || record->step == total;
    if (terminal) {
      int width = 30, filled = int(width * record->step / std::max<int64_t>(total, 1));
      llvm::outs() << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] "
                   << line << (print ? "\n" : "");
      llvm::outs().flush();
    } else if (print) {
      llvm::outs() << line << "\n";
    }
    if (Fp8SummaryEvery > 0 && record->step % Fp8SummaryEvery == 0) {
      auto checkpoint = t.checkpoint();
      if (!checkpoint)
        return report(checkpoint.takeError());
      auto summary = summarizeFp8State(checkpoint->tensors, c.precision);
      llvm::outs() << fmt::format("FP8 scaling state after step {} ({} quantized tensors):\n",
                                  record->step, summary.size());
      printFp8Summary(summary, llvm::outs());
    }
    if (log)
      *log << llvm::json::Value(llvm::json::Object{{"step", record->step},
                                                   {"loss", record->loss},
                                                   {"lr", record->lr},
                                                   {"grad_norm", record->gradNorm},
                                                   {"step_ms", record->stepMs},
                                                   {"tokens_per_s", tokensPerSecond}})
           << "\n";
    // A full disk or a closed pipe is found at the step it happens, not at exit.
    if (log) {
      log->flush();
      if (log->has_error()) {
        std::string message = log->error().message();
        log->clear_error();
        return report(flagError(fmt::format("{}: error: writing the log failed at step {}: {}", LogPath.getValue(),
                                            record->step, message)));
      }
    }
  }
  if (!losses.empty()) {
    size_t tail = std::min<size_t>(10, losses.size());
    double mean = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i)
      mean += losses[i] / tail;
    llvm::outs() << fmt::format("final loss {:.4f} (mean of the last {}: {:.4f})   random guess "
                                "ln(V) {:.4f}",
                                losses.back(), tail, mean, std::log(double(c.vocab)));
    if (double floor = t.data().lossFloor(); floor > 0)
      llvm::outs() << fmt::format("   task floor {:.4f}", floor);
    llvm::outs() << fmt::format("\n{} steps in {:.1f} s, {:.0f} tokens/s\n", losses.size(),
                                totalMs / 1000, tokensPerStep * losses.size() / (totalMs / 1000));
  }
  if (!SavePath.empty()) {
    auto checkpoint = t.checkpoint();
    if (!checkpoint)
      return report(checkpoint.takeError());
    if (auto err = writeCheckpoint(SavePath, *checkpoint))
      return report(std::move(err));
    llvm::outs() << fmt::format("saved {} (step {})\n", SavePath.getValue(), t.stepsDone());
  }
  return 0;
}

} // namespace tgc::cli
