// What the subcommands of tgc share: the subcommands themselves, the flags several of them
// take, and the helpers that read a model file with its overrides, pick the device and load a
// trained checkpoint. Each subcommand lives in a file of its own (Compile.cpp, Train.cpp, ...).
#pragma once

#include "app/Checkpoint.h"
#include "app/Generate.h"
#include "app/Trainer.h"
#include "backends/cpu/Fp8Scaling.h"
#include "driver/Program.h"
#include "models/ModelConfig.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tgc::cli {

namespace cl = llvm::cl;

cl::OptionCategory &category();
cl::SubCommand &compileCommand();
cl::SubCommand &optCommand();
cl::SubCommand &runCommand();
cl::SubCommand &infoCommand();
cl::SubCommand &trainCommand();
cl::SubCommand &generateCommand();
cl::SubCommand &evalCommand();
cl::SubCommand &inspectCommand();
cl::SubCommand &benchCommand();
cl::SubCommand &reportCommand();
cl::SubCommand &convertCommand();
cl::SubCommand &tokenizeCommand();
cl::SubCommand &tokenizerCommand();

// Flags of several subcommands (Options.cpp).
extern cl::opt<std::string> ModelPath;
extern cl::opt<std::string> CheckpointPath;
extern cl::list<std::string> DisablePass;
extern cl::opt<int64_t> BatchSize;
extern cl::opt<uint64_t> Seed;
extern cl::opt<std::string> Precision;
extern cl::opt<std::string> Fp8FormatFlag;
extern cl::opt<int64_t> Margin;
extern cl::opt<int64_t> AmaxHistoryLen;
extern cl::opt<std::string> AmaxAlgoFlag;
extern cl::opt<int64_t> Fp8MinDim;
extern cl::opt<bool> Recompute;
extern cl::opt<int64_t> Steps;
extern cl::opt<double> LearningRate;
extern cl::opt<std::string> DeviceFlag;
/// generate's and bench --generate's --temperature, --top-k and --top-p, checked, with `seed`.
llvm::Expected<SamplingOptions> samplingFlags(uint64_t seed);
/// generate's and bench --generate's speculative decoding: --draft (a checkpoint) and
/// --lookahead.
extern cl::opt<std::string> DraftPath;
/// generate's and bench --generate's --prompt-text.
extern cl::opt<std::string> PromptText;
/// Gives `generator` the --draft checkpoint as its draft model, created for its batch, device
/// and recipe, proposing --lookahead tokens a step (nothing without --draft). Refused with
/// sampling (speculation here keeps greedy decoding's tokens), and where the model's checkpoint
/// (`modelMeta`, if known) and the draft's carry different tokenizers.
llvm::Error attachDraft(Generator &generator, const SamplingOptions &sampling,
                        const llvm::json::Object *modelMeta = nullptr);
/// --draft and --lookahead checked (with `sampling`) before anything runs.
llvm::Error checkDraftFlags(const SamplingOptions &sampling);

/// --gpus N (Ranks.cpp): data-parallel training on N GPUs, one process each.
extern cl::opt<int> Gpus;
/// --nodes M, --node-rank i, --rendezvous HOST:PORT (Ranks.cpp): training over M hosts.
extern cl::opt<int> Nodes;
extern cl::opt<int> NodeRank;
extern cl::opt<std::string> RendezvousFlag;
/// This process's part in a run: rank `rank` of `ranks` on `device`, with the communicator of
/// the ranks (null for one rank). Rank 0 prints and writes files.
struct RankSetup {
  int rank = 0, ranks = 1;
  Device device;
  std::unique_ptr<Communicator> communicator;
  bool overTcp = false; // the ranks met over TCP (torchrun's or SLURM's environment)
};
/// In the process the user started with --gpus N (N > 1): starts the N ranks of this command
/// (over --nodes hosts, this host's N with torchrun's variables), waits for them and returns
/// the exit status. std::nullopt where this process trains itself (one GPU a host, or a rank);
/// the exit status of an error in --nodes, --node-rank or --rendezvous.
std::optional<int> launchRanks();
/// In a rank that launchRanks started, or one of torchrun's or SLURM's, or the one rank of a
/// host under --nodes: its device and the communicator, once every rank has joined. Elsewhere:
/// resolveDevice() and one rank.
llvm::Expected<RankSetup> joinRanks();

/// Prints one line for the error ("tgc: error: ...") and returns the exit code.
int report(llvm::Error err);
llvm::Error flagError(const std::string &message);
/// An error for the first of `flags` given with an empty value (--save "" names no file: it is
/// refused, not taken as absent).
llvm::Error checkNotEmpty(std::initializer_list<const cl::opt<std::string> *> flags);
/// The model file with the command line's overrides applied (checked by the model layer's
/// rules) and --disable-pass checked.
llvm::Expected<ModelConfig> loadConfig(llvm::StringRef path);
/// --device: auto takes the GPU when there is one (and this build can use it); an explicit
/// request the machine cannot serve is an error, not a downgrade. Detected once per call.
llvm::Expected<Device> resolveDevice();
/// A checkpoint and the model it was trained for.
/// requireFinite: NaN or Inf in a tensor is an error unless --allow-nonfinite.
llvm::Expected<std::pair<ModelConfig, Checkpoint>> loadTrained(llvm::StringRef path, bool requireFinite = true);
extern cl::opt<bool> AllowNonFinite;
/// The FP8 scaling summary: one line per quantized tensor.
void printFp8Summary(const std::vector<Fp8TensorSummary> &summary, llvm::raw_ostream &os);

// The subcommands.
int runCompile();
int runOpt();
int runForward();
int runTrain();
int runGenerate();
int runEval();
int runBench();
int runInspect();
int runInfo();
int runReport();
int runConvert();
int runTokenize();
int runTokenizer();

/// The trainer's device, as its executor describes it, without the kernel-cache note.
std::string deviceName(const Trainer &trainer);
/// The same of an executor's description (a generator's).
std::string deviceName(llvm::StringRef description);
/// What a script needs to compare runs: the build's commit, the model and its size, the batch,
/// the device, the recipe and the training program's op counts by kind.
llvm::json::Object runDescription(const Trainer &trainer);

} // namespace tgc::cli
