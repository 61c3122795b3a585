#include "backends/cuda/libraries/Cudnn.h"
#include "backends/cuda/libraries/CudnnGraph.h"

#include "backends/cuda/libraries/Libraries.h"
#include "support/Environment.h"
#include "support/Error.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <limits>

namespace tgc {

namespace {

constexpr const char *kCudnnLibrary = "libcudnn.so.9", *kCudnnEnvironment = "TGC_CUDNN_LIBRARY";

void forwardGraph(GraphBuilder &g, const AttentionLayout &l) {
  const Dims &statDims = l.statDims, &scoreDims = l.scoreDims;
  void *out = l.out, *stats = l.stats, *negativeInfinity = l.negativeInfinity, *scaled = l.scaled;
  // cudnn_frontend's SDPA forward: scores, scale, causal mask, softmax (max, exp, sum; the
  // statistics max + log(sum)), probabilities in BF16 times v.
  void *v = g.tensor(UidV, cudnn::Bf16, l.kvDims, l.kvStrides, false);
  void *masked = causalMask(g, scaled, scoreDims, negativeInfinity);
  void *probabilities = softmaxWithStats(g, masked, statDims, scoreDims, stats, cudnn::Bf16);
  g.matmul(probabilities, v, out);
}

void backwardGraph(GraphBuilder &g, const AttentionLayout &l, bool doutRows) {
  const Dims &headDims = l.headDims, &headStrides = l.headStrides, &rowDims = l.rowDims, &rowStrides = l.rowStrides;
  const Dims &packedStrides = l.packedStrides, &transposedDims = l.transposedDims;
  const Dims &transposedStrides = l.transposedStrides, &statDims = l.statDims, &statStrides = l.statStrides;
  const Dims &scoreDims = l.scoreDims;
  const int64_t H = l.H, T = l.T, DH = l.DH;
  void *q = l.q, *kT = l.kT, *out = l.out, *stats = l.stats, *scale = l.scale;
  void *negativeInfinity = l.negativeInfinity, *scaled = l.scaled;
  // cudnn_frontend's SDPA backward without dropout or bias, deterministic (dq straight from its
  // product): sum(dout * out) per query; the probabilities again from the statistics; dv =
  // P^T dout; dS = P (dout v^T - sum) * scale; dk = dS^T q; dq = dS k.
  void *vT = g.tensor(UidV, cudnn::Bf16, transposedDims, transposedStrides, false);
  void *dout = g.tensor(UidDO, cudnn::Bf16, headDims, doutRows ? rowStrides : headStrides, false);
  void *dq = g.tensor(UidDQ, cudnn::Bf16, rowDims, packedStrides, false);
  void *dk = g.tensor(UidDK, cudnn::Bf16, l.kvDims, packedStrides, false); // in dqkv's rows too
  void *dv = g.tensor(UidDV, cudnn::Bf16, l.kvDims, packedStrides, false);
  // Grouped-query attention: each query head's dk and dv are virtual BF16 intermediates
  // [B][H][T][DH], summed over a KV head's G query heads by a reduction into dk and dv (how
  // cudnn_frontend builds it for dense layouts; no full-head buffer in memory).
  bool grouped = l.kvDims[1] != H;
  auto fullHead = [&](void *kvGrad) { return grouped ? g.intermediate(headDims, headStrides, cudnn::Bf16) : kvGrad; };
  void *dkFull = fullHead(dk), *dvFull = fullHead(dv);
  void *softmaxSum = g.tensor(UidSoftmaxSum, cudnn::Float, statDims, statStrides, false);
  void *one = g.scalar(UidOne);
  void *products = g.intermediate(rowDims, {H * T * DH, T * DH, H * DH, 1}, cudnn::Float);
  void *rowSums = g.intermediate(statDims);
  g.pointwise(cudnn::Mul, dout, out, products);
  g.reduction(cudnn::ReduceAdd, products, rowSums);
  g.pointwise(cudnn::Mul, rowSums, one, softmaxSum);
  void *centered = g.intermediate(scoreDims);
  g.pointwise(cudnn::Sub, scaled, stats, centered);
  void *masked = causalMask(g, centered, scoreDims, negativeInfinity);
  void *probabilities = g.intermediate(scoreDims);
  g.pointwise(cudnn::Exp, masked, nullptr, probabilities);
  Dims transposedScores = {H * T * T, T * T, 1, T};
  void *probabilitiesT = g.intermediate(scoreDims, transposedScores, cudnn::Bf16);
  g.reshape(probabilities, probabilitiesT);
  g.matmul(probabilitiesT, dout, dvFull);
  if (grouped)
    g.reduction(cudnn::ReduceAdd, dvFull, dv);
  void *dP = g.intermediate(scoreDims), *dPCentered = g.intermediate(scoreDims);
  g.matmul(dout, vT, dP);
  g.pointwise(cudnn::Sub, dP, softmaxSum, dPCentered);
  void *dScores = g.intermediate(scoreDims), *dScaled = g.intermediate(scoreDims);
  g.pointwise(cudnn::Mul, dPCentered, probabilities, dScores);
  g.pointwise(cudnn::Mul, dScores, scale, dScaled);
  void *dScaledT = g.intermediate(scoreDims, transposedScores, cudnn::Bf16);
  g.reshape(dScaled, dScaledT);
  g.matmul(dScaledT, q, dkFull);
  if (grouped)
    g.reduction(cudnn::ReduceAdd, dkFull, dk);
  void *k = g.intermediate(l.kvDims, l.kvStrides, cudnn::Bf16);
  g.reshape(kT, k);
  g.matmul(dScaled, k, dq);
}

} // namespace

std::string CudnnApi::versionText() const { return versionFromCode(version); } // CUDNN_VERSION

std::string CudnnApi::describe(int status) const {
  char message[512] = {0};
  if (lastErrorString)
    lastErrorString(message, sizeof(message));
  return fmt::format("{} ({}){}{}", errorString ? errorString(status) : "", status, message[0] ? ": " : "", message);
}

std::vector<std::string> cudnnCandidates() { return libraryCandidates(kCudnnEnvironment, "cudnn", kCudnnLibrary); }

llvm::Expected<CudnnApi> loadCudnnFrom(const std::vector<std::string> &candidates) {
  auto api = openLibrary<CudnnApi>("cuDNN", kCudnnLibrary, kCudnnEnvironment, candidates, [](void *library, CudnnApi &api) {
    SymbolBinder need(library);
    need("cudnnGetVersion", api.getVersion);
    need("cudnnCreate", api.create);
    need("cudnnDestroy", api.destroy);
    need("cudnnSetStream", api.setStream);
    need("cudnnGetErrorString", api.errorString);
    need("cudnnGetLastErrorString", api.lastErrorString);
    need("cudnnBackendCreateDescriptor", api.createDescriptor);
    need("cudnnBackendDestroyDescriptor", api.destroyDescriptor);
    need("cudnnBackendFinalize", api.finalize);
    need("cudnnBackendSetAttribute", api.setAttribute);
    need("cudnnBackendGetAttribute", api.getAttribute);
    need("cudnnBackendExecute", api.execute);
    if (need.missing())
      return fmt::format("not cuDNN 9: no {}", need.missing());
    api.version = api.getVersion(); // needs no GPU
    if (api.version < 90000 || api.version >= 100000)
      return fmt::format("cuDNN {}: cuDNN 9 is needed", api.versionText());
    return std::string();
  });
  if (!api)
    return api.takeError();
  // cuDNN 9 opens its sub-libraries by name when first used; where they lie beside this one
  // (PyTorch's wheel, not on the loader's path), they are loaded from there first, so that
  // those names find them.
  if (size_t slash = api->path.rfind('/'); slash != std::string::npos)
    for (const char *part : {"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9",
                             "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9"})
      dlopen((api->path.substr(0, slash + 1) + part).c_str(), RTLD_LAZY | RTLD_GLOBAL); // absent: no matter
  return api;
}

bool cudnnTurnedOff() { return !environmentSwitch("TGC_CUDNN", true); }

llvm::Expected<const CudnnApi *> loadCudnn() {
  return loadOnce<CudnnApi>([] { return loadCudnnFrom(cudnnCandidates()); });
}

std::string CudnnAttentionShape::key() const {
  static const char *names[] = {"bf16", "e4m3", "e5m2"};
  std::string fp8Text = fp8.enabled ? fmt::format(" fp8 out {} grad {} dqkv {}", names[int(fp8.out)],
                                                  names[int(fp8.grad)], names[int(fp8.dqkv)])
                                    : "";
  return fmt::format("{} B {} T {} H {}{} DH {} scale {}{}{}{}", backward ? "backward" : "forward", B, T, H,
                     KV && KV != H ? fmt::format(" KV {}", KV) : "", DH, scale, qkvRows ? " qkv rows" : "",
                     doutRows ? " dout rows" : "", fp8Text);
}

llvm::Expected<std::unique_ptr<CudnnAttention>> CudnnAttention::create(const CudnnApi &api, void *handle,
                                                                       const CudnnAttentionShape &s, int only) {
  std::unique_ptr<CudnnAttention> a(new CudnnAttention(api, s));
  a->scalars_.scale = float(s.scale);
  a->scalars_.negativeInfinity = -std::numeric_limits<float>::infinity();
  GraphBuilder g(api, a->descriptors_);
  const int64_t B = s.B, T = s.T, H = s.H, DH = s.DH, D = H * DH;
  // q, k, v head-major ([3][B][H][T][DH]) or rows of the packed qkv ([B][T][3][H][DH]), each
  // [B][H][T][DH] by its strides. cuDNN's first product takes k transposed ([B][H][DH][T], the
  // same memory) and the gradient v too.
  Dims headDims = {B, H, T, DH}, headStrides = packed(headDims);
  Dims rowDims = {B, H, T, DH}, rowStrides = {T * D, DH, D, 1};          // out: [B][T][H * DH]
  // Grouped-query attention: k and v of KV heads, head-major; dqkv's rows (H + 2 KV) DH wide.
  const int64_t KV = s.KV ? s.KV : H, W = D + 2 * KV * DH;
  Dims packedStrides = {T * W, DH, W, 1}; // dq, dk, dv: rows of dqkv
  Dims qkvStrides = s.qkvRows ? packedStrides : headStrides;
  Dims kvDims = {B, KV, T, DH}, kvStrides = KV == H ? qkvStrides : packed(kvDims);
  Dims transposedDims = {B, KV, DH, T},
       transposedStrides = {kvStrides[0], kvStrides[1], kvStrides[3], kvStrides[2]};
  Dims statDims = {B, H, T, 1}, statStrides = {H * T, T, 1, 1};
  Dims scoreDims = {B, H, T, T};
  if (s.fp8.enabled && KV != H)
    return stringError(fmt::format("tgc's FP8 attention has no grouped-query form ({})", s.key()));
  const int qkvType = s.fp8.enabled ? cudnn::Fp8E4M3 : cudnn::Bf16;
  const int outType = s.fp8.enabled ? cudnnDataType(s.fp8.out) : cudnn::Bf16;
  void *q = g.tensor(UidQ, qkvType, headDims, qkvStrides, false);
  void *kT = g.tensor(UidK, qkvType, transposedDims, transposedStrides, false);
  void *out = g.tensor(UidO, outType, rowDims, rowStrides, false);
  void *stats = g.tensor(UidStats, cudnn::Float, statDims, statStrides, false);
  void *scale = g.scalar(UidScale), *negativeInfinity = g.scalar(UidNegativeInfinity);
  void *scores = g.intermediate(scoreDims), *scaled = g.intermediate(scoreDims);
  g.matmul(q, kT, scores);
  g.pointwise(cudnn::Mul, scores, scale, scaled);
  AttentionLayout l{T, H, DH, headDims, headStrides, rowDims, rowStrides, packedStrides, qkvStrides,
                    transposedDims, transposedStrides, kvDims, kvStrides, statDims, statStrides, scoreDims,
                    q, kT, out, stats, scale, negativeInfinity, scaled};
  if (s.fp8.enabled && !s.backward) {
    fp8ForwardGraph(g, l, s);
    a->uids_ = fp8ForwardUids();
  } else if (s.fp8.enabled) {
    fp8BackwardGraph(g, l, s);
    a->uids_ = fp8BackwardUids();
  } else if (!s.backward) {
    forwardGraph(g, l);
    a->uids_ = {UidQ, UidK, UidV, UidO, UidStats};
  } else {
    backwardGraph(g, l, s.doutRows);
    a->uids_ = {UidQ, UidK, UidV, UidO, UidDO, UidStats, UidDQ, UidDK, UidDV, UidSoftmaxSum};
  }
  a->uids_.push_back(UidScale);
  a->uids_.push_back(UidNegativeInfinity);
  if (s.backward && !s.fp8.enabled)
    a->uids_.push_back(UidOne);

  // The operation graph and cuDNN's heuristic's choices (mode A).
  void *graph = g.create(cudnn::OperationGraphDescriptor, "the operation graph");
  g.set(graph, cudnn::OperationGraphHandle, cudnn::TypeHandle, 1, &handle, "the graph's handle");
  g.set(graph, cudnn::OperationGraphOps, cudnn::TypeBackendDescriptor, int64_t(g.operations().size()),
        g.operations().data(), "the graph's operations");
  g.finalize(graph, "the operation graph");
  void *heuristics = g.create(cudnn::EngineHeuristicsDescriptor, "the engine heuristics");
  g.setDescriptor(heuristics, cudnn::EngineHeurOperationGraph, graph, "the heuristics' graph");
  g.setInt(heuristics, cudnn::EngineHeurMode, cudnn::TypeHeurMode, cudnn::HeurModeA, "the heuristics' mode");
  g.finalize(heuristics, "the engine heuristics");
  int64_t count = 0;
  if (!g.failed())
    g.check(api.getAttribute(heuristics, cudnn::EngineHeurResults, cudnn::TypeBackendDescriptor, 0, &count, nullptr),
            "the number of engine configurations");
  std::vector<void *> configs;
  for (int64_t i = 0; i < count && !g.failed(); ++i)
    configs.push_back(g.create(cudnn::EngineConfigDescriptor, "an engine configuration"));
  if (!g.failed() && count > 0)
    g.check(api.getAttribute(heuristics, cudnn::EngineHeurResults, cudnn::TypeBackendDescriptor, count, &count,
                             configs.data()),
            "the engine configurations");
  if (g.failed())
    return stringError(fmt::format("cuDNN {} does not build the attention ({}): {}", api.versionText(), s.key(),
                                   g.failure()));
  // A plan for each configuration that finalizes (finalizing compiles cuDNN's kernels for the
  // runtime-compiled engines: at most kMaxCandidates of them; `only`, when given, alone).
  a->engineConfigs_ = int(count);
  std::string refusals;
  for (int64_t i = 0; i < count && a->candidates_.size() < size_t(kMaxCandidates); ++i) {
    if (only >= 0 && i != only)
      continue;
    void *plan = nullptr;
    if (api.createDescriptor(cudnn::ExecutionPlanDescriptor, &plan) != 0)
      break;
    a->descriptors_.push_back(plan);
    void *config = configs[size_t(i)];
    int status = api.setAttribute(plan, cudnn::ExecutionPlanHandle, cudnn::TypeHandle, 1, &handle);
    if (status == 0)
      status = api.setAttribute(plan, cudnn::ExecutionPlanEngineConfig, cudnn::TypeBackendDescriptor, 1, &config);
    if (status == 0)
      status = api.finalize(plan);
    int64_t n = 0, workspace = 0;
    if (status == 0)
      status = api.getAttribute(plan, cudnn::ExecutionPlanWorkspaceSize, cudnn::TypeInt64, 1, &n, &workspace);
    if (status == 0) {
      a->candidates_.push_back({plan, workspace, int(i)});
      continue;
    }
    refusals += fmt::format("\n  configuration {}: {}", i, api.describe(status));
  }
  if (a->candidates_.empty() && only >= 0) // the configuration asked for is gone: any other
    return create(api, handle, s);
  if (a->candidates_.empty())
    return stringError(fmt::format("cuDNN {} has no plan for the attention ({}): {} engine configurations{}",
                                   api.versionText(), s.key(), count, refusals));
  return std::move(a);
}

CudnnAttention::~CudnnAttention() {
  // In reverse: the plan before the configurations, the graph before its operations and tensors.
  for (auto it = descriptors_.rbegin(); it != descriptors_.rend(); ++it)
    api_.destroyDescriptor(*it);
}

CudnnAttention::Buffers::~Buffers() {
  if (pack_)
    api_.destroyDescriptor(pack_);
}

llvm::Expected<std::unique_ptr<CudnnAttention::Buffers>> CudnnAttention::buffers(llvm::ArrayRef<void *> pointers,
                                                                                 void *workspace) const {
  size_t operands = operandCount(shape_);
  if (pointers.size() != operands)
    return stringError(fmt::format("error: cuDNN's attention takes {} buffers, got {}", operands, pointers.size()));
  std::unique_ptr<Buffers> b(new Buffers(api_));
  b->pointers_.assign(pointers.begin(), pointers.end());
  b->workspace_ = workspace;
  std::vector<void *> data(pointers.begin(), pointers.end());
  data.push_back(const_cast<float *>(&scalars_.scale));
  data.push_back(const_cast<float *>(&scalars_.negativeInfinity));
  if (shape_.backward && !shape_.fp8.enabled)
    data.push_back(const_cast<float *>(&scalars_.one));
  std::vector<void *> owned;
  GraphBuilder g(api_, owned);
  void *pack = g.create(cudnn::VariantPackDescriptor, "the variant pack");
  g.set(pack, cudnn::VariantPackUniqueIds, cudnn::TypeInt64, int64_t(uids_.size()), uids_.data(),
        "the variant pack's uids");
  g.set(pack, cudnn::VariantPackDataPointers, cudnn::TypeVoidPtr, int64_t(data.size()), data.data(),
        "the variant pack's pointers");
  g.set(pack, cudnn::VariantPackWorkspace, cudnn::TypeVoidPtr, 1, &workspace, "the variant pack's workspace");
  g.finalize(pack, "the variant pack");
  b->pack_ = pack; // owned by the Buffers from here on
  if (g.failed())
    return stringError(fmt::format("error: cuDNN's attention ({}): {}", shape_.key(), g.failure()));
  return std::move(b);
}

bool CudnnAttention::chooseConfig(int config) {
  for (size_t c = 0; c < candidates_.size(); ++c)
    if (candidates_[c].config == config) {
      chosen_ = c;
      return true;
    }
  return false;
}

int64_t CudnnAttention::largestWorkspaceBytes() const {
  int64_t largest = 0;
  for (const Candidate &c : candidates_)
    largest = std::max(largest, c.workspaceBytes);
  return largest;
}

llvm::Error CudnnAttention::run(void *handle, const Buffers &buffers, int candidate) const {
  void *plan = candidates_[candidate >= 0 ? size_t(candidate) : chosen_].plan;
  if (int status = api_.execute(handle, plan, buffers.pack_); status != 0)
    return stringError(fmt::format("error: cuDNN's attention ({}) failed: {}", shape_.key(), api_.describe(status)));
  return llvm::Error::success();
}

} // namespace tgc
