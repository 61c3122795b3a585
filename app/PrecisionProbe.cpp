#include "app/PrecisionProbe.h"

#include "app/Trainer.h"
#include "backends/cuda/Target.h"
#include "backends/cuda/libraries/Nvrtc.h"
#include "models/GPTBuilder.h"
#include "models/ProgramInterface.h"
#include "support/BuildInfo.h"
#include "support/KeptValues.h"
#include "transforms/Rewrite.h"
#include "transforms/precision/Precision.h"

#include <algorithm>
#include <fmt/format.h>
#include <map>

namespace tgc {
namespace {

constexpr int kWarmupSteps = 3, kTimedSteps = 11;
/// The probe's blocks: at most this many of the model's (all of a small model's), so that the
/// blocks, not the embedding, head and optimizer, are most of the step the sets are compared by.
constexpr int64_t kProbeLayers = 4;
/// A set replaces all-BF16 (or all-FP8) only when its probe step is at least this much faster:
/// less is within the noise of two steps' medians.
constexpr double kFp8Margin = 0.01;
/// The probe's vocabulary when the head is not probed: the head's GEMMs are the same in every
/// variant, and at 50k entries they would be most of the step and of its noise.
constexpr int64_t kProbeVocab = 1024;

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
  ProbeCache() : kept_(kernelCacheDir() + "/fp8-choices.txt") {}
  std::optional<double> find(const std::string &key) const {
    auto text = kept_.find(key);
    double ms = 0;
    if (!text || llvm::StringRef(*text).getAsDouble(ms) || !(ms > 0))
      return std::nullopt;
    return ms;
  }
  // The shortest text that reads back as the same double: a warm start chooses from exactly
  // the times the cold one chose from.
  void keep(const std::string &key, double ms) { kept_.keep(key, fmt::format("{}", ms)); }
  void save() const { kept_.save(); }

private:
  KeptValues kept_;
};

/// What a probe's times depend on: the GPU, the build, and every setting that changes the
/// programs compared.
std::string probeKey(const ModelConfig &probe, const Device &device, const std::string &label) {
  TargetInfo target = detectTarget();
  std::string gpu = device.ordinal < int(target.gpus.size()) ? target.gpus[device.ordinal].name : "gpu";
  const PrecisionConfig &p = probe.precision;
  return fmt::format("{} sm_{} cuda {} tgc {} | L{} d{} h{} ffn{} T{} B{} V{} {} {} bias {} tie {} recompute {} | "
                     "{} {} {} history {} margin {} | {}",
                     gpu, device.computeCapability, target.runtimeVersion, buildCommit(), probe.layers, probe.dModel, probe.heads,
                     probe.ffn, probe.seqLen, probe.train.batch, probe.vocab, int(probe.norm), int(probe.activation),
                     probe.bias, probe.tieEmbeddings, probe.train.recompute, fp8FormatName(p.fp8Format).str(),
                     fp8ScalingName(p.fp8Scaling).str(), p.amaxComputeAlgo, p.amaxHistoryLen, p.margin,
                     label);
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

/// The model of at most kProbeLayers blocks the kinds of layer are timed in: `config`'s widths,
/// one rank's batch,
/// the arithmetic task, an explicit fp8 recipe.
ModelConfig probeModel(const ModelConfig &config, const PrecisionConfig &resolved, int64_t batch,
                       bool headProbed) {
  ModelConfig probe = config;
  probe.name = config.name + "-precision-probe";
  probe.layers = std::min(config.layers, kProbeLayers);
  probe.train.batch = batch;
  probe.data = DataConfig{};
  if (!headProbed)
    probe.vocab = std::min(config.vocab, kProbeVocab);
  probe.precision = resolved;
  probe.precision.recipe = Recipe::Fp8;
  return probe;
}

/// The probe steps of sets of kinds in FP8 (bit i: kinds[i]), from the cache or timed; with a
/// communicator every rank times its own GPU and all take the ranks' mean, so that all choose
/// alike (every rank asks for the same sets in the same order).
class SubsetTimer {
public:
  SubsetTimer(const ModelConfig &probe, const Device &device, const std::vector<Candidate> &kinds,
              Communicator *communicator)
      : probe_(probe), device_(device), kinds_(kinds), communicator_(communicator),
        keyPrefix_(probeKey(probe, device, "")) {}

  llvm::Expected<bool> time(const std::vector<uint32_t> &sets) {
    std::vector<float> times;
    for (uint32_t set : sets) {
      std::string key = keyPrefix_ + label(set);
      if (auto kept = cache_.find(key)) {
        times.push_back(float(*kept));
        cached_[set] = true;
        continue;
      }
      std::vector<std::string> layers;
      for (size_t i = 0; i < kinds_.size(); ++i)
        if (set & (uint32_t(1) << i))
          layers.push_back(layerPattern(kinds_[i].site)); // every probe block's layer of the kind
      auto ms = probeStepMs(probe_, device_, std::move(layers));
      if (!ms)
        return ms.takeError();
      cache_.keep(key, *ms);
      times.push_back(float(*ms));
      cached_[set] = false;
      changed_ = true;
    }
    if (communicator_ && communicator_->ranks() > 1)
      if (auto err = communicator_->allReduceHost(times.data(), times.size(), ReduceOp::Avg))
        return std::move(err);
    for (size_t i = 0; i < sets.size(); ++i)
      ms_[sets[i]] = times[i];
    return true;
  }
  bool timed(uint32_t set) const { return ms_.count(set); }
  double ms(uint32_t set) const { return ms_.at(set); }
  bool cached(uint32_t set) const { return cached_.at(set); }
  size_t count() const { return ms_.size(); }
  /// The choice among the sets timed: all-BF16 (set 0), all-FP8 where it is faster by kFp8Margin,
  /// and any other set that beats that one by kFp8Margin: a difference within the probe's
  /// noise keeps the simpler program.
  uint32_t fastest(uint32_t all) const {
    uint32_t best = ms_.at(all) < ms_.at(0) * (1 - kFp8Margin) ? all : 0;
    for (const auto &[set, ms] : ms_)
      if (ms < ms_.at(best) * (1 - kFp8Margin))
        best = set;
    return best;
  }
  void save() const {
    if (changed_ && (!communicator_ || communicator_->rank() == 0))
      cache_.save();
  }

private:
  /// "fp8 {h*.attn.qkv h*.mlp.fc1} 16384x768x2304 16384x768x3072": the set and its shapes.
  std::string label(uint32_t set) const {
    std::string names, shapes;
    for (size_t i = 0; i < kinds_.size(); ++i) {
      if (!(set & (uint32_t(1) << i)))
        continue;
      names += (names.empty() ? "" : " ") + layerPattern(kinds_[i].site);
      shapes += fmt::format(" {}x{}x{}", kinds_[i].m, kinds_[i].k, kinds_[i].n);
    }
    return "fp8 {" + names + "}" + shapes;
  }

  const ModelConfig &probe_;
  const Device &device_;
  const std::vector<Candidate> &kinds_;
  Communicator *communicator_;
  std::string keyPrefix_; // probeKey's GPU, build and probe, asked of the driver once
  ProbeCache cache_;
  std::map<uint32_t, double> ms_;
  std::map<uint32_t, bool> cached_;
  bool changed_ = false;
};

} // namespace

std::string describeMeasurement(const GemmMeasurement &m) {
  return fmt::format("{:<14} ({} x {} x {}): {}, probe step {:.3f} ms with every kind in FP8, {:.3f} with this "
                     "one in BF16{}",
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
  if (config.tieEmbeddings) { // the head reads wte, which the loop does not count: its state is lm_head's
    ++linearLayers;
    fp8Layers += program.lookup(program::fp8StatePrefix("lm_head", program::Fp8Role::Weight) + ".scale") != nullptr;
  }
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
  auto legal = fp8Candidates(config, batch, resolved);
  if (!legal)
    return legal.takeError();
  bool headProbed = llvm::any_of(*legal, [](const Candidate &c) { return layerPattern(c.site) == c.site; });
  ModelConfig probe = probeModel(config, resolved, batch, headProbed);
  auto probed = fp8Candidates(probe, batch, resolved);
  if (!probed)
    return probed.takeError();
  // One site of each kind (h0.attn.qkv stands for every h*.attn.qkv).
  std::vector<Candidate> kinds;
  for (const Candidate &c : *probed)
    if (llvm::none_of(kinds, [&](const Candidate &k) { return layerPattern(k.site) == layerPattern(c.site); }))
      kinds.push_back(c);
  resolved.fp8Layers.emplace();
  if (kinds.empty() || kinds.size() > 16)
    return resolved;
  SubsetTimer timer{probe, device, kinds, communicator};
  // The kinds interact (a layer's neighbours decide which casts fuse and which copies are
  // kept), so sets are timed, not kinds alone: none and all in FP8, all but each kind, and
  // all but every kind whose removal was faster; the fastest set timed is the choice.
  const uint32_t all = (uint32_t(1) << kinds.size()) - 1;
  std::vector<uint32_t> sets{0, all};
  for (size_t i = 0; i < kinds.size() && kinds.size() > 1; ++i)
    sets.push_back(all & ~(uint32_t(1) << i));
  auto times = timer.time(sets);
  if (!times)
    return times.takeError();
  uint32_t combined = all;
  for (size_t i = 0; i < kinds.size() && kinds.size() > 1; ++i)
    if (timer.ms(all & ~(uint32_t(1) << i)) < timer.ms(all))
      combined &= ~(uint32_t(1) << i);
  if (!timer.timed(combined))
    if (auto more = timer.time({combined}); !more)
      return more.takeError();
  uint32_t best = timer.fastest(all);
  for (size_t i = 0; i < kinds.size(); ++i) {
    uint32_t bit = uint32_t(1) << i, without = kinds.size() > 1 ? all & ~bit : 0;
    GemmMeasurement m{kinds[i].site, kinds[i].m, kinds[i].k, kinds[i].n, timer.ms(without), timer.ms(all),
                      timer.cached(all) && timer.cached(without), bool(best & bit)};
    resolved.measured.push_back(m);
    if (m.chosen)
      resolved.fp8Layers->push_back(layerPattern(m.site));
  }
  if (best == 0) // no FP8 layer: the bf16 recipe's program itself
    resolved.recipe = Recipe::Bf16;
  resolved.measuredSummary =
      fmt::format("probe steps ({} blocks): {:.3f} ms all BF16, {:.3f} all FP8, {:.3f} as chosen ({} of {} kinds "
                  "FP8; {} sets timed)",
                  probe.layers, timer.ms(0), timer.ms(all), timer.ms(best), resolved.fp8Layers->size(), kinds.size(),
                  timer.count());
  timer.save();
  return resolved;
}

} // namespace tgc
