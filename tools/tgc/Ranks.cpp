// tgc train --gpus N and tgc bench --gpus N: data-parallel training on N GPUs of this machine,
// one process per GPU. The process the user starts is the launcher: it checks the machine,
// creates NCCL's unique id (its bootstrap listens in the launcher, which lives as long as the
// ranks) and starts N copies of its own command line, rank r on GPU r, which meet in one NCCL
// communicator. Rank 0 prints and writes (checkpoints, logs, JSON); the others' standard output
// goes to /dev/null, their errors stay on standard error. The launcher waits: when a rank fails
// or is killed, it stops the others (SIGTERM, then SIGKILL after 2 s), which would otherwise
// wait in a collective for it forever, says which rank ended how, and exits with its status.
// Over several hosts (--nodes M --node-rank i --rendezvous HOST:PORT on each) host i's launcher
// starts its ranks with torchrun's variables instead (rank i * N + GPU of M * N), and they meet
// as ranks that torchrun or SLURM started do: over TCP at the rendezvous, NCCL's id from rank 0.
#include "backends/TcpGroup.h"
#include "backends/cuda/libraries/Nccl.h"
#include "backends/cuda/Target.h"
#include "support/Error.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/MemoryBuffer.h"

#include <chrono>
#include <csignal>
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char **environ;

namespace tgc::cli {

cl::opt<int> Gpus("gpus",
                  cl::desc("Train data-parallel on N GPUs of this machine, one process each (through NCCL); "
                           "--batch stays the global batch, split evenly over them"),
                  cl::init(1), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));

