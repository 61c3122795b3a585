#include "app/PrecisionProbe.h"

#include "app/Trainer.h"
#include "backends/cuda/Target.h"
#include "backends/cuda/libraries/Nvrtc.h"
#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "support/BuildInfo.h"
#include "support/Files.h"
#include "transforms/Rewrite.h"
#include "transforms/precision/Precision.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>
#include <mutex>

namespace tgc {
namespace {

constexpr int kWarmupSteps = 3, kTimedSteps = 11;
/// The probe's vocabulary when the head is not probed: the head's GEMMs are the same in every
/// variant, and at 50k entries they would be most of the step and of its noise.
constexpr int64_t kProbeVocab = 1024;
/// The site name under which the all-BF16 probe step is kept.
constexpr const char *kBaseline = "all-bf16";

/// A linear layer whose product FP8 may run (keep_bf16, the multiples of 16 and fp8_min_dim
/// allow it).
struct Candidate {
  std::string site;
  int64_t m = 0, k = 0, n = 0;
};

llvm::Expected<std::vector<Candidate>> fp8Candidates(const ModelConfig &config, int64_t batch,
                                                     PrecisionConfig rules) {
  rules.fp8Layers.reset();
  rules.measured.clear();
  auto graph = buildGPT(config, batch);
  if (!graph)
    return graph.takeError();
  std::vector<Candidate> candidates;
  for (const Op *op : (*graph)->ops()) {
    if (!isLinear(op))
      continue;
    const TensorType &x = op->operand(0)->type(), &w = op->operand(1)->type();
    int64_t k = x.dim(-1), n = w.dim(0), m = x.numElements() / k;
    std::string site = gemmSite(*op);
    if (chooseGemmPrecision(rules, site, m, k, n).fp8)
      candidates.push_back({site, m, k, n});
  }
  return candidates;
}

/// The probe steps kept in the kernel cache folder: "key\tmilliseconds" per line.
class ProbeCache {
public:
  ProbeCache() : file_(kernelCacheDir() + "/fp8-choices.txt") {
    auto buffer = llvm::MemoryBuffer::getFile(file_);
    if (!buffer)
      return;
    llvm::SmallVector<llvm::StringRef, 64> lines;
    (*buffer)->getBuffer().split(lines, '\n', -1, false);
    for (llvm::StringRef line : lines) {
      auto [key, time] = line.rsplit('\t');
      double ms = 0;
      if (!key.empty() && !time.getAsDouble(ms) && ms > 0)
        kept_[key.str()] = ms;
    }
  }
  std::optional<double> find(const std::string &key) const {
    std::lock_guard<std::mutex> lock(processMutex());
    if (auto it = processKept().find(key); it != processKept().end())
      return it->second;
    if (auto it = kept_.find(key); it != kept_.end())
      return it->second;
    return std::nullopt;
  }
  void keep(const std::string &key, double ms) {
    kept_[key] = ms;
    std::lock_guard<std::mutex> lock(processMutex());
    processKept()[key] = ms;
  }
  /// Writes the file back atomically; a cache folder that cannot be written only costs the
  /// measurement again next time.
  void save() const {
    std::string text;
    for (const auto &[key, ms] : kept_)
      text += fmt::format("{}\t{:.4f}\n", key, ms);
    if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(file_)))
      return;
    llvm::consumeError(writeFileAtomically(file_, text));
  }

private:
  using Times = std::map<std::string, double>;
  /// This process's measurements: the ranks of a run, and later trainers, take them even where
  /// the folder cannot be written.
  static Times &processKept() {
    static Times kept;
    return kept;
  }
  static std::mutex &processMutex() {
    static std::mutex mutex;
    return mutex;
  }
  std::string file_;
  Times kept_;
};

/// What a probe's times depend on: the GPU, the build, and every setting that changes the
/// programs compared.
std::string probeKey(const ModelConfig &probe, const Device &device, const Candidate &c) {
  TargetInfo target = detectTarget();
  std::string gpu = device.ordinal < int(target.gpus.size()) ? target.gpus[device.ordinal].name : "gpu";
  const PrecisionConfig &p = probe.precision;
  return fmt::format("{} sm_{} cuda {} tgc {} | d{} h{} ffn{} T{} B{} V{} {} {} bias {} tie {} recompute {} | "
                     "{} {} {} history {} margin {} | {} {}x{}x{}",
                     gpu, device.computeCapability, target.runtimeVersion, buildCommit(), probe.dModel, probe.heads,
                     probe.ffn, probe.seqLen, probe.train.batch, probe.vocab, int(probe.norm), int(probe.activation),
                     probe.bias, probe.tieEmbeddings, probe.train.recompute, fp8FormatName(p.fp8Format).str(),
                     fp8ScalingName(p.fp8Scaling).str(), p.amaxComputeAlgo, p.amaxHistoryLen, p.margin,
                     layerPattern(c.site), c.m, c.k, c.n);
}

