#include "backends/cuda/runtime/CudnnAttention.h"

#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/libraries/Nvrtc.h"
#include "backends/cuda/runtime/CudaCheck.h"
#include "backends/cuda/runtime/GemmTuning.h"

#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/raw_ostream.h"

#include <fmt/format.h>

namespace tgc {

CudnnAttentionRunner::~CudnnAttentionRunner() {
  buffers_.clear();
  plans_.clear(); // before their handle
  if (handle_)
    cudnn_->destroy(handle_);
}

llvm::Error CudnnAttentionRunner::setStream(cudaStream_t stream) {
  if (handle_)
    if (int status = cudnn_->setStream(handle_, stream); status != 0)
      return cudaFailure("cudnnSetStream", __FILE__, __LINE__, cudnn_->errorString(status));
  return llvm::Error::success();
}

void CudnnAttentionRunner::plan(const Graph &graph, bool enabled, const DeviceInfo &device, bool print,
                                LoweringOptions &lowering, std::string &description) {
  std::vector<Op *> ops = graph.ops();
  ops_.assign(ops.size(), nullptr);
  buffers_.resize(ops.size());
  std::vector<std::pair<size_t, CudnnAttentionShape>> candidates; // op index, shape
  for (size_t i = 0; i < ops.size(); ++i)
    if (auto shape = cudnnAttentionShape(graph, *ops[i], lowering))
      candidates.emplace_back(i, *shape);
  if (candidates.empty() || !enabled || cudnnTurnedOff())
    return;
  // cuDNN's flash attention needs compute capability 8.0 (Ampere) on.
  if (device.major < 8) {
    description += ", attention by tgc's kernels (cuDNN's needs compute capability 8.0)";
    return;
  }
  auto api = loadCudnn();
  if (!api) {
    llvm::consumeError(api.takeError());
    description += ", attention by tgc's kernels (cuDNN 9 not found; TGC_CUDNN_LIBRARY names it)";
    return;
  }
  cudnn_ = *api;
  if (int status = cudnn_->create(&handle_); status != 0) {
    description += fmt::format(", attention by tgc's kernels (cudnnCreate: {})", cudnn_->errorString(status));
    handle_ = nullptr;
    return;
  }
  std::string refused; // the first shape cuDNN did not take, and why
  size_t taken = 0;
  // cuDNN's engine configurations are chosen as the GEMMs' algorithms are (GemmTuning.h): timed
  // once, the choice kept in the kernel cache folder, so that later runs build that plan alone
  // and the same seed keeps its bits.
  GemmTuner tuner(kernelCacheDir() + "/gemm-algorithms.txt");
  for (auto &[index, shape] : candidates) {
    auto it = plans_.find(shape.key());
    if (it == plans_.end()) {
      std::string key = fmt::format("cudnn {} {} {}", cudnn_->versionText(), device.name, shape.key());
      std::optional<int> kept = tuner.enabled() ? tuner.kept(key) : std::optional<int>(0);
      auto plan = CudnnAttention::create(*cudnn_, handle_, shape, kept ? *kept : -1);
      if (plan && (*plan)->candidates() > 1)
        if (auto err = choose(**plan, tuner, key)) {
          llvm::consumeError(std::move(err)); // untimed: the heuristic's first
          (*plan)->choose(0);
        }
      if (!plan) {
        std::string why = llvm::toString(plan.takeError());
        if (refused.empty())
          refused = why;
        it = plans_.emplace(shape.key(), nullptr).first;
      } else {
        if (print)
          llvm::errs() << fmt::format("tgc: cuDNN's attention ({}): engine configuration {} of {}, {} bytes of workspace\n",
                                      shape.key(), (*plan)->engineConfig(), (*plan)->engineConfigs(),
                                      (*plan)->workspaceBytes());
        it = plans_.emplace(shape.key(), std::move(*plan)).first;
      }
    }
    if (!it->second)
      continue;
    lowering.cudnnAttention[ops[index]] = it->second->workspaceBytes(); // the lowering runs each so
    ops_[index] = it->second.get();
    ++taken;
  }
  tuner.save();
  // An attention that reads q, k and v in place and its gradients run on cuDNN together or not
  // at all (tgc's kernels read the head-major copy such a forward does not write).
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]->kind() != OpKind::Attention || !cudnnReadsQkvRows(graph, *ops[i], lowering))
      continue;
    std::vector<const Op *> group = {ops[i]};
    if (ops[i]->numResults() > 2) // the gradients of a forward keeping heads (a prefill's has none)
      for (const Op *user : ops[i]->result(2)->users())
        group.push_back(user);
    if (llvm::all_of(group, [&](const Op *op) { return lowering.cudnnAttention.count(op); }))
      continue;
    for (const Op *op : group)
      if (lowering.cudnnAttention.erase(op)) {
        ops_[size_t(llvm::find(ops, op) - ops.begin())] = nullptr;
        --taken;
      }
  }
  if (taken)
    description += fmt::format(", attention by cuDNN {} ({} of {} ops)", cudnn_->versionText(), taken,
                                candidates.size());
  if (!refused.empty()) {
    description += taken ? "" : ", attention by tgc's kernels";
    llvm::errs() << "tgc: " << refused << "; tgc's attention kernels run those ops\n";
  }
}

