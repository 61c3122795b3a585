// tgc train: trains a model, printing the loss per step, and saves a checkpoint.
#include "app/PrecisionProbe.h"
#include "app/Tokenizer.h"
#include "app/Trainer.h"
#include "models/ProgramInterface.h"
#include "support/Files.h"
#include "support/Limits.h"
#include "tools/tgc/Options.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"

#include <atomic>
#include <cmath>
#include <csignal>
#include <fmt/format.h>
#include <optional>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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
static cl::opt<std::string> InitPath("init",
                                     cl::desc("Start from a checkpoint's weights (fine-tuning: tgc convert's, or "
                                              "another run's); the optimizer, the FP8 state and the step start afresh"),
                                     cl::value_desc("file.safetensors"), cl::sub(trainCommand()),
                                     cl::cat(category()));
static cl::opt<std::string> TrainTokenizer("tokenizer",
                                           cl::desc("With --data TEXT: read the text through this tokenizer (a "
                                                    "tokenizer.json), tokenized once into a token file beside it; the "
                                                    "checkpoints carry it"),
                                           cl::value_desc("tokenizer.json"), cl::sub(trainCommand()),
                                           cl::cat(category()));
static cl::opt<std::string> LogPath("log", cl::desc("Write one JSON record per step"),
                                    cl::value_desc("file.jsonl"), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<std::string> DataPath("data", cl::desc("Train on a file: bytes of text, llm.c's token files (.bin), or raw uint16 (.u16, .tokens) or uint32 (.u32) ids"),
                                     cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> SaveEvery("save-every", cl::desc("With --save, also save every N steps (the last one kept)"),
                                  cl::init(0), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> MaxBadSteps("max-bad-steps",
                                    cl::desc("Steps whose loss or gradients are not finite that training skips (the "
                                             "update is not applied) before it stops (default 0: the first stops it); "
                                             "a stop saves the last good weights to --save"),
                                    cl::init(0), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> KeepSaves("keep-saves",
                                  cl::desc("With --save-every, also keep the last K saves as FILE.step-N (hard links: "
                                           "the newest costs no extra disk)"),
                                  cl::init(1), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> LogFp8Every("log-fp8-every",
                                    cl::desc("With --log under fp8, log the FP8 scaling state every N steps "
                                             "(default: as often as a step is printed)"),
                                    cl::init(0), cl::sub(trainCommand()), cl::cat(category()));
static cl::opt<int64_t> LogEvery("log-every", cl::desc("Print every N steps (default: about 20 lines)"),
                                 cl::init(0), cl::sub(trainCommand()), cl::cat(category()));

/// Fails early, before any training, when the checkpoint could not be written there.
llvm::Error checkWritable(llvm::StringRef path, llvm::StringRef suffix = "") {
  if (auto err = checkNameFits(path, suffix))
    return err;
  std::string dir = folderOf(path);
  if (!llvm::sys::fs::is_directory(dir))
    return flagError(fmt::format("{}: error: folder '{}' does not exist", path.str(), dir));
  if (llvm::sys::fs::is_directory(path))
    return flagError(fmt::format("{}: error: is a folder, not a file", path.str()));
  if (llvm::sys::fs::access(dir, llvm::sys::fs::AccessMode::Write))
    return flagError(fmt::format("{}: error: folder '{}' is not writable", path.str(), dir));
  return llvm::Error::success();
}

/// Fails before training when the folder of `path` has no room for the checkpoints kept (the
/// parameters and the state, in fp32, and a header; --keep-saves of them), rather than after
/// the run.
llvm::Error checkFreeSpace(llvm::StringRef path, const Trainer &t, int64_t keep) {
  int64_t bytes = 1 << 20; // the header, generously
  for (const Op *op : t.program().ops())
    if (op->kind() == OpKind::Param || op->kind() == OpKind::State)
      bytes += op->result()->type().numElements() * 4;
  int64_t copies = checkpointsAtOnce(t.stepsDone(), t.config().train.steps, SaveEvery, keep);
  auto space = llvm::sys::fs::disk_space(folderOf(path));
  if (!space || int64_t(space->available) >= bytes * copies)
    return llvm::Error::success();
  return flagError(fmt::format("{}: error: the saves need {:.1f} MiB free ({} checkpoint{} of {:.1f} MiB at once{}) "
                               "and its folder has {:.1f} MiB: nothing was trained",
                               path.str(), bytes * copies / 1048576.0, copies, copies > 1 ? "s" : "",
                               bytes / 1048576.0,
                               copies == 1  ? ""
                               : keep > 1   ? fmt::format(": the one written and the {} --keep-saves keeps", copies - 1)
                                            : ": the one written and the last save, until it replaces it",
                               space->available / 1048576.0));
}

/// The FILE.step-N copies this run kept (--keep-saves), oldest first: rotation removes only
/// these, never another run's saves or the checkpoint this one resumed from.
std::vector<std::string> keptThisRun;

} // namespace

namespace {

/// A run's trainer, after the checks that need nothing written yet, resumed if asked.
llvm::Expected<std::unique_ptr<Trainer>> prepareRun(const ModelConfig &config, const RankSetup &setup,
                                                    uint64_t &fileSeed) {
  // Before anything is opened for writing. --save may replace the checkpoint --resume names:
  // it is read whole first, and the new one moved into place atomically at the end.
  if (auto err = checkDistinctFiles({{"the model file", ModelPath}, {"--data", DataPath}, {"--resume", ResumePath},
                                     {"--init", InitPath}, {"--save", SavePath}, {"--log", LogPath}},
                                    {{"--resume", "--save"}, {"--init", "--save"}}))
    return std::move(err);
  // --keep-saves also names each save FILE.step-N: the longest such name must fit too.
  std::string keptSuffix = KeepSaves > 1 ? fmt::format(".step-{}", config.train.steps) : "";
  for (const std::string *path : {&SavePath.getValue(), &LogPath.getValue()})
    if (!path->empty())
      if (auto err = checkWritable(*path, path == &SavePath.getValue() ? keptSuffix : ""))
        return std::move(err);
  if (!SavePath.empty()) // refused now, not after the training it would have kept
    if (auto target = replaceableTarget(SavePath); !target)
      return target.takeError();
  if (SaveEvery < 0 || (SaveEvery > 0 && SavePath.empty()))
    return flagError(fmt::format("--save-every takes a step count >= 0 and needs --save, got {}", int64_t(SaveEvery)));
  if (MaxBadSteps < 0)
    return flagError(fmt::format("--max-bad-steps takes a step count >= 0, got {}", int64_t(MaxBadSteps)));
  if (KeepSaves < 1 || KeepSaves > 1000 || (KeepSaves > 1 && SaveEvery == 0))
    return flagError(fmt::format("--keep-saves takes 1 to 1000 and, above 1, needs --save-every, got {}",
                                 int64_t(KeepSaves)));
  if (!InitPath.empty() && !ResumePath.empty())
    return flagError("--init starts from a checkpoint's weights, --resume continues its run: give one");
  std::optional<Checkpoint> initFrom;
  if (!InitPath.empty()) { // the weights alone: not the moments, two thirds of a trained checkpoint
    auto checkpoint = readCheckpoint(InitPath, [](llvm::StringRef name) { return !program::isOptimizerMoment(name); });
    if (!checkpoint)
      return checkpoint.takeError();
    if (!AllowNonFinite)
      if (auto err = checkFinite(*checkpoint, InitPath))
        return std::move(err);
    initFrom = std::move(*checkpoint);
  }
  std::optional<Checkpoint> resumeFrom;
  if (!ResumePath.empty()) {
    auto checkpoint = readCheckpoint(ResumePath);
    if (!checkpoint)
      return checkpoint.takeError();
    if (!AllowNonFinite)
      if (auto err = checkFinite(*checkpoint, ResumePath))
        return std::move(err);
    // The data stream continues from the checkpoint's seed: a different --seed would be ignored.
    uint64_t saved = 0;
    auto savedText = checkpoint->meta.getString("seed");
    if (savedText && !savedText->getAsInteger(10, saved) && Seed.getNumOccurrences() && saved != Seed)
      return flagError(fmt::format("{}: error: --seed {} conflicts with the checkpoint's seed {} (its data stream "
                                   "continues from there): drop --seed",
                                   ResumePath.getValue(), uint64_t(Seed), saved));
    resumeFrom = std::move(*checkpoint);
  }
  fileSeed = config.train.seed;
  ModelConfig run = config;
  // A resumed fp8 run keeps the layers it trained in FP8 (auto does not measure again).
  if (resumeFrom && !run.precision.fp8Layers)
    if (auto saved = resumeFrom->meta.getString("precision"); saved && *saved == "fp8")
      run.precision.fp8Layers = fp8LayersOf(resumeFrom->tensors);
  // Text through a tokenizer: its token file, made once beside the text.
  std::string dataPath = DataPath, tokenizerText;
  if (!TrainTokenizer.empty()) {
    if (DataPath.empty())
      return flagError("--tokenizer reads --data's text: give --data FILE");
    auto tokenizer = loadTokenizer(TrainTokenizer);
    if (!tokenizer)
      return tokenizer.takeError();
    if ((*tokenizer)->vocabSize() > run.vocab)
      return flagError(fmt::format("--tokenizer {}: its {} tokens do not fit the model's vocabulary of {}",
                                   TrainTokenizer.getValue(), (*tokenizer)->vocabSize(), run.vocab));
    auto cache = tokenCache(DataPath, **tokenizer);
    if (!cache)
      return cache.takeError();
    dataPath = *cache;
    tokenizerText = (*tokenizer)->source();
  }
  auto trainer = Trainer::create(run, dataPath, setup.device, setup.communicator.get());
  if (!trainer)
    return trainer.takeError();
  Trainer &t = **trainer;
  if (!t.recomputeNote().empty())
    llvm::errs() << t.recomputeNote() << "\n";
  if (initFrom)
    if (auto err = t.initFrom(*initFrom, InitPath))
      return std::move(err);
  // The tokenizer the weights came with goes on with them, or the one the data is read through.
  for (const std::optional<Checkpoint> *from : {&initFrom, &resumeFrom})
    if (*from)
      if (auto text = (*from)->meta.getString(kTokenizerMeta))
        t.setTokenizer(text->str());
  if (!tokenizerText.empty())
    t.setTokenizer(std::move(tokenizerText));
  else if (!DataPath.empty() && isByteText(DataPath)) // text read a byte a token
    t.setTokenizer(kByteTokenizer.str());
  if (resumeFrom) {
    if (auto err = t.resume(*resumeFrom, ResumePath))
      return std::move(err);
    if (t.stepsDone() >= t.config().train.steps)
      return flagError(fmt::format("{}: error: the checkpoint is at step {} and the run ends at step {}: nothing to "
                                   "train (give --steps above {}); nothing was written",
                                   ResumePath.getValue(), t.stepsDone(), t.config().train.steps, t.stepsDone()));
  }
  if (!SavePath.empty())
    if (auto err = checkFreeSpace(SavePath, t, KeepSaves))
      return std::move(err);
  return std::move(*trainer);
}

/// Whether this process writes the run's files: rank 0 does.
bool WritesFiles = true;

/// The checkpoint of `t` at --save, with a line saying so.
llvm::Error save(Trainer &t, llvm::StringRef why = "") {
  auto checkpoint = t.checkpoint(); // (a collective under shard: optimizer)
  if (!checkpoint)
    return checkpoint.takeError();
  if (!WritesFiles)
    return llvm::Error::success();
  if (auto err = writeCheckpoint(SavePath, *checkpoint))
    return err;
  llvm::outs() << fmt::format("saved {} (step {}){}\n", SavePath.getValue(), t.stepsDone(), why.str());
  if (KeepSaves <= 1)
    return llvm::Error::success();
  // The save also as FILE.step-N: a second name for the same file (the next save replaces FILE
  // by a rename, so this one stays), or a copy where the file system has no hard links; then
  // only the newest --keep-saves of them.
  std::string kept = fmt::format("{}.step-{}", SavePath.getValue(), t.stepsDone());
  llvm::sys::fs::remove(kept);
  if (llvm::sys::fs::create_hard_link(SavePath, kept))
    if (std::error_code ec = llvm::sys::fs::copy_file(SavePath, kept))
      return flagError(fmt::format("{}: error: cannot keep the save: {}", kept, ec.message()));
  keptThisRun.push_back(kept);
  while (keptThisRun.size() > size_t(KeepSaves)) {
    if (keptThisRun.front() != ResumePath.getValue())
      llvm::sys::fs::remove(keptThisRun.front());
    keptThisRun.erase(keptThisRun.begin());
  }
  return llvm::Error::success();
}

/// SIGINT or SIGTERM during training: the step under way finishes, then the run saves (with
/// --save) and ends. A second signal ends the process at once (the default action is back).
std::atomic<int> stopSignal{0};
extern "C" void onStopSignal(int signal) {
  stopSignal = signal;
  std::signal(signal, SIG_DFL);
}

/// The per-step line and the JSONL record.
struct StepOutput {
  bool terminal = llvm::sys::Process::StandardOutIsDisplayed();
  int64_t every = 1, total = 0, tokensPerStep = 0;
  std::unique_ptr<llvm::raw_fd_ostream> log;

  /// {"fp8": {"step": s, "tensors": [{"tensor", "format", "scale", "amax", "saturated"}]}}: each
  /// quantized tensor's scale and newest amax, for tgc report. Under block scaling "scale" and
  /// "saturated" give way to "block_scale_min", "block_scale_max" and "flushed".
  llvm::Error writeFp8State(const Trainer &t, int64_t step) {
    auto state = t.fp8State();
    if (!state)
      return state.takeError();
    llvm::json::Array tensors;
    for (const Fp8TensorSummary &s : summarizeFp8State(*state, t.config().precision, /*newest=*/1)) {
      llvm::json::Object tensor{{"tensor", s.site + " " + s.role},
                                {"format", s.format},
                                {"amax", s.newestAmax.empty() ? 0.0f : s.newestAmax[0]}};
      if (s.blockScaled) {
        tensor["block_scale_min"] = s.smallestBlockScale;
        tensor["block_scale_max"] = s.largestBlockScale;
        tensor["flushed"] = s.saturations;
      } else {
        tensor["scale"] = s.scale;
        tensor["saturated"] = s.saturations;
      }
      tensors.push_back(std::move(tensor));
    }
    *log << llvm::json::Value(llvm::json::Object{
                {"fp8", llvm::json::Object{{"step", step}, {"tensors", std::move(tensors)}}}})
         << "\n";
    return llvm::Error::success();
  }

  llvm::Error write(const StepRecord &record) {
    double tokensPerSecond = tokensPerStep / (record.stepMs / 1000.0);
    std::string line = fmt::format("step {:>5}/{}  loss {:.4f}  lr {:.2e}  grad norm {:.3f}  {:.1f} ms  {:.0f} tok/s",
                                   record.step, total, record.loss, record.lr, record.gradNorm, record.stepMs,
                                   tokensPerSecond);
    bool print = record.step % every == 0 || record.step == 1 || record.step == total;
    if (terminal) {
      int width = 30, filled = int(width * record.step / std::max<int64_t>(total, 1));
      llvm::outs() << "\r[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << line
                   << (print ? "\n" : "");
      llvm::outs().flush();
    } else if (print) {
      llvm::outs() << line << "\n";
      llvm::outs().flush(); // a file or pipe sees each line as it comes
    }
    if (!log)
      return llvm::Error::success();
    // JSON has no NaN or Inf: a value that is not finite is null, and the step says so.
    auto number = [](double v) { return std::isfinite(v) ? llvm::json::Value(v) : llvm::json::Value(nullptr); };
    llvm::json::Object entry{{"step", record.step},          {"loss", number(record.loss)},
                             {"lr", record.lr},              {"grad_norm", number(record.gradNorm)},
                             {"step_ms", record.stepMs},     {"tokens_per_s", tokensPerSecond}};
    if (record.notFinite())
      entry["not_finite"] = true;
    *log << llvm::json::Value(std::move(entry)) << "\n";
    // A full disk or a closed pipe is found at the step it happens, not at exit.
    log->flush();
    if (!log->has_error())
      return llvm::Error::success();
    std::string message = log->error().message();
    log->clear_error();
    return flagError(fmt::format("{}: error: writing the log failed at step {}: {}", LogPath.getValue(), record.step,
                                 message));
  }
};

/// An error between steps (the data cannot be read, the log cannot be written): the trainer is
/// at a step boundary, so the last step this run finished is saved (with --save) before the
/// error is reported, and the error line says where the work is.
int stopKeepingWork(Trainer &t, bool stepped, llvm::Error err) {
  std::string message = llvm::toString(std::move(err));
  if (!SavePath.empty() && stepped) {
    if (auto saveErr = save(t, " before stopping"))
      message += fmt::format("; saving step {} failed too: {}", t.stepsDone(), llvm::toString(std::move(saveErr)));
    else
      message += fmt::format("; training stopped, {} holds step {}", SavePath.getValue(), t.stepsDone());
  }
  return report(flagError(message));
}

/// Trains `t` to its last step; 0, or the exit status of an error or a stop by signal.
int trainLoop(Trainer &t, StepOutput &out, std::vector<double> &losses, double &totalMs) {
  const ModelConfig &c = t.config();
  int64_t lastSaved = -1, badSteps = 0;
  while (t.stepsDone() < out.total) {
    auto batch = t.nextBatch();
    if (!batch)
      return stopKeepingWork(t, !losses.empty(), batch.takeError());
    auto record = t.step(std::move(*batch));
    if (!record) // failed inside the step: the weights may be half updated, so nothing is saved
      return report(record.takeError());
    losses.push_back(record->loss);
    totalMs += record->stepMs;
    if (auto err = out.write(*record))
      return stopKeepingWork(t, true, std::move(err));
    // A loss or gradient that is not finite: the program skipped the update where the
    // gradients are not (the weights are the last good ones), and the step counts as bad.
    if (record->notFinite()) {
      ++badSteps;
      bool skipped = !std::isfinite(record->gradNorm);
      if (badSteps > MaxBadSteps) {
        std::string saved;
        if (!SavePath.empty() && skipped) { // the weights are still the last good step's
          if (auto err = save(t, " (the last good weights)"))
            return report(std::move(err));
          saved = fmt::format(" ({} holds the weights of the last good step)", SavePath.getValue());
        } else if (lastSaved >= 0) {
          saved = fmt::format(" ({} holds step {})", SavePath.getValue(), lastSaved);
        }
        return report(flagError(fmt::format(
            "error: training diverged at step {} (loss {}, grad norm {}; {} such step{}, --max-bad-steps {}): "
            "stopped{}{}",
            record->step, record->loss, record->gradNorm, badSteps, badSteps == 1 ? "" : "s", int64_t(MaxBadSteps),
            skipped ? ", its update skipped" : "", saved)));
      }
      llvm::outs() << fmt::format("step {}: loss {}, grad norm {}: not finite; {} ({} of --max-bad-steps {})\n",
                                  record->step, record->loss, record->gradNorm,
                                  skipped ? "its update was skipped" : "the loss alone, the update applied", badSteps,
                                  int64_t(MaxBadSteps));
    }
    int64_t fp8Every = LogFp8Every > 0 ? int64_t(LogFp8Every) : out.every;
    if (out.log && c.precision.recipe == Recipe::Fp8 && (record->step % fp8Every == 0 || record->step == 1))
      if (auto err = out.writeFp8State(t, record->step))
        return stopKeepingWork(t, true, std::move(err));
    if (Fp8SummaryEvery > 0 && record->step % Fp8SummaryEvery == 0) {
      auto state = t.fp8State();
      if (!state)
        return report(state.takeError());
      auto summary = summarizeFp8State(*state, c.precision);
      llvm::outs() << fmt::format("FP8 scaling state after step {} ({} quantized tensors):\n", record->step,
                                  summary.size());
      printFp8Summary(summary, llvm::outs());
    }
    // A stop: SIGINT or SIGTERM, or standard output closed (a pipe's reader gone): the step
    // just finished is saved, the last one too, and stderr says why the run ended.
    bool outputClosed = llvm::outs().has_error(), stopping = stopSignal != 0 || outputClosed;
    if (!SavePath.empty() && ((SaveEvery > 0 && record->step % SaveEvery == 0 && record->step < out.total) ||
                              stopping)) {
      if (auto err = save(t, stopping ? " before stopping" : ""))
        return report(std::move(err));
      lastSaved = record->step;
    }
    if (outputClosed) { // said on stderr: standard output has no reader
      llvm::errs() << fmt::format("tgc: standard output closed ({}) after step {}: training stopped{}\n",
                                  llvm::outs().error().message(), record->step,
                                  SavePath.empty() ? " (no --save: nothing written)"
                                                   : fmt::format(", {} holds step {}",
                                                                 escapeForMessage(SavePath.getValue()), record->step));
      llvm::outs().clear_error();
      return 74; // EX_IOERR, as a write to a closed pipe ends other tools
    }
    if (stopping) {
      llvm::outs() << fmt::format("stopped by {} after step {}{}\n", stopSignal == SIGINT ? "SIGINT" : "SIGTERM",
                                  record->step, SavePath.empty() ? " (no --save: nothing written)" : "");
      return 128 + stopSignal;
    }
  }
  return 0;
}

} // namespace

/// Where a resumed run's --log continues: the log of the run it resumes (its first record that
/// run's, of the same model and seed) keeps its records, and the new ones follow from the end of
/// its last whole line (a line a killed run left half-written is dropped); tgc report keeps,
/// of the steps past the resumed run's resumed_at, the resumed run's. nullopt: a new log (no
/// --resume, or no log there yet). Another run's log is refused, before anything is written.
llvm::Expected<std::optional<uint64_t>> continuedLog(const Trainer &t) {
  uint64_t size = 0;
  if (ResumePath.empty() || llvm::sys::fs::file_size(LogPath, size) || size == 0)
    return std::nullopt;
  auto text = readFileAtMost(LogPath, uint64_t(1) << 30, "a log");
  if (!text)
    return text.takeError();
  llvm::StringRef bytes = (*text)->getBuffer();
  auto first = llvm::json::parse(bytes.split('\n').first);
  const llvm::json::Object *record = first ? first->getAsObject() : nullptr;
  const llvm::json::Object *run = record ? record->getObject("run") : nullptr;
  if (!first)
    llvm::consumeError(first.takeError());
  const ModelConfig &c = t.config();
  std::string seed = std::to_string(c.train.seed);
  if (!run || run->getString("model") != llvm::StringRef(c.name) || run->getString("seed") != llvm::StringRef(seed))
    return flagError(fmt::format("{}: error: not the log of the run --resume continues (its first record is not a "
                                 "run of model {} with seed {}): give --log a new file, or that run's log",
                                 LogPath.getValue(), c.name, seed));
  size_t lastNewline = bytes.rfind('\n');
  return uint64_t(lastNewline == llvm::StringRef::npos ? 0 : lastNewline + 1);
}

/// The --log stream: a new file, or the resumed run's log continued from byte `keep`. A log
/// file is locked for the run (flock, released when tgc exits): a second run given the same
/// --log is refused rather than interleaving its records with the first's. Devices and pipes
/// (--log /dev/stdout) are written as they are, neither locked nor cut.
llvm::Expected<std::unique_ptr<llvm::raw_fd_ostream>> openLog(std::optional<uint64_t> keep) {
  int fd = -1;
  std::error_code ec =
      llvm::sys::fs::openFileForWrite(LogPath, fd, llvm::sys::fs::CD_OpenAlways, llvm::sys::fs::OF_Append);
  if (ec)
    return flagError(fmt::format("{}: error: cannot write: {}", LogPath.getValue(), ec.message()));
  struct stat status {};
  if (::fstat(fd, &status) == 0 && S_ISREG(status.st_mode)) {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return flagError(fmt::format("{}: error: another tgc run is writing this log now: give --log another file, "
                                   "or let that run end first",
                                   LogPath.getValue()));
    }
    if ((ec = llvm::sys::fs::resize_file(fd, keep.value_or(0)))) {
      ::close(fd);
      return flagError(fmt::format("{}: error: cannot {} the log: {}", LogPath.getValue(),
                                   keep ? "continue" : "start", ec.message()));
    }
  }
  return std::make_unique<llvm::raw_fd_ostream>(fd, /*shouldClose=*/true);
}

/// What a run trains: the model, the device and precision, and which layers run in FP8.
void printRunHeader(const Trainer &t) {
  const ModelConfig &c = t.config();
  llvm::outs() << fmt::format("model {}: {} parameters, batch {} x {} tokens, {} steps, lr {}, seed {}\n", c.name,
                              c.numParams(), c.train.batch, c.seqLen, c.train.steps, formatDouble(c.train.lr),
                              c.train.seed);
  Recipe recipe = c.precision.recipe; // resolved by the trainer for its device
  bool emulated = recipe != Recipe::Fp32 && llvm::StringRef(t.executor().describe()).starts_with("cpu");
  std::vector<std::string> notes;
  if (recipe == Recipe::Fp8)
    notes.push_back(fmt::format("{}, {} scaling{}{}", fp8FormatName(c.precision.fp8Format).str(),
                                fp8ScalingName(c.precision.fp8Scaling).str(),
                                c.precision.fp8Weights ? ", FP8 weights between steps" : "",
                                c.precision.fp8Attention ? ", FP8 attention" : ""));
  if (emulated)
    notes.push_back("emulated");
  llvm::outs() << fmt::format("device: {}, precision {}{}\n", t.executor().describe(), recipeName(recipe).str(),
                              notes.empty() ? "" : " (" + llvm::join(notes, "; ") + ")");
  if (recipe == Recipe::Fp8 || !c.precision.measured.empty()) {
    auto [fp8Layers, linearLayers] = countFp8Layers(t.program(), c);
    llvm::outs() << fmt::format("FP8: {} of {} linear layers ({})\n", fp8Layers, linearLayers,
                                !c.precision.measured.empty() ? "auto: those measured faster in FP8"
                                : c.precision.fp8Layers      ? "those fp8_layers names"
                                                             : "every legal one");
    for (const GemmMeasurement &m : c.precision.measured)
      llvm::outs() << "  " << describeMeasurement(m) << "\n";
    if (!c.precision.measuredSummary.empty())
      llvm::outs() << "  " << c.precision.measuredSummary << "\n";
  }
}

int runTrain() {
  if (auto err = checkNotEmpty({&SavePath, &ResumePath, &InitPath, &LogPath, &DataPath, &TrainTokenizer}))
    return report(std::move(err));
  auto config = loadConfig(ModelPath);
  if (!config)
    return report(config.takeError());
  if (std::optional<int> launched = launchRanks()) // --gpus N: the ranks train, this process waits
    return *launched;
  auto setup = joinRanks();
  if (!setup)
    return report(setup.takeError());
  uint64_t fileSeed = 0;
  auto trainer = prepareRun(*config, *setup, fileSeed);
  if (!trainer)
    return report(trainer.takeError());
  Trainer &t = **trainer;
  if (setup->rank > 0) { // rank 0 writes the checkpoints and the log (every rank holds the same)
    // Under shard: optimizer a save gathers the moments from every rank: all take part.
    if (!t.config().train.shardOptimizer)
      SavePath = "";
    WritesFiles = false;
    LogPath = "";
  }
  const ModelConfig &c = t.config();
  StepOutput out;
  out.total = c.train.steps;
  out.tokensPerStep = c.train.batch * c.seqLen;
  out.every = LogEvery > 0 ? int64_t(LogEvery) : std::max<int64_t>(1, out.total / 20);
  printRunHeader(t);
  if (t.ranks() > 1)
    llvm::outs() << fmt::format("data parallel: {} ranks, one process each, {} ({} sequences each{}; rank 0 prints "
                                "and writes)\n",
                                t.ranks(), setup->overTcp ? "met over TCP" : "on the GPUs of this machine",
                                c.train.batch / t.ranks(),
                                c.train.shardGradients   ? ", AdamW's state and the gradients sharded"
                                : c.train.shardOptimizer ? ", AdamW's state sharded"
                                                         : "");
  llvm::outs() << fmt::format("data: {}\n", t.data().describe());
  for (const std::string &line : t.executor().memoryReport())
    llvm::outs() << "memory: " << line << "\n";
  if (t.stepsDone())
    llvm::outs() << fmt::format("resumed from {} at step {}{}\n", ResumePath.getValue(), t.stepsDone(),
                                c.train.seed != fileSeed
                                    ? fmt::format(" (seed {} from the checkpoint; the model file says {})",
                                                  c.train.seed, fileSeed)
                                    : "");
  if (!LogPath.empty()) {
    auto keep = continuedLog(t);
    if (!keep)
      return report(keep.takeError());
    auto log = openLog(*keep);
    if (!log)
      return report(log.takeError());
    out.log = std::move(*log);
    if (*keep)
      llvm::outs() << fmt::format("log: {} continues after its {} bytes\n", LogPath.getValue(), **keep);
    // The first record describes the run (commit, model, device, recipe, op counts); each
    // later one is a step.
    llvm::json::Object run = runDescription(t);
    run["steps"] = out.total;
    run["seed"] = std::to_string(c.train.seed); // u64 does not fit JSON's int64
    run["data"] = t.data().describe();
    run["vocab"] = c.vocab;
    run["loss_floor"] = t.data().lossFloor(); // the task's: 0 where it has none
    if (!ResumePath.empty())
      run["resumed_at"] = t.stepsDone();
    *out.log << llvm::json::Value(llvm::json::Object{{"run", std::move(run)}}) << "\n";
  }
  std::vector<double> losses;
  double totalMs = 0;
  stopSignal = 0;
  auto previousInt = std::signal(SIGINT, onStopSignal), previousTerm = std::signal(SIGTERM, onStopSignal);
  int status = trainLoop(t, out, losses, totalMs);
  // The handlers stay through the final save: a signal now is answered once the save is done.
  auto restore = llvm::make_scope_exit([&] {
    std::signal(SIGINT, previousInt);
    std::signal(SIGTERM, previousTerm);
  });
  if (status)
    return status;
  if (!losses.empty()) {
    size_t tail = std::min<size_t>(10, losses.size());
    double mean = 0;
    for (size_t i = losses.size() - tail; i < losses.size(); ++i)
      mean += losses[i] / tail;
    llvm::outs() << fmt::format("final loss {:.4f} (mean of the last {}: {:.4f})   random guess ln(V) {:.4f}",
                                losses.back(), tail, mean, std::log(double(c.vocab)));
    if (double floor = t.data().lossFloor(); floor > 0)
      llvm::outs() << fmt::format("   task floor {:.4f}", floor);
    llvm::outs() << fmt::format("\n{} steps in {:.1f} s, {:.0f} tokens/s\n", losses.size(), totalMs / 1000,
                                out.tokensPerStep * losses.size() / (totalMs / 1000));
  }
  if (!SavePath.empty())
    if (auto err = save(t))
      return report(std::move(err));
  // A signal after the last step (in the summary or the final save): answered now, the save done.
  if (int signal = stopSignal) {
    llvm::errs() << fmt::format("tgc: {} after the last step: {}\n", signal == SIGINT ? "SIGINT" : "SIGTERM",
                                SavePath.empty() ? "the run was over (no --save: nothing written)"
                                                 : "the final save finished first");
    return 128 + signal;
  }
  return 0;
}

} // namespace tgc::cli