/// The median training step of `probe` with the layers `fp8Layers` names in FP8.
llvm::Expected<double> probeStepMs(ModelConfig probe, const Device &device, std::vector<std::string> fp8Layers) {
  probe.precision.fp8Layers = std::move(fp8Layers);
  auto trainer = Trainer::create(probe, "", device);
  if (!trainer)
    return trainer.takeError();
  std::vector<double> ms;
  for (int i = 0; i < kWarmupSteps + kTimedSteps; ++i) {
    auto record = (*trainer)->step();
    if (!record)
      return record.takeError();
    if (i >= kWarmupSteps)
      ms.push_back(record->stepMs);
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

/// The one-layer model the kinds of layer are timed in: `config`'s widths, one rank's batch,
/// the arithmetic task, an explicit fp8 recipe.
ModelConfig probeModel(const ModelConfig &config, const PrecisionConfig &resolved, int64_t batch,
                       bool headProbed) {
  ModelConfig probe = config;
  probe.name = config.name + "-precision-probe";
  probe.layers = 1;
  probe.train.batch = batch;
  probe.data = DataConfig{};
  if (!headProbed)
    probe.vocab = std::min(config.vocab, kProbeVocab);
  probe.precision = resolved;
  probe.precision.recipe = Recipe::Fp8;
  return probe;
}

} // namespace

std::string describeMeasurement(const GemmMeasurement &m) {
  return fmt::format("{:<14} ({} x {} x {}): {}, probe step {:.3f} ms with it in FP8, {:.3f} in BF16{}",
                     layerPattern(m.site), m.m, m.k, m.n, m.fp8() ? "FP8 " : "BF16", m.fp8Ms, m.bf16Ms,
                     m.cached ? " (cached)" : "");
}

std::pair<int64_t, int64_t> countFp8Layers(const Graph &program, const ModelConfig &config) {
  int64_t fp8Layers = 0, linearLayers = 0;
  for (const Op *op : program.ops()) { // linear weights: [out, in] "*.weight"
    llvm::StringRef site = op->result() ? llvm::StringRef(op->result()->name()) : "";
    if (op->kind() != OpKind::Param || op->result()->type().rank() != 2 || !site.consume_back(".weight"))
      continue;
    ++linearLayers;
    fp8Layers += program.lookup(program::fp8StatePrefix(site, program::Fp8Role::Weight) + ".scale") != nullptr;
  }
  linearLayers += config.tieEmbeddings; // the head reads wte, which the loop does not count
  return {fp8Layers, linearLayers};
}

std::vector<std::string> fp8LayersOf(const std::map<std::string, Tensor> &weights) {
  std::vector<std::string> sites;
  for (const auto &entry : weights)
    if (auto site = program::fp8SiteOfInputScale(entry.first))
      sites.push_back(*site);
  return sites;
}

llvm::Expected<PrecisionConfig> choosePrecision(const ModelConfig &config, const Device &device,
                                                Communicator *communicator) {
  PrecisionConfig resolved = resolveRecipe(config.precision, device);
  if (config.precision.recipe != Recipe::Auto || device != Device::Cuda || resolved.recipe != Recipe::Fp8 ||
      resolved.fp8Layers)
    return resolved;
  int ranks = communicator ? communicator->ranks() : 1;
  int64_t batch = config.train.batch / ranks;
  auto all = fp8Candidates(config, batch, resolved);
  if (!all)
    return all.takeError();
  bool headProbed = llvm::any_of(*all, [](const Candidate &c) { return layerPattern(c.site) == c.site; });
  ModelConfig probe = probeModel(config, resolved, batch, headProbed);
  auto probed = fp8Candidates(probe, batch, resolved);
  if (!probed)
    return probed.takeError();
  // One site of each kind (h0.attn.qkv stands for every h*.attn.qkv), then the times: the
  // all-BF16 step first, each kind's FP8 step after it, cached or measured.
  std::vector<Candidate> kinds;
  for (const Candidate &c : *probed)
    if (llvm::none_of(kinds, [&](const Candidate &k) { return layerPattern(k.site) == layerPattern(c.site); }))
      kinds.push_back(c);
  resolved.fp8Layers.emplace();
  if (kinds.empty())
    return resolved;
  ProbeCache cache;
  std::vector<float> times;
  std::vector<bool> cached;
  bool timed = false;
  auto timeOf = [&](const Candidate &c, std::vector<std::string> layers) -> llvm::Error {
    std::string key = probeKey(probe, device, c);
    if (auto kept = cache.find(key)) {
      times.push_back(float(*kept));
      cached.push_back(true);
      return llvm::Error::success();
    }
    auto ms = probeStepMs(probe, device, std::move(layers));
    if (!ms)
      return ms.takeError();
    cache.keep(key, *ms);
    times.push_back(float(*ms));
    cached.push_back(false);
    timed = true;
    return llvm::Error::success();
  };
  if (auto err = timeOf(Candidate{kBaseline, batch * config.seqLen, 0, 0}, {}))
    return std::move(err);
  for (const Candidate &c : kinds)
    if (auto err = timeOf(c, {c.site}))
      return std::move(err);
  if (communicator && ranks > 1) { // every rank takes the mean of the ranks' times
    if (auto err = communicator->allReduceHost(times.data(), times.size(), ReduceOp::Avg))
      return std::move(err);
  }
  for (size_t i = 0; i < kinds.size(); ++i) {
    GemmMeasurement m{kinds[i].site, kinds[i].m, kinds[i].k, kinds[i].n, times[0], times[i + 1], cached[i + 1]};
    resolved.measured.push_back(m);
    if (m.fp8())
      resolved.fp8Layers->push_back(layerPattern(m.site));
  }
  if (timed && (!communicator || communicator->rank() == 0))
    cache.save();
  return resolved;
}

} // namespace tgc