cl::opt<int> Nodes("nodes",
                   cl::desc("Train data-parallel over this many hosts, tgc started on each by hand with its "
                            "--node-rank and the same --rendezvous; each host runs --gpus ranks"),
                   cl::init(1), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<int> NodeRank("node-rank", cl::desc("With --nodes: this host's index, 0 to nodes - 1 (host 0 holds rank 0)"),
                      cl::init(0), cl::sub(trainCommand()), cl::sub(benchCommand()), cl::cat(category()));
cl::opt<std::string> RendezvousFlag("rendezvous",
                                    cl::desc("With --nodes: HOST:PORT where host 0's first rank listens for the "
                                             "others (torchrun's MASTER_ADDR:MASTER_PORT)"),
                                    cl::value_desc("host:port"), cl::sub(trainCommand()), cl::sub(benchCommand()),
                                    cl::cat(category()));

namespace {

// What the launcher tells each rank it starts (internal: not for users to set).
constexpr const char *kRankVar = "TGC_RANK", *kRanksVar = "TGC_RANKS", *kIdVar = "TGC_NCCL_ID",
                     *kLauncherVar = "TGC_LAUNCHER_PID";

std::vector<pid_t> children; // the ranks, while the launcher waits; 0 once reaped
extern "C" void forwardTerm(int signal) {
  for (pid_t pid : children)
    if (pid > 0)
      ::kill(pid, signal);
}

/// This process's command line, as the kernel has it.
std::vector<std::string> commandLine() {
  std::vector<std::string> args;
  auto file = llvm::MemoryBuffer::getFileAsStream("/proc/self/cmdline");
  if (!file)
    return args;
  llvm::StringRef rest = (*file)->getBuffer();
  while (!rest.empty()) {
    auto [arg, tail] = rest.split('\0');
    args.push_back(arg.str());
    rest = tail;
  }
  return args;
}

std::string describeStatus(int status) {
  if (WIFEXITED(status))
    return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

int exitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
}

/// Where the run's rank 0 listens, from --rendezvous, once --nodes, --node-rank and
/// --rendezvous are checked; an empty host where --nodes is 1.
struct NodesPlan {
  std::string host;
  int port = 0;
};
llvm::Expected<NodesPlan> nodesPlan() {
  if (Nodes < 1 || Nodes > 4096)
    return flagError(fmt::format("--nodes takes 1 to 4096, got {}", int(Nodes)));
  if (Nodes == 1) {
    if (NodeRank != 0 || !RendezvousFlag.empty())
      return flagError("--node-rank and --rendezvous describe a run over several hosts: add --nodes");
    return NodesPlan{};
  }
  if (NodeRank < 0 || NodeRank >= Nodes)
    return flagError(fmt::format("--node-rank {} is not in [0, {}]", int(NodeRank), Nodes - 1));
  if (RendezvousFlag.empty())
    return flagError(fmt::format("--nodes {} needs --rendezvous HOST:PORT, where host 0 listens", int(Nodes)));
  auto [host, portText] = llvm::StringRef(RendezvousFlag).rsplit(':');
  int port = 0;
  if (host.empty() || portText.getAsInteger(10, port) || port < 1 || port > 65535)
    return flagError(fmt::format("--rendezvous '{}' is not HOST:PORT with a port in [1, 65535]",
                                 std::string(RendezvousFlag)));
  if (std::getenv("WORLD_SIZE"))
    return flagError("--nodes describes the run's hosts: drop it where torchrun's WORLD_SIZE describes its processes");
  return NodesPlan{host.str(), port};
}

/// Each rank's environment: the launcher's own, less what it sets, plus `common` and the
/// rank's `own(r)`.
template <typename Own>
std::vector<std::vector<std::string>> rankEnvironments(const std::vector<std::string> &common, Own own) {
  const llvm::StringRef ours[] = {kRankVar,    kRanksVar,     kIdVar,        kLauncherVar, "WORLD_SIZE",
                                  "RANK",      "LOCAL_RANK",  "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> base;
  for (char **e = environ; *e; ++e)
    if (!llvm::is_contained(ours, llvm::StringRef(*e).split('=').first))
      base.push_back(*e);
  base.insert(base.end(), common.begin(), common.end());
  base.push_back(fmt::format("{}={}", kLauncherVar, int(getpid())));
  std::vector<std::vector<std::string>> envs;
  for (int r = 0; r < Gpus; ++r) {
    envs.push_back(base);
    for (std::string &e : own(r))
      envs.back().push_back(std::move(e));
  }
  return envs;
}

/// Starts this program again as a rank with `args` and `env` (standard output to /dev/null
/// where `quiet`; SIGINT and SIGTERM at their defaults, not the launcher's): 0, or errno.
int spawnRank(std::vector<std::string> &args, std::vector<std::string> &env, bool quiet, pid_t &pid) {
  std::vector<char *> argv, envp;
  for (std::string &a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string &e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet)
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF);
  int error = posix_spawn(&pid, "/proc/self/exe", &actions, &attributes, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  return error;
}

} // namespace

std::optional<int> launchRanks() {
  if (std::getenv(kRankVar) || std::getenv(kLauncherVar))
    return std::nullopt; // a rank a launcher started
  auto nodes = nodesPlan();
  if (!nodes)
    return report(nodes.takeError());
  if (Gpus == 1)
    return std::nullopt; // one rank on this host: this process trains (joinRanks joins the others)
  if (const char *world = std::getenv("WORLD_SIZE"); world && llvm::StringRef(world).trim() != "1")
    return report(flagError("--gpus starts its own ranks: drop it where WORLD_SIZE describes the run's processes"));
  if (Gpus < 1 || Gpus > 64)
    return report(flagError(fmt::format("--gpus takes 1 to 64, got {}", int(Gpus))));
  if (DeviceFlag == "cpu")
    return report(flagError("--gpus runs on GPUs: drop --device cpu"));
  TargetInfo target = detectTarget();
  if (int(target.gpus.size()) < Gpus)
    return report(flagError(target.gpus.empty()
                                ? fmt::format("--gpus {}: this machine has no GPU ({})", int(Gpus), target.noGpuReason)
                                : fmt::format("--gpus {}: this machine has {} GPU{}", int(Gpus), target.gpus.size(),
                                              target.gpus.size() == 1 ? "" : "s")));
  auto nccl = loadNccl();
  if (!nccl)
    return report(flagError(fmt::format("--gpus {} needs NCCL: {}", int(Gpus),
                                        llvm::toString(nccl.takeError()).substr(std::string("error: ").size()))));
  std::vector<std::string> args = commandLine();
  if (args.empty())
    return report(flagError("cannot read this process's command line (/proc/self/cmdline) to start the ranks"));
  std::vector<std::vector<std::string>> envs;
  if (Nodes > 1) { // the hosts' ranks meet as torchrun's do (joinRanks): rank 0 hands out NCCL's id
    envs = rankEnvironments({fmt::format("WORLD_SIZE={}", Nodes * Gpus), "MASTER_ADDR=" + nodes->host,
                             fmt::format("MASTER_PORT={}", nodes->port)},
                            [](int r) {
                              return std::vector<std::string>{fmt::format("RANK={}", NodeRank * Gpus + r),
                                                              fmt::format("LOCAL_RANK={}", r)};
                            });
  } else {
    NcclUniqueId id{};
    if (int result = (*nccl)->getUniqueId(&id); result != 0)
      return report(flagError(fmt::format("ncclGetUniqueId failed: {}", (*nccl)->errorString(result))));
    envs = rankEnvironments({fmt::format("{}={}", kRanksVar, int(Gpus)), fmt::format("{}={}", kIdVar, uniqueIdToHex(id))},
                            [](int r) { return std::vector<std::string>{fmt::format("{}={}", kRankVar, r)}; });
  }
  llvm::outs().flush();
  auto previousTerm = std::signal(SIGTERM, forwardTerm);
  // SIGINT from the terminal reaches the ranks themselves (one process group): each finishes its
  // step and stops; the launcher waits for them.
  auto previousInt = std::signal(SIGINT, SIG_IGN);
  children.assign(Gpus, 0);
  for (int r = 0; r < Gpus; ++r) {
    pid_t pid = 0;
    int error = spawnRank(args, envs[r], /*quiet=*/NodeRank * Gpus + r > 0, pid);
    if (error) {
      llvm::errs() << fmt::format("tgc: error: cannot start rank {}: {}\n", r, strerror(error));
      forwardTerm(SIGKILL);
      for (pid_t p : children)
        if (p > 0)
          waitpid(p, nullptr, 0);
      return 1;
    }
    children[r] = pid;
  }
  // Wait for every rank; the first to fail stops the others (a rank waiting in a collective for
  // the failed one does not end on SIGTERM: SIGKILL follows after 2 s).
  int exitCode = 0, running = Gpus;
  std::optional<std::chrono::steady_clock::time_point> killAt;
  while (running > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, killAt ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    if (pid == 0) { // stopping the others: SIGKILL for those still there after 2 s
      if (std::chrono::steady_clock::now() > *killAt)
        forwardTerm(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    int rank = int(std::find(children.begin(), children.end(), pid) - children.begin());
    if (rank == Gpus)
      continue;
    children[rank] = 0;
    --running;
    bool failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (failed && !killAt) {
      exitCode = exitCodeOf(status);
      // (Over several hosts the rank's number is the run's: the host's first rank's plus the GPU.)
      llvm::errs() << fmt::format("tgc: error: rank {} of {} (GPU {}) {}{}\n", NodeRank * Gpus + rank,
                                  Nodes * Gpus, rank, describeStatus(status),
                                  running > 0 ? ": stopping this host's other ranks" : "");
      forwardTerm(SIGTERM);
      killAt = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
  }
  std::signal(SIGTERM, previousTerm);
  std::signal(SIGINT, previousInt);
  children.clear();
  return exitCode;
}

namespace {

/// An environment variable as an integer in [low, high], or `fallback` where it is unset.
llvm::Expected<int> intFromEnvironment(const char *name, int low, int high, std::optional<int> fallback) {
  const char *text = std::getenv(name);
  if (!text) {
    if (fallback)
      return *fallback;
    return flagError(fmt::format("{} is not set: a run across processes (torchrun's WORLD_SIZE) needs RANK, "
                                 "MASTER_ADDR and MASTER_PORT too",
                                 name));
  }
  int value = 0;
  if (llvm::StringRef(text).trim().getAsInteger(10, value) || value < low || value > high)
    return flagError(fmt::format("{}={} is not an integer in [{}, {}]", name, text, low, high));
  return value;
}

/// The first host of SLURM's node list: "gpu[01-04,07],login" -> "gpu01".
std::string firstHostOf(llvm::StringRef nodes) {
  size_t bracket = nodes.find('['), comma = nodes.find(',');
  if (bracket == llvm::StringRef::npos || (comma != llvm::StringRef::npos && comma < bracket))
    return nodes.substr(0, comma).trim().str();
  llvm::StringRef inside = nodes.substr(bracket + 1).split(']').first, after = nodes.substr(bracket + 1).split(']').second;
  llvm::StringRef first = inside.split(',').first.split('-').first;
  return (nodes.substr(0, bracket) + first + after.split(',').first).str();
}

/// Where a rank of a run started by someone else is: torchrun's WORLD_SIZE, RANK, LOCAL_RANK
/// (the GPU; default RANK), MASTER_ADDR (default 127.0.0.1) and MASTER_PORT, or SLURM's
/// SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID and the node list's first host (MASTER_ADDR and
/// MASTER_PORT still win; the port's default is torchrun's 29500 there).
struct EnvironmentRank {
  int rank = 0, ranks = 1, local = 0, port = 0;
  std::string host;
};
llvm::Expected<EnvironmentRank> environmentRank(int ranks, bool slurm) {
  EnvironmentRank e;
  e.ranks = ranks;
  auto rank = intFromEnvironment(slurm ? "SLURM_PROCID" : "RANK", 0, ranks - 1, std::nullopt);
  if (!rank)
    return rank.takeError();
  auto port = intFromEnvironment("MASTER_PORT", 1, 65535, slurm ? std::optional<int>(29500) : std::nullopt);
  if (!port)
    return port.takeError();
  auto local = intFromEnvironment(slurm ? "SLURM_LOCALID" : "LOCAL_RANK", 0, 1023, *rank);
  if (!local)
    return local.takeError();
  e.rank = *rank, e.port = *port, e.local = *local;
  const char *host = std::getenv("MASTER_ADDR");
  const char *nodes = slurm ? std::getenv("SLURM_JOB_NODELIST") : nullptr;
  if (slurm && !nodes)
    nodes = std::getenv("SLURM_NODELIST");
  e.host = host && *host ? host : nodes && *nodes ? firstHostOf(nodes) : "127.0.0.1";
  return e;
}

/// A rank of a run whose processes someone else started (torchrun, SLURM, or by hand; see
/// environmentRank). They meet over TCP (TcpGroup.h, TGC_RENDEZVOUS_TIMEOUT seconds, default
/// 300): on the CPU its collectives are the run's; on GPUs it hands every rank rank 0's NCCL
/// unique id. Ranks other than 0 print nothing on standard output (their errors stay on
/// standard error).
/// `launched`: this process is a rank that a host's launcher (--nodes with --gpus) started.
llvm::Expected<RankSetup> joinEnvironmentRanks(const EnvironmentRank &where, bool launched) {
  auto timeout = intFromEnvironment("TGC_RENDEZVOUS_TIMEOUT", 1, 86400, 300);
  if (!timeout)
    return timeout.takeError();
  const int rank = where.rank, local = where.local, ranks = where.ranks;
  if (Gpus != 1 && !launched)
    return flagError("--gpus starts its own ranks: drop it where WORLD_SIZE describes the run's processes");
  if (launched)
    prctl(PR_SET_PDEATHSIG, SIGKILL); // ends with its launcher, as launchRanks's ranks do
  Rendezvous rendezvous{where.host, where.port, rank, ranks, double(*timeout), ""};
  RankSetup setup;
  setup.rank = rank;
  setup.ranks = ranks;
  setup.overTcp = true;
  auto device = DeviceFlag == "cpu" ? llvm::Expected<Device>(Device::cpu()) : detectCudaDevice(local);
  if (!device && DeviceFlag == "cuda")
    return stringError(fmt::format("rank {}: {}", rank, llvm::toString(device.takeError())));
  setup.device = device ? *device : (llvm::consumeError(device.takeError()), Device::cpu());
  NcclUniqueId id{};
  if (setup.device == Device::Cuda && rank == 0) { // rank 0 makes NCCL's id; the rendezvous hands it out
    auto nccl = loadNccl();
    if (!nccl)
      return nccl.takeError();
    if (int result = (*nccl)->getUniqueId(&id); result != 0)
      return flagError(fmt::format("ncclGetUniqueId failed: {}", (*nccl)->errorString(result)));
    rendezvous.payload = uniqueIdToHex(id);
  }
  auto group = joinTcpGroup(rendezvous);
  if (!group)
    return group.takeError();
  if (rank > 0) { // rank 0 prints
    llvm::outs().flush();
    int null = ::open("/dev/null", O_WRONLY);
    if (null >= 0)
      ::dup2(null, 1), ::close(null);
  }
  if (setup.device == Device::Cpu) {
    setup.communicator = std::move(*group);
    return std::move(setup);
  }
  auto received = uniqueIdFromHex(rendezvous.payload);
  if (!received)
    return received.takeError();
  auto communicator = NcclCommunicator::create(*received, rank, ranks, local);
  if (!communicator)
    return communicator.takeError();
  setup.communicator = std::move(*communicator);
  return std::move(setup);
}

} // namespace

llvm::Expected<RankSetup> joinRanks() {
  RankSetup setup;
  const char *rankText = std::getenv(kRankVar);
  // A rank a host's launcher started (--nodes with --gpus) finds torchrun's variables it set.
  bool launched = !rankText && std::getenv(kLauncherVar);
  if (!rankText && !launched && Nodes > 1) { // --nodes, one rank on this host: this process
    auto nodes = nodesPlan();
    if (!nodes)
      return nodes.takeError();
    return joinEnvironmentRanks({int(NodeRank), int(Nodes), 0, nodes->port, nodes->host}, false);
  }
  bool torchrun = std::getenv("WORLD_SIZE"), slurm = !torchrun && std::getenv("SLURM_NTASKS");
  if (!rankText && (torchrun || slurm)) {
    auto ranks = intFromEnvironment(torchrun ? "WORLD_SIZE" : "SLURM_NTASKS", 1, 4096, std::nullopt);
    if (!ranks)
      return ranks.takeError();
    if (*ranks > 1) {
      auto where = environmentRank(*ranks, slurm);
      if (!where)
        return where.takeError();
      return joinEnvironmentRanks(*where, launched);
    }
  }
  if (!rankText) {
    auto device = resolveDevice();
    if (!device)
      return device.takeError();
    setup.device = *device;
    return std::move(setup);
  }
  // Started by launchRanks: end with the launcher (whose death would leave this rank waiting in
  // a collective), and join the others.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  const char *launcher = std::getenv(kLauncherVar);
  if (launcher && std::to_string(getppid()) != launcher)
    return flagError("the launcher of this rank has already ended");
  const char *ranksText = std::getenv(kRanksVar), *idText = std::getenv(kIdVar);
  int rank = -1, ranks = 0;
  if (!ranksText || !idText || llvm::StringRef(rankText).getAsInteger(10, rank) ||
      llvm::StringRef(ranksText).getAsInteger(10, ranks) || rank < 0 || rank >= ranks)
    return flagError(fmt::format("{}, {} and {} describe a rank tgc's launcher started; these do not", kRankVar,
                                 kRanksVar, kIdVar));
  auto id = uniqueIdFromHex(idText);
  if (!id)
    return id.takeError();
  auto device = detectCudaDevice(rank);
  if (!device)
    return stringError(fmt::format("rank {}: {}", rank, llvm::toString(device.takeError())));
  auto communicator = NcclCommunicator::create(*id, rank, ranks, rank);
  if (!communicator)
    return communicator.takeError();
  setup.rank = rank;
  setup.ranks = ranks;
  setup.device = *device;
  setup.communicator = std::move(*communicator);
  return std::move(setup);
}

} // namespace tgc::cli