llvm::Error CudnnAttentionRunner::choose(CudnnAttention &plan, GemmTuner &tuner, const std::string &key) {
  // Buffers of the shape's sizes (zeros), on the handle's stream (the default one until the
  // executor's exists), for the candidates' trial runs; freed after.
  const CudnnAttentionShape &s = plan.shape();
  int64_t rows = s.B * s.T * s.H * s.DH * 2, stats = s.B * s.H * s.T * 4; // bytes of q (and of out); of the stats
  int64_t kvRows = s.B * s.T * (s.KV ? s.KV : s.H) * s.DH * 2;            // of k, and of v
  std::vector<int64_t> sizes = s.backward ? std::vector<int64_t>{3 * rows, rows, rows, stats, 3 * rows, stats}
                                          : std::vector<int64_t>{rows + 2 * kvRows, rows, stats};
  sizes.push_back(16 * 16); // FP8's scales, descales and amaxes (zeros), 16 bytes apart
  int64_t total = plan.largestWorkspaceBytes() + 256;
  for (int64_t bytes : sizes)
    total += (bytes + 255) / 256 * 256;
  char *block = nullptr;
  CUDA_CHECK(cudaMalloc(&block, size_t(total)));
  auto release = llvm::make_scope_exit([&] { cudaFree(block); });
  CUDA_CHECK(cudaMemset(block, 0, size_t(total)));
  std::vector<char *> at;
  char *next = block;
  for (int64_t bytes : sizes) {
    at.push_back(next);
    next += (bytes + 255) / 256 * 256;
  }
  // Bytes from q to k, k to v: head-major, or in the rows of qkv (not grouped: 3 D wide).
  int64_t D = s.H * s.DH, KD = (s.KV ? s.KV : s.H) * s.DH;
  int64_t part = s.qkvRows ? 2 * D : rows, kvPart = s.qkvRows ? part : kvRows;
  std::vector<void *> pointers = {at[0], at[0] + part, at[0] + part + kvPart, at[1]};
  if (s.backward) // dq, dk, dv in dqkv's rows
    pointers.insert(pointers.end(), {at[2], at[3], at[4], at[4] + 2 * D, at[4] + 2 * (D + KD), at[5]});
  else
    pointers.push_back(at[2]);
  if (s.fp8.enabled) { // no softmax sums; the scalars (BF16 sizes above hold the FP8 operands)
    if (s.backward)
      pointers.pop_back();
    for (int64_t k = 0; k < (s.backward ? 16 : 8); ++k)
      pointers.push_back(at.back() + 16 * k);
  }
  auto buffers = plan.buffers(pointers, next);
  if (!buffers)
    return buffers.takeError();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  auto events = llvm::make_scope_exit([&] {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  });
  // The choice is a configuration's place among cuDNN's heuristic choices (what a later run
  // builds alone); those without a plan here are never chosen.
  auto time = [&](int config) -> llvm::Expected<float> {
    int candidate = -1;
    for (size_t c = 0; c < plan.candidates(); ++c)
      if (plan.engineConfig(c) == config)
        candidate = int(c);
    if (candidate < 0)
      return 1e30f;
    for (int warm = 0; warm < 2; ++warm)
      if (auto err = plan.run(handle_, **buffers, candidate))
        return std::move(err);
    CUDA_CHECK(cudaEventRecord(start, 0));
    for (int run = 0; run < 5; ++run)
      if (auto err = plan.run(handle_, **buffers, candidate))
        return std::move(err);
    CUDA_CHECK(cudaEventRecord(stop, 0));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms;
  };
  int configs = 0;
  for (size_t c = 0; c < plan.candidates(); ++c)
    configs = std::max(configs, plan.engineConfig(c) + 1);
  auto config = tuner.choose(key, configs, time);
  if (!config)
    return config.takeError();
  if (!plan.chooseConfig(*config))
    plan.choose(0);
  return llvm::Error::success();
}

llvm::Error CudnnAttentionRunner::run(size_t i, const OpLowering &lowering, const std::vector<void *> &pointers) {
  std::vector<void *> buffers;
  for (const OpLowering::LibraryBuffer &b : lowering.libraryBuffers)
    buffers.push_back(static_cast<char *>(pointers.at(b.pointer)) + b.offset);
  void *workspace = buffers.back();
  buffers.pop_back();
  // The variant pack is made at the op's first call: no host work at the next ones.
  std::unique_ptr<CudnnAttention::Buffers> &made = buffers_[i];
  if (!made || !made->same(buffers, workspace)) {
    auto fresh = ops_[i]->buffers(buffers, workspace);
    if (!fresh)
      return fresh.takeError();
    made = std::move(*fresh);
  }
  return ops_[i]->run(handle_, *made);
}

} // namespace tgc
