// tgc inspect and info: a checkpoint's FP8 scaling state; what this machine and build can run.
#include "app/SentencePiece.h"
#include "backends/cpu/Pipeline.h"
#include "backends/cuda/libraries/CublasLt.h"
#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/libraries/Libraries.h"
#include "backends/cuda/libraries/Nccl.h"
#include "backends/cuda/Target.h"
#include "support/BuildInfo.h"
#include "tools/tgc/Options.h"

#include "llvm/Support/JSON.h"

#include <fmt/format.h>

namespace tgc::cli {

namespace {

static cl::opt<bool> Json("json", cl::desc("Print JSON for scripts"), cl::sub(inspectCommand()),
                          cl::cat(category()));

} // namespace

int runInspect() {
  auto trained = loadTrained(CheckpointPath, /*requireFinite=*/false); // shown, with a warning below
  if (!trained)
    return report(trained.takeError());
  auto &[config, checkpoint] = *trained;
  // On stderr, so that --json stays JSON; of "PATH: error: what", the what.
  if (auto err = checkFinite(checkpoint, CheckpointPath)) {
    std::string message = llvm::toString(std::move(err));
    llvm::errs() << "tgc: warning: " << message.substr(message.find(": error: ") + 9) << "\n";
  }
  PrecisionConfig precision = resolveRecipeForCpu(config.precision);
  auto summary = summarizeFp8State(checkpoint.tensors, precision, /*newest=*/8);
  int64_t step = checkpoint.meta.getInteger("step").value_or(0);
  if (Json) {
    llvm::json::Array tensors;
    for (const Fp8TensorSummary &s : summary) {
      llvm::json::Array amax;
      for (float a : s.newestAmax)
        amax.push_back(double(a));
      llvm::json::Object tensor{{"gemm", s.site},
                                {"operand", s.role},
                                {"format", s.format},
                                {"scale", double(s.scale)},
                                {"scale_inv", double(s.scaleInv)},
                                {"amax_newest_first", std::move(amax)},
                                {"amax_history_len", s.historyLength},
                                {s.blockScaled ? "flushed" : "saturated", s.saturations}};
      if (s.blockScaled) { // the newest step's block scales
        tensor["block_scale_min"] = double(s.smallestBlockScale);
        tensor["block_scale_max"] = double(s.largestBlockScale);
      }
      tensors.push_back(std::move(tensor));
    }
    llvm::outs() << llvm::json::Value(llvm::json::Object{{"model", config.name},
                                                          {"step", step},
                                                          {"recipe", recipeName(precision.recipe)},
                                                          {"fp8_format", fp8FormatName(precision.fp8Format)},
                                                          {"fp8_scaling", fp8ScalingName(precision.fp8Scaling)},
                                                          {"margin", precision.margin},
                                                          {"amax_compute_algo", precision.amaxComputeAlgo},
                                                          {"tensors", std::move(tensors)}})
                 << "\n";
    return 0;
  }
  // Names come from the file: terminal escape sequences in them are shown, not obeyed.
  llvm::outs() << fmt::format("{}: model {}, step {}, recipe {}", escapeForMessage(CheckpointPath.getValue()),
                              escapeForMessage(config.name), step, recipeName(precision.recipe).str());
  if (precision.recipe == Recipe::Fp8)
    llvm::outs() << fmt::format(" ({}, {} scaling, margin {}, amax history {}, {})",
                                fp8FormatName(precision.fp8Format).str(), fp8ScalingName(precision.fp8Scaling).str(), precision.margin,
                                precision.amaxHistoryLen, precision.amaxComputeAlgo);
  llvm::outs() << "\n";
  if (summary.empty()) {
    llvm::outs() << "no FP8 scaling state: nothing in this model was quantized\n";
    return 0;
  }
  llvm::outs() << fmt::format("{} quantized tensors:\n", summary.size());
  printFp8Summary(summary, llvm::outs());
  return 0;
}

int runInfo() {
  TargetInfo info = detectTarget();
  llvm::outs() << fmt::format("tgc {}, built with CUDA: {}\n", buildCommit(), info.builtWithCuda ? "yes" : "no");
  if (info.builtWithCuda) {
    llvm::outs() << fmt::format("  cudart {}.{}, NVRTC {}.{}\n", info.runtimeVersion / 1000,
                                info.runtimeVersion % 1000 / 10, info.nvrtcMajor, info.nvrtcMinor);
#ifdef TGC_HAVE_CUDA
    // cuBLASLt (every GEMM on the GPU) is opened at run time, where a GPU program first needs it.
    if (auto blas = loadCublasLt())
      llvm::outs() << fmt::format("  cuBLASLt {} ({})\n", versionFromCode((*blas)->version), (*blas)->path);
    else
      llvm::outs() << "  cuBLASLt: none, no GPU programs (" << llvm::toString(blas.takeError()).substr(7) << ")\n";
#endif
    if (info.driverVersion)
      llvm::outs() << fmt::format("  CUDA driver {}.{}\n", info.driverVersion / 1000,
                                  info.driverVersion % 1000 / 10);
  }
  // NCCL (data-parallel training's collectives) is opened at run time wherever it is found.
  if (info.builtWithCuda) {
    if (auto nccl = loadNccl())
      llvm::outs() << fmt::format("  NCCL {} ({})\n", (*nccl)->versionText(), (*nccl)->path);
    else
      llvm::outs() << "  NCCL: none (" << llvm::toString(nccl.takeError()).substr(7) << ")\n";
    // cuDNN (the fused attention of BF16 programs) likewise; tgc's own kernels run without it.
    if (auto cudnn = loadCudnn())
      llvm::outs() << fmt::format("  cuDNN {} ({}): BF16 attention from compute capability 8.0 (TGC_CUDNN=0: "
                                  "tgc's kernels)\n",
                                  (*cudnn)->versionText(), (*cudnn)->path);
    else
      llvm::outs() << "  cuDNN: none, tgc's attention kernels (" << llvm::toString(cudnn.takeError()).substr(7)
                   << ")\n";
  }
  // SentencePiece (tokenizer train, .model tokenizers) through tgc's plugin, opened at run time.
  if (auto err = sentencePieceAvailable())
    llvm::outs() << "  SentencePiece: none (" << llvm::toString(std::move(err)).substr(32) << ")\n";
  else
    llvm::outs() << "  SentencePiece: yes (tgc tokenizer train, .model tokenizers)\n";
  for (size_t i = 0; i < info.gpus.size(); ++i) {
    const GpuInfo &g = info.gpus[i];
    llvm::outs() << fmt::format("GPU {}: {}, compute capability {}.{}, {} SMs, {:.1f} GiB\n", i,
                                g.name, g.major, g.minor, g.smCount,
                                double(g.memoryBytes) / double(1ull << 30));
  }
  if (info.gpus.empty())
    llvm::outs() << "GPU: none (" << info.noGpuReason << ")\n";
  llvm::outs() << "backends: cpu (reference interpreter)"
               << (info.gpus.empty() ? "" : ", cuda (generated kernels + cuBLASLt)") << "\n";
  llvm::outs() << "recipes:\n"
                  "  fp32  cpu: yes\n"
                  "  bf16  cpu: yes, emulated (operands rounded to BF16 as CUDA rounds them, "
                  "fp32 accumulation)\n"
                  "  fp8   cpu: yes, emulated (E4M3/E5M2 bit for bit with cuda_fp8.h, delayed "
                  "scaling as Transformer Engine)\n";
  for (const GpuInfo &g : info.gpus) {
    int cc = g.major * 10 + g.minor;
    llvm::outs() << fmt::format("  on {} (compute capability {}.{}): FP8 tensor cores {}, BF16 {}\n",
                                g.name, g.major, g.minor,
                                cc >= 89 ? "yes" : "no (needs 8.9)",
                                cc >= 80 ? "yes" : "no (needs 8.0)");
  }
  llvm::outs() << "  GPU backend (NVRTC kernels, cuBLASLt): fp32, bf16 (from 8.0) and fp8 (from 8.9)\n"
                  "  --precision fp8: every legal linear layer in FP8, as Transformer Engine's fp8_autocast "
                  "(keep_bf16, fp8_layers and fp8_min_dim narrow it; compile --explain-precision)\n"
                  "  --precision auto: fp32 on the CPU interpreter; on a GPU from compute capability 8.9 "
                  "fp8 for the layers measured faster in FP8 there (the others BF16), bf16 from 8.0, fp32 below\n";
  return 0;
}

} // namespace tgc::cli
