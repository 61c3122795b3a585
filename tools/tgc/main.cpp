// tgc: the runner. Compiles model descriptions, prints the IR after any pass, trains, generates
// and evaluates, benchmarks precisions against each other and reports what this machine can
// run. Each subcommand is a file of this folder; Options.h has what they share.
#include "tools/tgc/Options.h"

#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/InitLLVM.h"

#include <csignal>
#include <new>
#include <system_error>
#include <unistd.h>

using namespace tgc::cli;

namespace {

/// Every subcommand and what runs it, in the order of tgc --help.
struct Subcommand {
  cl::SubCommand *command;
  int (*run)();
};
const Subcommand kSubcommands[] = {
    {&compileCommand(), runCompile}, {&optCommand(), runOpt},         {&runCommand(), runForward},
    {&infoCommand(), runInfo},       {&trainCommand(), runTrain},     {&generateCommand(), runGenerate},
    {&evalCommand(), runEval},       {&inspectCommand(), runInspect}, {&benchCommand(), runBench},
    {&reportCommand(), runReport},   {&convertCommand(), runConvert}, {&tokenizeCommand(), runTokenize},
    {&tokenizerCommand(), runTokenizer},
};

/// The chosen subcommand's exit status.
int runSubcommand() {
  for (const Subcommand &s : kSubcommands)
    if (*s.command)
      return s.run();
  llvm::errs() << "tgc: error: no subcommand given (compile, opt, run, train, generate, eval, inspect, "
                  "bench, report, convert, tokenize, tokenizer, info); see tgc --help\n";
  return 1;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // A closed pipe under standard output (tgc train ... | head) is a write error the commands
  // see and answer (training saves its last step), not LLVM's SIGPIPE exit in the middle of a
  // write.
  std::signal(SIGPIPE, SIG_IGN);
  for (const Subcommand &s : kSubcommands)
    cl::HideUnrelatedOptions(category(), *s.command);
  cl::HideUnrelatedOptions(category());
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "tgc: a transformer graph compiler and runtime\n\n"
          "  tgc compile MODEL.yaml [--dump-after=PASS|all] [--disable-pass=PASS] [--stats]\n"
          "  tgc opt FILE.ir --passes=a,b\n"
          "  tgc run MODEL.yaml\n"
          "  tgc train MODEL.yaml [--steps N] [--save CKPT] [--log FILE.jsonl]\n"
          "  tgc generate CKPT --prompt \"5 12 19\" [--tokens N]\n"
          "  tgc eval CKPT\n"
          "  tgc inspect CKPT [--json]\n"
          "  tgc bench MODEL.yaml [--precisions fp32,bf16,fp8] [--bench-steps N] [--json FILE]\n"
          "  tgc report RUN.jsonl [--bench BENCH.json] -o report.html\n"
          "  tgc convert HF_FOLDER -o CKPT   |   tgc convert CKPT -o HF_FOLDER\n"
          "  tgc tokenize TOKENIZER TEXT [-o tokens.u32]   |   tgc tokenize TOKENIZER IDS --decode\n"
          "  tgc tokenizer train CORPUS.txt --vocab N -o tok.model\n"
          "  tgc info\n\n"
          "  tgc SUBCOMMAND --help shows the options of each.\n",
          &llvm::errs()))
    return 1;
  // A failed allocation (or thread) is an error message and exit 1, not an abort: InitLLVM's
  // out-of-memory handler is replaced so that operator new throws.
  std::set_new_handler(nullptr);
  // LLVM's own allocations (its containers' growth) end in report_bad_alloc_error, which aborts
  // by default: one line and exit 1 instead.
  llvm::install_bad_alloc_error_handler([](void *, const char *, bool) {
    static const char message[] = "tgc: error: out of host memory; use a smaller --batch or model\n";
    ssize_t written = ::write(2, message, sizeof message - 1); // no allocation from here on
    (void)written;
    ::_exit(1);
  });
  try {
    int status = runSubcommand();
    // A closed pipe or a full disk under standard output: one line and exit 1, not LLVM's
    // abort when the stream is destroyed with its error unread.
    llvm::outs().flush();
    if (llvm::outs().has_error()) {
      std::string message = llvm::outs().error().message();
      llvm::outs().clear_error();
      if (status != 0) // the command has said why it ended (training: standard output closed)
        return status;
      llvm::errs() << "tgc: error: writing to standard output failed: " << message << "\n";
      return 1;
    }
    return status;
  } catch (const std::bad_alloc &) {
    llvm::errs() << "tgc: error: out of host memory; use a smaller --batch or model\n";
    return 1;
  } catch (const std::system_error &e) { // a worker thread the system would not start
    llvm::errs() << "tgc: error: " << e.what() << "\n";
    return 1;
  }
}
