#include "backends/cuda/CudaExecutor.h"

#include "backends/cuda/Cudnn.h"
#include "backends/cuda/GemmTuning.h"
#include "backends/cuda/Lowering.h"
#include "backends/cuda/MemoryPlan.h"
#include "backends/cuda/Nccl.h"
#include "backends/cuda/Nvrtc.h"
#include "backends/cuda/Target.h"
#include "ir/Attributes.h"
#include "support/Numerics.h"
#include "support/Trace.h"
#include "transforms/Pass.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/DenseSet.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>
#include <map>
#include <set>

#ifdef TGC_HAVE_CUDA
#include "backends/cuda/CublasLt.h"
#include <cuda_runtime.h>
#endif

namespace tgc {

#ifndef TGC_HAVE_CUDA

llvm::Expected<std::unique_ptr<Executor>> createCudaExecutor(const Graph &, CudaOptions) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 "error: tgc was built without CUDA (-DTGC_CUDA=OFF)");
}

#else

namespace {

llvm::Error cudaFailure(const char *call, const char *file, int line, const std::string &what) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), "error: %s failed at %s:%d: %s",
                                 call, file, line, what.c_str());
}

#define CUDA_CHECK(call)                                                                           \
  do {                                                                                             \
    cudaError_t status_ = (call);                                                                  \
    if (status_ != cudaSuccess)                                                                    \
      return cudaFailure(#call, __FILE__, __LINE__, cudaGetErrorString(status_));                  \
  } while (0)

#define CUBLAS_CHECK(call)                                                                         \
  do {                                                                                             \
    cublasStatus_t status_ = (call);                                                               \
    if (status_ != CUBLAS_STATUS_SUCCESS)                                                          \
      return cudaFailure(#call, __FILE__, __LINE__, "cuBLAS status " + std::to_string(int(status_))); \
  } while (0)

/// One cuBLASLt matmul, planned once: layouts, batching and the algorithm. A BF16 GEMM reads
/// BF16 copies of its operands, which the op's conversion kernels write first. An FP8 GEMM
/// reads the bytes its quantize ops wrote, scaled back by the scale_inv each quantized with.
struct GemmPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates; // the heuristic's, best first (GemmTuner picks)
  std::string key;                              // what the choice depends on (GemmTuner)
  bool bf16 = false;
  void *bf16Operands[2] = {nullptr, nullptr};
  bool fromWeightCopy[2] = {false, false}; // the operand is a parameter: its BF16 copy is ready
  bool written[2] = {false, false};        // its producer wrote it in BF16 (stored, or a copy)
};

/// The quantize op whose bytes an FP8 value is (through reshapes and transposes), if any.
const Op *quantizeOf(const Value *v) {
  const Op *def = v->def();
  while (def && (def->kind() == OpKind::Reshape || def->kind() == OpKind::Transpose))
    def = def->operand(0)->def();
  return def && def->kind() == OpKind::Quantize ? def : nullptr;
}

cudaDataType_t cudaTypeOf(DType dtype) {
  switch (dtype) {
  case DType::F8E4M3:
    return CUDA_R_8F_E4M3;
  case DType::F8E5M2:
    return CUDA_R_8F_E5M2;
  default:
    return CUDA_R_32F;
  }
}

class CudaExecutor : public Executor {
public:
  CudaExecutor(const Graph &graph, CudaOptions options) : graph_(graph), options_(options) {}
  ~CudaExecutor() override;

  llvm::Error initialize();
  llvm::Error bind(llvm::StringRef name, Tensor tensor) override;
  llvm::Expected<std::vector<Tensor>> run() override;
  llvm::Error step() override;
  llvm::Error launch() override;
  void setProfiling(bool on) override {
    if (on && !profile_)
      profileMs_.clear();
    profile_ = on || profileFromEnvironment_; // (TGC_GPU_PROFILE's profile goes on)
  }
  std::map<std::string, double> profileByOp() const override { return profileMs_; }
  llvm::Expected<bool> fillNormal(llvm::StringRef name, uint64_t stream, double std) override;
  llvm::Error feed(llvm::StringRef value, llvm::StringRef leaf) override;
  llvm::Expected<unsigned> readLater(llvm::StringRef name) override;
  llvm::Expected<Tensor> collect(unsigned ticket) override;
  llvm::Error copyLeafFrom(llvm::StringRef name, const Executor &from) override;
  llvm::Expected<bool> shareLeaf(llvm::StringRef name, Executor &owner) override;
  /// Leaf `name` here and in `executor`, where that is a CudaExecutor on this device and the two
  /// have one type and one storage (fp32, or BF16 on both sides); else nulls.
  std::pair<const Value *, const Value *> sameLeaf(llvm::StringRef name, const Executor &executor) const;
  llvm::Expected<Tensor> read(llvm::StringRef name) const override;
  std::string describe() const override { return description_; }
  int64_t deviceBytes() const override { return allocatedBytes_; }

private:
  // The steps of initialize().
  struct Regions {
    char *arena = nullptr, *params = nullptr, *grads = nullptr, *state = nullptr;
  };
  llvm::Error compileKernels(const std::string &arch, int major, int multiprocessors);
  /// The attention ops cuDNN runs, each with its plan (one per distinct shape), into `lowering`:
  /// where cuDNN is absent or refuses a shape, tgc's kernels run it, and the description says.
  void planCudnnAttention(int major, LoweringOptions &lowering);
  /// Times `plan`'s candidates on buffers of its own and chooses the fastest (`tuner`, `key`).
  llvm::Error chooseCudnnPlan(CudnnAttention &plan, GemmTuner &tuner, const std::string &key);
  /// Enqueues op `i`'s cuDNN attention with the buffers among the launches' `pointers`.
  llvm::Error runCudnnAttention(size_t i, const std::vector<void *> &pointers);
  llvm::Error allocateRegions(const MemoryPlan &plan, Regions &regions);
  llvm::Error placeOp(size_t i, const MemoryPlan &plan, const Regions &regions);
  /// BF16 GEMM operands that are parameters (or reshapes of them) read the BF16 copy of the
  /// parameter region; operands stored in BF16 or with a BF16 copy are read as they are.
  llvm::Error useBf16OperandCopies();
  /// Each GEMM's algorithm among its candidates (GemmTuning.h).
  llvm::Error tuneGemms();
  /// The operands and output a GEMM reads and writes (its BF16 operand copies under bf16).
  void gemmPointers(const Op &op, const GemmPlan &plan, void *&first, void *&second, void *&c);
  llvm::Error planGemm(const Op &op, GemmPlan &plan);
  llvm::Error runGemm(const Op &op, const GemmPlan &plan);
  llvm::Error launchStep();
  llvm::Error launchOp(size_t i);
  /// The program's all_reduce ops: a stream and events for them, and where each is joined.
  llvm::Error prepareCollectives();
  /// Enqueues all_reduce op `i`: NCCL on the communication stream after what the main stream
  /// has queued (on the main stream itself while profiling, so that it is timed).
  llvm::Error runCollective(size_t i);
  llvm::Error profileOpGraphs();
  std::string profileLabel(size_t i) const;
  llvm::Error convertKernel(const void *source, void *target, int64_t count);
  void *buffer(const Value *v) const { return buffers_.lookup(v); }
  /// A parameter's place in the BF16 copy of the parameter region (the same index).
  void *weightCopy(const Value *param) const { return weightsBf16_ + ((char *)buffer(param) - params_) / 2; }
  static size_t bytesOf(const TensorType &t) { return size_t(deviceBytesOf(t)); }
  size_t storedBytes(const Value *v) const { return size_t(storedBytesOf(program_, v)); }

  const Graph &graph_;
  CudaOptions options_;
  std::string description_, deviceName_;
  std::vector<Op *> ops_;
  CudaProgram program_;
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t toBf16_ = nullptr;      // the prelude's f32 -> BF16 conversion
  cudaKernel_t fillNormal_ = nullptr;  // the prelude's normal draws (fillNormal)
  cudaGraphExec_t graph_exec_ = nullptr;
  // TGC_GPU_PROFILE=1: eager steps with an event pair per op; the time per op kind is printed
  // to stderr when the executor ends. TGC_GPU_PROFILE=launches: an event pair per kernel launch,
  // the time per op kind and launch ("attention_backward #3").
  // TGC_GPU_PROFILE=graph: the steps run as graphs, and after each, every op is replayed alone
  // from a graph of its own and timed (profileOpGraphs).
  bool profile_ = false, profileLaunches_ = false, profileGraphs_ = false, printProfile_ = false;
  bool profileFromEnvironment_ = false; // profile_ as TGC_GPU_PROFILE set it
  /// readLater's copies: pinned host memory each, reused once collected, and the event after it.
  struct LaterRead {
    const Value *value = nullptr;
    void *host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  std::vector<LaterRead> later_;
  /// bind's pinned staging for small inputs, used in turn; each slot's event marks its copy done.
  struct Staging {
    void *host = nullptr;
    cudaEvent_t copied = nullptr;
  };
  static constexpr size_t kStagingBytes = 64 << 10;
  std::array<Staging, 8> staging_;
  size_t nextStaging_ = 0;
  /// Kernels launched with programmatic stream serialization (compute capability 9.0 on): each
  /// may start while the generated kernel before it ends; it waits for it in awaitPreviousKernel
  /// (common.cuh) before touching memory. Only in programs without cuBLASLt GEMMs (a decode
  /// step of up to 8 sequences: its products are GEMVs): there it made the step 7% faster, in a
  /// batch-32 decode step 6% slower, and in training no faster (BENCHMARKS.md, session 11).
  /// TGC_PDL=0 turns it off.
  bool programmaticLaunch_ = false;
  /// Whether the last launch in the stream was one of the generated kernels: only those are
  /// followed programmatically.
  bool afterGeneratedKernel_ = false;
  std::vector<cudaGraphExec_t> opGraphs_;
  llvm::StringMap<int64_t> profileCalls_; // graph: each label's ops in a step
  // TGC_TRACE=FILE: eager steps too (support/Trace.h), each op of the first runs an event.
  int traceProcess_ = -1;
  std::map<std::string, double> profileMs_;
  int64_t profiledSteps_ = 0;
  std::vector<std::vector<cudaKernel_t>> kernels_; // per op, per launch
  std::vector<std::vector<void *>> scratch_;       // per op
  std::vector<std::vector<void *>> persistent_;    // per op
  llvm::DenseMap<const Op *, float *> usedScaleInv_; // per quantize op: the scale_inv it used
  std::vector<GemmPlan> gemms_;                    // per op (unused for non-GEMMs)
  llvm::DenseMap<const Value *, void *> buffers_;
  llvm::DenseMap<const Value *, void *> shadows_; // BF16 copies of bf16Shadowed values
  llvm::DenseSet<const Value *> inPlace_; // results written into their assigned leaf's buffer
  // Parameters in one buffer (ParameterLayout), and when BF16 GEMMs read them, a BF16 copy of
  // that buffer written once at the start of each step instead of a conversion per GEMM.
  char *params_ = nullptr;
  int64_t paramBytes_ = 0;
  char *weightsBf16_ = nullptr;
  // Whether the program assigns parameters (training): then the BF16 copy is written inside
  // each step; otherwise (generation) once after the parameters are bound, outside the steps.
  // paramsBound_: the parameters changed since their BF16 copy was made (at first: never made).
  bool assignsParams_ = false, paramsBound_ = true;
  std::vector<void *> owned_;
  int64_t allocatedBytes_ = 0;
  cudaStream_t stream_ = nullptr;
  // all_reduce (OpLowering::Collective): NCCL runs it on commStream_, from an event recorded on
  // stream_ at its place in the program; stream_ waits for its `done` event before the first op
  // that reads its results (joinsBefore_), and for all of them at the end of the step.
  const NcclApi *nccl_ = nullptr;
  void *ncclComm_ = nullptr;
  cudaStream_t commStream_ = nullptr;
  struct CollectiveEvents {
    cudaEvent_t ready = nullptr, done = nullptr;
  };
  std::vector<CollectiveEvents> collectives_;      // per op (events only for all_reduce ops)
  std::vector<std::vector<size_t>> joinsBefore_;   // per op: the all_reduce ops it waits for
  const CublasLtApi *blas_ = nullptr; // cuBLASLt, opened when the first executor starts
  cublasLtHandle_t lt_ = nullptr;
  void *workspace_ = nullptr;
  // cuDNN's fused attention (OpLowering::cudnnAttention): the library, a handle on stream_, a
  // plan per distinct shape, and each op's.
  const CudnnApi *cudnn_ = nullptr;
  void *cudnnHandle_ = nullptr;
  std::map<std::string, std::unique_ptr<CudnnAttention>> cudnnPlans_;
  std::vector<const CudnnAttention *> cudnnOps_; // per op
  std::vector<std::unique_ptr<CudnnAttention::Buffers>> cudnnBuffers_; // per op, made at its first call
  static constexpr size_t kWorkspaceBytes = 32 << 20; // 32 MiB, as fp8.md suggests for Hopper
};

CudaExecutor::~CudaExecutor() {
  if (traceProcess_ >= 0)
    TraceLog::instance().write();
  if (printProfile_ && profiledSteps_) {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (auto &[name, ms] : profileMs_) {
      rows.emplace_back(ms / profiledSteps_, name);
      total += ms / profiledSteps_;
    }
    std::sort(rows.rbegin(), rows.rend());
    llvm::errs() << fmt::format("GPU time per step by op ({} steps, {:.2f} ms in ops{}):\n", profiledSteps_, total,
                                profileGraphs_ ? ", each op replayed alone from a CUDA graph" : "");
    for (auto &[ms, name] : rows) {
      llvm::errs() << fmt::format("  {:<26}{:>9.3f} ms {:>6.1f}%", name, ms, 100 * ms / total);
      if (int64_t calls = profileCalls_.lookup(name))
        llvm::errs() << fmt::format("  {:>4} a step, {:8.2f} us each", calls, 1000 * ms / calls);
      llvm::errs() << "\n";
    }
  }
  if (graph_exec_)
    cudaGraphExecDestroy(graph_exec_);
  cudnnBuffers_.clear();
  cudnnPlans_.clear(); // before their handle
  if (cudnnHandle_)
    cudnn_->destroy(cudnnHandle_);
  for (cudaGraphExec_t exec : opGraphs_)
    if (exec)
      cudaGraphExecDestroy(exec);
  for (GemmPlan &p : gemms_) {
    if (p.desc)
      blas_->matmulDescDestroy(p.desc);
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
      if (l)
        blas_->matrixLayoutDestroy(l);
  }
  for (Staging &slot : staging_) {
    if (slot.host)
      cudaFreeHost(slot.host);
    if (slot.copied)
      cudaEventDestroy(slot.copied);
  }
  for (LaterRead &r : later_) {
    if (r.host)
      cudaFreeHost(r.host);
    if (r.done)
      cudaEventDestroy(r.done);
  }
  for (void *p : owned_)
    cudaFree(p);
  if (workspace_)
    cudaFree(workspace_);
  if (lt_)
    blas_->destroy(lt_);
  if (library_)
    cudaLibraryUnload(library_);
  for (CollectiveEvents &c : collectives_)
    for (cudaEvent_t e : {c.ready, c.done})
      if (e)
        cudaEventDestroy(e);
  if (commStream_)
    cudaStreamDestroy(commStream_);
  if (stream_)
    cudaStreamDestroy(stream_);
}

llvm::Error CudaExecutor::initialize() {
  if (const char *env = std::getenv("TGC_GPU_PROFILE")) {
    profileLaunches_ = std::string(env) == "launches";
    profileGraphs_ = std::string(env) == "graph";
    profile_ = std::string(env) == "1" || profileLaunches_;
    printProfile_ = profile_ || profileGraphs_;
    profileFromEnvironment_ = profile_;
  }
  CUDA_CHECK(cudaSetDevice(options_.device));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, options_.device));
  std::string arch = archName(prop.major, prop.minor);
  const char *pdl = std::getenv("TGC_PDL");
  programmaticLaunch_ = prop.major >= 9 && !(pdl && std::string(pdl) == "0");
  description_ = fmt::format("cuda:{} {} ({})", options_.device, prop.name, arch);
  if (TraceLog::instance().enabled() && !profileLaunches_) {
    traceProcess_ = TraceLog::instance().beginProcess(fmt::format("@{} on {}", graph_.name(), description_));
    profile_ = true; // eager, an event pair around each op
  }
  deviceName_ = fmt::format("{} ({})", prop.name, arch);
  if (auto err = compileKernels(arch, prop.major, prop.multiProcessorCount))
    return err;
  programmaticLaunch_ &= program_.programmatic;
  CUDA_CHECK(cudaStreamCreate(&stream_));
  if (cudnnHandle_)
    if (int status = cudnn_->setStream(cudnnHandle_, stream_); status != 0)
      return cudaFailure("cudnnSetStream", __FILE__, __LINE__, cudnn_->errorString(status));
  CUDA_CHECK(cudaLibraryGetKernel(&toBf16_, library_, "tgc_float_to_bf16"));
  CUDA_CHECK(cudaLibraryGetKernel(&fillNormal_, library_, "tgc_fill_normal"));
  auto blas = loadCublasLt();
  if (!blas)
    return blas.takeError();
  blas_ = *blas;
  if (blas_->create(&lt_) != CUBLAS_STATUS_SUCCESS)
    return cudaFailure("cublasLtCreate", __FILE__, __LINE__, "no cuBLASLt handle");
  CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  allocatedBytes_ += kWorkspaceBytes;
  ops_ = graph_.ops();
  for (const Op *op : ops_)
    if (op->kind() == OpKind::Assign && op->operand(0)->def()->kind() == OpKind::Param)
      assignsParams_ = true;
  if (profileGraphs_ && assignsParams_) {
    llvm::errs() << "tgc: TGC_GPU_PROFILE=graph replays each op after the step, which would update this "
                    "program's parameters again: it is profiled as TGC_GPU_PROFILE=1 profiles\n";
    profileGraphs_ = false;
    profile_ = true;
  }
  kernels_.resize(ops_.size());
  scratch_.resize(ops_.size());
  persistent_.resize(ops_.size());
  gemms_.resize(ops_.size());
  MemoryPlan plan = planMemory(graph_, program_);
  Regions regions;
  if (auto err = allocateRegions(plan, regions))
    return err;
  for (size_t i = 0; i < ops_.size(); ++i)
    if (auto err = placeOp(i, plan, regions))
      return err;
  if (auto err = useBf16OperandCopies())
    return err;
  if (auto err = prepareCollectives())
    return err;
  return tuneGemms();
}

llvm::Error CudaExecutor::prepareCollectives() {
  collectives_.resize(ops_.size());
  joinsBefore_.resize(ops_.size());
  bool any = false;
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops_.size(); ++i)
    index[ops_[i]] = i;
  for (size_t i = 0; i < ops_.size(); ++i) {
    if (program_.lowering[i].kind != OpLowering::Collective)
      continue;
    any = true;
    size_t first = ops_.size(); // its results' first reader
    for (unsigned r = 0; r < ops_[i]->numResults(); ++r)
      for (const Op *user : ops_[i]->result(r)->users())
        first = std::min(first, index.lookup(user));
    if (first < ops_.size())
      joinsBefore_[first].push_back(i);
    CUDA_CHECK(cudaEventCreateWithFlags(&collectives_[i].ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&collectives_[i].done, cudaEventDisableTiming));
  }
  if (!any || !options_.communicator || options_.communicator->ranks() <= 1)
    return llvm::Error::success(); // one rank: each result is its operand
  ncclComm_ = options_.communicator->ncclComm();
  if (!ncclComm_)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "error: the GPU reduces over ranks through NCCL, and this run's ranks have no "
                                   "NCCL communicator");
  auto api = loadNccl();
  if (!api)
    return api.takeError();
  nccl_ = *api;
  CUDA_CHECK(cudaStreamCreateWithFlags(&commStream_, cudaStreamNonBlocking));
  return llvm::Error::success();
}

llvm::Error CudaExecutor::runCollective(size_t i) {
  const Op &op = *ops_[i];
  if (!nccl_) { // one rank
    for (unsigned k = 0; k < op.numOperands(); ++k)
      if (buffer(op.result(k)) != buffer(op.operand(k)))
        CUDA_CHECK(cudaMemcpyAsync(buffer(op.result(k)), buffer(op.operand(k)), bytesOf(op.operand(k)->type()),
                                   cudaMemcpyDeviceToDevice, stream_));
    afterGeneratedKernel_ = false;
    return llvm::Error::success();
  }
  ReduceOp reduce = *parseReduceOp(*op.attrs().getString("reduce"));
  int ncclOp = reduce == ReduceOp::Avg ? kNcclAvg : reduce == ReduceOp::Max ? kNcclMax : kNcclSum;
  // Gradients reduced in place that lie next to each other in the gradient buffer (only zero
  // padding between them, under the 512-byte alignment) go as one call; the others one each.
  struct Range {
    char *send, *receive;
    size_t bytes;
  };
  std::vector<Range> ranges;
  for (unsigned k = 0; k < op.numOperands(); ++k)
    ranges.push_back({(char *)buffer(op.operand(k)), (char *)buffer(op.result(k)), bytesOf(op.operand(k)->type())});
  std::sort(ranges.begin(), ranges.end(), [](const Range &a, const Range &b) { return a.send < b.send; });
  std::vector<Range> calls;
  for (const Range &r : ranges) {
    Range *last = calls.empty() ? nullptr : &calls.back();
    bool inPlace = r.send == r.receive;
    if (last && inPlace && last->send == last->receive && r.send >= last->send + last->bytes &&
        r.send - (last->send + last->bytes) < 512)
      last->bytes = size_t(r.send + r.bytes - last->send);
    else
      calls.push_back(r);
  }
  cudaStream_t stream = profile_ ? stream_ : commStream_;
  if (stream != stream_) {
    CUDA_CHECK(cudaEventRecord(collectives_[i].ready, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(stream, collectives_[i].ready, 0));
  }
  auto check = [&](int result, const char *call) -> llvm::Error {
    if (result == 0)
      return llvm::Error::success();
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "error: %s failed for %%%s: %s (NCCL %d)", call,
                                   op.result()->name().c_str(), nccl_->errorString(result), result);
  };
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart"))
    return err;
  for (const Range &c : calls)
    if (auto err = check(nccl_->allReduce(c.send, c.receive, c.bytes / 4, kNcclFloat32, ncclOp, ncclComm_, stream),
                         "ncclAllReduce")) {
      nccl_->groupEnd();
      return err;
    }
  if (auto err = check(nccl_->groupEnd(), "ncclGroupEnd"))
    return err;
  if (stream != stream_)
    CUDA_CHECK(cudaEventRecord(collectives_[i].done, stream));
  afterGeneratedKernel_ = false;
  return llvm::Error::success();
}

void CudaExecutor::planCudnnAttention(int major, LoweringOptions &lowering) {
  std::vector<Op *> ops = graph_.ops();
  cudnnOps_.assign(ops.size(), nullptr);
  cudnnBuffers_.resize(ops.size());
  std::vector<std::pair<size_t, CudnnAttentionShape>> candidates; // op index, shape
  for (size_t i = 0; i < ops.size(); ++i)
    if (auto shape = cudnnAttentionShape(graph_, *ops[i], lowering))
      candidates.emplace_back(i, *shape);
  const char *env = std::getenv("TGC_CUDNN");
  if (candidates.empty() || !options_.cudnnAttention || (env && std::string(env) == "0"))
    return;
  // cuDNN's flash attention needs compute capability 8.0 (Ampere) on.
  if (major < 8) {
    description_ += ", attention by tgc's kernels (cuDNN's needs compute capability 8.0)";
    return;
  }
  auto api = loadCudnn();
  if (!api) {
    llvm::consumeError(api.takeError());
    description_ += ", attention by tgc's kernels (cuDNN 9 not found; TGC_CUDNN_LIBRARY names it)";
    return;
  }
  cudnn_ = *api;
  if (int status = cudnn_->create(&cudnnHandle_); status != 0) {
    description_ += fmt::format(", attention by tgc's kernels (cudnnCreate: {})", cudnn_->errorString(status));
    cudnnHandle_ = nullptr;
    return;
  }
  std::string refused; // the first shape cuDNN did not take, and why
  size_t taken = 0;
  // cuDNN's engine configurations are chosen as the GEMMs' algorithms are (GemmTuning.h): timed
  // once, the choice kept in the kernel cache folder, so that later runs build that plan alone
  // and the same seed keeps its bits.
  GemmTuner tuner(kernelCacheDir() + "/gemm-algorithms.txt");
  for (auto &[index, shape] : candidates) {
    auto it = cudnnPlans_.find(shape.key());
    if (it == cudnnPlans_.end()) {
      std::string key = fmt::format("cudnn {} {} {}", cudnn_->versionText(), deviceName_, shape.key());
      std::optional<int> kept = tuner.enabled() ? tuner.kept(key) : std::optional<int>(0);
      auto plan = CudnnAttention::create(*cudnn_, cudnnHandle_, shape, kept ? *kept : -1);
      if (plan && (*plan)->candidates() > 1)
        if (auto err = chooseCudnnPlan(**plan, tuner, key)) {
          llvm::consumeError(std::move(err)); // untimed: the heuristic's first
          (*plan)->choose(0);
        }
      if (!plan) {
        std::string why = llvm::toString(plan.takeError());
        if (refused.empty())
          refused = why;
        it = cudnnPlans_.emplace(shape.key(), nullptr).first;
      } else {
        if (printProfile_)
          llvm::errs() << fmt::format("tgc: cuDNN's attention ({}): engine configuration {} of {}, {} bytes of workspace\n",
                                      shape.key(), (*plan)->engineConfig(), (*plan)->engineConfigs(),
                                      (*plan)->workspaceBytes());
        it = cudnnPlans_.emplace(shape.key(), std::move(*plan)).first;
      }
    }
    if (!it->second)
      continue;
    lowering.cudnnAttention[ops[index]] = it->second->workspaceBytes(); // the lowering runs each so
    cudnnOps_[index] = it->second.get();
    ++taken;
  }
  tuner.save();
  // An attention that reads q, k and v in place and its gradients run on cuDNN together or not
  // at all (tgc's kernels read the head-major copy such a forward does not write).
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i]->kind() != OpKind::Attention || !cudnnReadsQkvRows(graph_, *ops[i], lowering))
      continue;
    std::vector<const Op *> group = {ops[i]};
    for (const Op *user : ops[i]->result(2)->users())
      group.push_back(user);
    if (llvm::all_of(group, [&](const Op *op) { return lowering.cudnnAttention.count(op); }))
      continue;
    for (const Op *op : group)
      if (lowering.cudnnAttention.erase(op)) {
        cudnnOps_[size_t(llvm::find(ops, op) - ops.begin())] = nullptr;
        --taken;
      }
  }
  if (taken)
    description_ += fmt::format(", attention by cuDNN {} ({} of {} ops)", cudnn_->versionText(), taken,
                                candidates.size());
  if (!refused.empty()) {
    description_ += taken ? "" : ", attention by tgc's kernels";
    llvm::errs() << "tgc: " << refused << "; tgc's attention kernels run those ops\n";
  }
}

llvm::Error CudaExecutor::chooseCudnnPlan(CudnnAttention &plan, GemmTuner &tuner, const std::string &key) {
  // Buffers of the shape's sizes (zeros), on the handle's stream (the default one until the
  // executor's exists), for the candidates' trial runs; freed after.
  const CudnnAttentionShape &s = plan.shape();
  int64_t rows = s.B * s.T * s.H * s.DH * 2, stats = s.B * s.H * s.T * 4; // bytes of one of q, k, v; of the stats
  std::vector<int64_t> sizes = s.backward ? std::vector<int64_t>{3 * rows, rows, rows, stats, 3 * rows, stats}
                                          : std::vector<int64_t>{3 * rows, rows, stats};
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
  int64_t D = s.H * s.DH, part = s.qkvRows ? 2 * D : rows; // bytes from q to k, k to v
  std::vector<void *> pointers = {at[0], at[0] + part, at[0] + 2 * part, at[1]};
  if (s.backward)
    pointers.insert(pointers.end(), {at[2], at[3], at[4], at[4] + 2 * D, at[4] + 4 * D, at[5]});
  else
    pointers.push_back(at[2]);
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
      if (auto err = plan.run(cudnnHandle_, **buffers, candidate))
        return std::move(err);
    CUDA_CHECK(cudaEventRecord(start, 0));
    for (int run = 0; run < 5; ++run)
      if (auto err = plan.run(cudnnHandle_, **buffers, candidate))
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

llvm::Error CudaExecutor::runCudnnAttention(size_t i, const std::vector<void *> &pointers) {
  const OpLowering &lowering = program_.lowering[i];
  std::vector<void *> buffers;
  for (const OpLowering::LibraryBuffer &b : lowering.libraryBuffers)
    buffers.push_back(static_cast<char *>(pointers.at(b.pointer)) + b.offset);
  void *workspace = buffers.back();
  buffers.pop_back();
  afterGeneratedKernel_ = false;
  // The variant pack is made at the op's first call: no host work at the next ones.
  std::unique_ptr<CudnnAttention::Buffers> &made = cudnnBuffers_[i];
  if (!made || !made->same(buffers, workspace)) {
    auto fresh = cudnnOps_[i]->buffers(buffers, workspace);
    if (!fresh)
      return fresh.takeError();
    made = std::move(*fresh);
  }
  return cudnnOps_[i]->run(cudnnHandle_, *made);
}

/// The program's kernels: lowered (the attention ops cuDNN takes planned first), then compiled by
/// NVRTC for `arch` (or taken from the kernel cache) and loaded.
llvm::Error CudaExecutor::compileKernels(const std::string &arch, int major, int multiprocessors) {
  LoweringOptions lowering;
  lowering.multiprocessors = multiprocessors;
  lowering.groupOptimizer = options_.groupOptimizer;
  lowering.storeBf16 = options_.storeBf16;
  lowering.bf16Rounding = options_.bf16Rounding;
  planCudnnAttention(major, lowering);
  auto program = lowerToCuda(graph_, lowering);
  if (!program)
    return program.takeError();
  program_ = std::move(*program);
  auto module = compileCuda(program_.source, arch);
  if (!module)
    return module.takeError();
  int64_t launches = 0;
  std::set<std::string> kernels;
  for (const OpLowering &l : program_.lowering)
    for (const KernelLaunch &launch : l.launches) {
      ++launches;
      kernels.insert(launch.name);
    }
  description_ += fmt::format(", {} launches of {} kernels {}", launches, kernels.size(),
                              module->fromCache ? "from the kernel cache (no NVRTC compilation)"
                                                : "compiled by NVRTC");
  CUDA_CHECK(cudaLibraryLoadData(&library_, module->cubin.data(), nullptr, nullptr, 0, nullptr,
                                 nullptr, 0));
  return llvm::Error::success();
}

/// Intermediates live in one arena laid out by the memory plan; parameters, the gradients
/// AdamW reads and state in three regions of the parameter layout (zeroed: their padding stays
/// zero); inputs keep buffers of their own.
llvm::Error CudaExecutor::allocateRegions(const MemoryPlan &plan, Regions &regions) {
  const ParameterLayout &layout = program_.layout;
  for (auto [base, bytes] : {std::pair{&regions.arena, plan.arenaBytes}, std::pair{&regions.params, layout.paramBytes},
                             std::pair{&regions.grads, layout.gradBytes}, std::pair{&regions.state, layout.stateBytes}}) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(base), size_t(std::max<int64_t>(bytes, 256))));
    CUDA_CHECK(cudaMemset(*base, 0, size_t(std::max<int64_t>(bytes, 256))));
    owned_.push_back(*base);
    allocatedBytes_ += bytes;
  }
  params_ = regions.params;
  paramBytes_ = layout.paramBytes;
  return llvm::Error::success();
}

/// Op `i`'s results in their buffers, its kernels, scratch, persistent buffers and constants,
/// and its GEMM plan.
llvm::Error CudaExecutor::placeOp(size_t i, const MemoryPlan &plan, const Regions &regions) {
  const ParameterLayout &layout = program_.layout;
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  for (unsigned r = 0; r < op.numResults(); ++r) {
    const Value *v = op.result(r);
    if (layout.params.count(v)) {
      buffers_[v] = regions.params + layout.params.lookup(v);
    } else if (layout.state.count(v)) {
      buffers_[v] = regions.state + layout.state.lookup(v);
    } else if (lowering.kind == OpLowering::Leaf) { // an input
      void *p = nullptr;
      CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytesOf(v->type()), 4)));
      allocatedBytes_ += int64_t(std::max<size_t>(bytesOf(v->type()), 4));
      CUDA_CHECK(cudaMemset(p, 0, bytesOf(v->type())));
      owned_.push_back(p);
      buffers_[v] = p;
    } else if (const Value *leaf = program_.inPlace.lookup(v)) {
      buffers_[v] = buffer(leaf); // written into the leaf it is assigned to
      inPlace_.insert(v);
    } else if (layout.grads.count(v)) {
      buffers_[v] = regions.grads + layout.grads.lookup(v);
    } else if (plan.offsets.count(v)) {
      buffers_[v] = regions.arena + plan.offsets.lookup(v);
    } else { // an alias of a leaf, of an in-place value or of a gradient
      buffers_[v] = buffer(op.operand(0));
    }
    // The BF16 copy of a value that has one; a reshape shares its source's.
    if (plan.shadowOffsets.count(v))
      shadows_[v] = regions.arena + plan.shadowOffsets.lookup(v);
    else if (program_.bf16Shadowed.count(v))
      shadows_[v] = shadows_.lookup(op.operand(0));
  }
  for (const KernelLaunch &launch : lowering.launches) {
    cudaKernel_t kernel;
    CUDA_CHECK(cudaLibraryGetKernel(&kernel, library_, launch.name.c_str()));
    kernels_[i].push_back(kernel);
  }
  for (size_t k = 0; k < lowering.scratchFloats.size(); ++k)
    scratch_[i].push_back(regions.arena + plan.opLocalOffsets[i][k]);
  for (int64_t floats : lowering.persistentFloats) {
    void *p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, size_t(floats) * 4));
    CUDA_CHECK(cudaMemset(p, 0, size_t(floats) * 4));
    allocatedBytes_ += floats * 4;
    owned_.push_back(p);
    persistent_[i].push_back(p);
  }
  if (!lowering.constants.empty()) { // after the persistent buffers, as the kernels expect
    size_t bytes = lowering.constants.size() * sizeof(double);
    void *p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    CUDA_CHECK(cudaMemcpy(p, lowering.constants.data(), bytes, cudaMemcpyHostToDevice));
    allocatedBytes_ += int64_t(bytes);
    owned_.push_back(p);
    persistent_[i].push_back(p);
  }
  if (op.kind() == OpKind::Quantize)
    usedScaleInv_[&op] = static_cast<float *>(persistent_[i].at(0));
  if (lowering.kind == OpLowering::Gemm) {
    if (auto err = planGemm(op, gemms_[i]))
      return err;
    if (gemms_[i].bf16) // the BF16 operand copies follow the op's scratch in the plan
      for (int k = 0; k < 2; ++k)
        gemms_[i].bf16Operands[k] = regions.arena + plan.opLocalOffsets[i][lowering.scratchFloats.size() + k];
  }
  return llvm::Error::success();
}

// The same bits as converting them at each GEMM, once a step.
llvm::Error CudaExecutor::useBf16OperandCopies() {
  for (size_t i = 0; i < ops_.size(); ++i)
    for (int k = 0; k < 2 && gemms_[i].bf16; ++k) {
      const Value *operand = ops_[i]->operand(k);
      gemms_[i].fromWeightCopy[k] = isWeight(program_, operand);
      if (program_.bf16Stored.count(operand))
        gemms_[i].bf16Operands[k] = buffer(operand);
      else if (program_.bf16Shadowed.count(operand))
        gemms_[i].bf16Operands[k] = shadows_.lookup(operand);
      gemms_[i].written[k] = program_.bf16Stored.count(operand) || program_.bf16Shadowed.count(operand);
    }
  bool gemvs = llvm::any_of(program_.lowering, [](const OpLowering &l) { return !l.bf16Weights.empty(); });
  if (gemvs || !program_.bf16Rounding.empty() || program_.optimizerWritesWeightCopy ||
      llvm::any_of(gemms_, [](const GemmPlan &g) { return g.fromWeightCopy[0] || g.fromWeightCopy[1]; })) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void **>(&weightsBf16_), size_t(paramBytes_ / 2)));
    owned_.push_back(weightsBf16_);
    allocatedBytes_ += paramBytes_ / 2;
    for (size_t i = 0; i < ops_.size(); ++i) {
      for (int k = 0; k < 2; ++k)
        if (gemms_[i].fromWeightCopy[k])
          gemms_[i].bf16Operands[k] = weightCopy(ops_[i]->operand(k));
      // A BF16 epilogue adds the bias's BF16 copy (cuBLASLt: the bias has the output's type).
      if (addsBf16Bias(program_, *ops_[i])) {
        const void *bias = weightCopy(ops_[i]->operand(2));
        CUBLAS_CHECK(blas_->matmulDescSetAttribute(gemms_[i].desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
      }
    }
  }
  return llvm::Error::success();
}

llvm::Error CudaExecutor::convertKernel(const void *source, void *target, int64_t count) {
  void *args[] = {&source, &target, &count};
  unsigned blocks = unsigned(std::min<int64_t>((count + 255) / 256, 8192));
  CUDA_CHECK(cudaLaunchKernel((const void *)toBf16_, dim3(blocks), dim3(256), args, 0, stream_));
  afterGeneratedKernel_ = false;
  return llvm::Error::success();
}

llvm::Error CudaExecutor::planGemm(const Op &op, GemmPlan &plan) {
  // Row-major C[M,N] = opA(A) opB(B) is column-major C^T = opB(B)^T opA(A)^T: cuBLASLt's first
  // operand is B, its second A (see the README's note on layouts).
  const TensorType &a = op.operand(0)->type(), &b = op.operand(1)->type(), &c = op.result()->type();
  bool biasGelu = op.kind() == OpKind::MatMulBiasGelu; // x @ w^T + bias, then GELU
  bool bias = biasGelu || op.kind() == OpKind::MatMulBias;  // x @ w^T + bias
  bool dgelu = op.kind() == OpKind::MatMulDGelu;           // gelu_backward(a b, h)
  // CudaProgram::bf16Rounding: the bias is the parameter's BF16 copy (set once the executor's
  // copy exists); the output (and h) in BF16 where the program stores it so, otherwise fp32.
  bool bf16Bias = addsBf16Bias(program_, op);
  bool bf16Out = program_.bf16Stored.count(op.result(0));
  cudaDataType_t outType = bf16Out ? CUDA_R_16BF : CUDA_R_32F;
  bool ta = op.attrs().getBool("transpose_a").value_or(false);
  bool tb = bias || op.attrs().getBool("transpose_b").value_or(false);
  int64_t m = c.dim(-2), n = c.dim(-1), k = ta ? a.dim(-2) : a.dim(-1);
  int64_t batches = c.numElements() / (m * n);
  bool sharedB = b.rank() == 2 && batches > 1;
  if (sharedB && !ta) { // [..., M, K] rows against one [K, N] (or [N, K]): one GEMM of all rows
    m *= batches;
    batches = 1;
    sharedB = false;
  }
  if ((biasGelu || dgelu) && batches > 1)
    return cudaFailure("planGemm", __FILE__, __LINE__,
                       fmt::format("%{}: a GELU epilogue over {} batches of products", op.result()->name(), batches));
  // BF16: BF16 operands, fp32 accumulation and output (gemm_dtype). FP8: the operands' own
  // types, fp32 accumulation and output, each operand scaled by its quantize's scale_inv.
  plan.bf16 = hasBf16Gemms(op.attrs());
  bool fp8 = isFp8(a.dtype);
  cudaDataType_t firstType = plan.bf16 ? CUDA_R_16BF : cudaTypeOf(b.dtype);
  cudaDataType_t secondType = plan.bf16 ? CUDA_R_16BF : cudaTypeOf(a.dtype);
  CUBLAS_CHECK(blas_->matmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (fp8) {
    const Op *firstQuantize = quantizeOf(op.operand(1)), *secondQuantize = quantizeOf(op.operand(0));
    if (!firstQuantize || !secondQuantize)
      return cudaFailure("planGemm", __FILE__, __LINE__,
                         fmt::format("the FP8 GEMM %{} reads a value no quantize op produced",
                                     op.result()->name()));
    const void *firstScale = usedScaleInv_.lookup(firstQuantize);
    const void *secondScale = usedScaleInv_.lookup(secondQuantize);
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &firstScale, sizeof firstScale));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &secondScale, sizeof secondScale));
  }
  if (bias) {
    // D = x w^T + bias, or GELU of it (the tanh form) with the pre-activation into the second
    // result (the backward reads it): no separate bias-add and GELU kernels.
    cublasLtEpilogue_t epilogue = biasGelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    const void *biasPointer = buffer(op.operand(2));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &biasPointer, sizeof biasPointer));
    if (bf16Bias) { // an fp32 D takes an fp32 bias unless told
      int32_t biasType = CUDA_R_16BF;
      CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &biasType, sizeof biasType));
    }
  }
  if (dgelu) {
    // D = (a b) * gelu'(h), h the pre-activation the forward's epilogue kept (D's layout).
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DGELU;
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  }
  if (biasGelu || dgelu) {
    void *aux = buffer(biasGelu ? op.result(1) : op.operand(2));
    int64_t auxLd = n;
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &auxLd, sizeof auxLd));
  }
  cublasOperation_t opFirst = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opSecond = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &opFirst, sizeof opFirst));
  CUBLAS_CHECK(blas_->matmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &opSecond, sizeof opSecond));
  // The first operand (B) as stored: [K,N] row-major is N x K column-major, [N,K] is K x N.
  uint64_t firstRows = tb ? k : n, firstCols = tb ? n : k;
  uint64_t secondRows = ta ? m : k, secondCols = ta ? k : m;
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.a, firstType, firstRows, firstCols, firstRows));
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.b, secondType, secondRows, secondCols, secondRows));
  CUBLAS_CHECK(blas_->matrixLayoutCreate(&plan.c, outType, n, m, n));
  if (batches > 1) {
    int32_t count = int32_t(batches);
    int64_t strideFirst = sharedB ? 0 : k * n, strideSecond = m * k, strideC = m * n;
    for (auto [layout, stride] : {std::pair{plan.a, strideFirst}, std::pair{plan.b, strideSecond},
                                  std::pair{plan.c, strideC}}) {
      CUBLAS_CHECK(blas_->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      CUBLAS_CHECK(blas_->matrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  // The algorithm is chosen once here and reused every step.
  cublasLtMatmulPreference_t preference;
  CUBLAS_CHECK(blas_->matmulPreferenceCreate(&preference));
  size_t workspace = kWorkspaceBytes;
  CUBLAS_CHECK(blas_->matmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t results[8];
  int found = 0;
  cublasStatus_t status = blas_->matmulAlgoGetHeuristic(lt_, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                                         preference, 8, results, &found);
  blas_->matmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0)
    return cudaFailure("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__,
                       fmt::format("no algorithm for %{} ({}x{}x{}, batch {})", op.result()->name(), m, k, n, batches));
  for (int r = 0; r < found; ++r)
    plan.candidates.push_back(results[r].algo);
  plan.algo = plan.candidates[0];
  // The device's name and architecture (not its index) and the library's version.
  plan.key = fmt::format("{} cublasLt {}: {}x{}x{} batch {}{}, {} {}, {}{}{}{}{}", deviceName_, blas_->getVersion(),
                         m, k, n, batches, sharedB ? " (shared B)" : "", ta ? "T" : "N", tb ? "T" : "N",
                         plan.bf16 ? "bf16" : fp8 ? "fp8" : "f32", bias ? " bias" : "", biasGelu ? " gelu" : "",
                         dgelu ? " dgelu" : "", bf16Out ? " bf16 out" : "");
  return llvm::Error::success();
}

void CudaExecutor::gemmPointers(const Op &op, const GemmPlan &plan, void *&first, void *&second, void *&c) {
  c = buffer(op.result());
  first = plan.bf16 ? plan.bf16Operands[1] : buffer(op.operand(1));
  second = plan.bf16 ? plan.bf16Operands[0] : buffer(op.operand(0));
}

llvm::Error CudaExecutor::tuneGemms() {
  GemmTuner tuner(kernelCacheDir() + "/gemm-algorithms.txt");
  if (!tuner.enabled())
    return llvm::Error::success();
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  float alpha = 1.0f, beta = 0.0f;
  for (size_t i = 0; i < ops_.size(); ++i) {
    GemmPlan &plan = gemms_[i];
    // A result written into the state it updates is never written by a trial.
    if (plan.candidates.size() < 2 || inPlace_.count(ops_[i]->result()))
      continue;
    void *first, *second, *c;
    gemmPointers(*ops_[i], plan, first, second, c);
    auto time = [&](int candidate) -> llvm::Expected<float> {
      const cublasLtMatmulAlgo_t *algo = &plan.candidates[size_t(candidate)];
      auto once = [&] {
        return blas_->matmul(lt_, plan.desc, &alpha, first, plan.a, second, plan.b, &beta, c, plan.c, c, plan.c,
                              algo, workspace_, kWorkspaceBytes, stream_);
      };
      for (int warm = 0; warm < 2; ++warm)
        if (once() != CUBLAS_STATUS_SUCCESS)
          return 1e30f; // a candidate that does not run is never chosen
      CUDA_CHECK(cudaEventRecord(start, stream_));
      for (int run = 0; run < 5; ++run)
        once();
      CUDA_CHECK(cudaEventRecord(stop, stream_));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return ms;
    };
    auto choice = tuner.choose(plan.key, int(plan.candidates.size()), time);
    if (!choice)
      return choice.takeError();
    plan.algo = plan.candidates[size_t(*choice)];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  tuner.save();
  return llvm::Error::success();
}

llvm::Error CudaExecutor::runGemm(const Op &op, const GemmPlan &plan) {
  float alpha = 1.0f, beta = 0.0f;
  if (plan.bf16)
    for (int i = 0; i < 2; ++i)
      if (!plan.fromWeightCopy[i] && !plan.written[i])
        if (auto err = convertKernel(buffer(op.operand(i)), plan.bf16Operands[i],
                                     op.operand(i)->type().numElements()))
          return err;
  void *first, *second, *c;
  gemmPointers(op, plan, first, second, c);
  CUBLAS_CHECK(blas_->matmul(lt_, plan.desc, &alpha, first, plan.a, second, plan.b, &beta, c,
                              plan.c, c, plan.c, &plan.algo, workspace_, kWorkspaceBytes, stream_));
  return llvm::Error::success();
}

llvm::Error CudaExecutor::bind(llvm::StringRef name, Tensor tensor) {
  const Value *v = graph_.lookup(name);
  if (!v || !isLeaf(v->def()->kind()) || v->def()->kind() == OpKind::Constant)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "graph @%s has no input, parameter or state named '%s'",
                                   graph_.name().c_str(), name.str().c_str());
  if (tensor.type != v->type())
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "'%s' is %s, but a %s was given",
                                   name.str().c_str(), v->type().str().c_str(), tensor.type.str().c_str());
  if (isFp8(v->type().dtype))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "'%s' is %s: FP8 tensors come from quantize ops, not from the host",
                                   name.str().c_str(), v->type().str().c_str());
  const void *host = isFloat(tensor.type.dtype) ? (const void *)tensor.data.data()
                                                : (const void *)tensor.ints.data();
  std::vector<uint16_t> bf16;
  if (program_.bf16Stored.count(v)) { // a leaf stored in BF16 (a KV cache): rounded as its writes round
    bf16.resize(tensor.data.size());
    std::transform(tensor.data.begin(), tensor.data.end(), bf16.begin(), floatToBf16);
    host = bf16.data();
  }
  size_t bytes = storedBytes(v);
  if (bytes <= kStagingBytes) {
    // A small input (a decode step's tokens and positions) through pinned staging memory: the
    // copy is queued behind the steps launched, where one from pageable memory may wait for them.
    Staging &slot = staging_[nextStaging_++ % staging_.size()];
    if (!slot.host) {
      CUDA_CHECK(cudaMallocHost(&slot.host, kStagingBytes));
      CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    } else {
      CUDA_CHECK(cudaEventSynchronize(slot.copied)); // its last copy has left it
    }
    std::memcpy(slot.host, host, bytes);
    CUDA_CHECK(cudaMemcpyAsync(buffer(v), slot.host, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(slot.copied, stream_));
  } else {
    // From pageable memory: the call returns once `host` is staged, so the tensor may go.
    CUDA_CHECK(cudaMemcpyAsync(buffer(v), host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  if (v->def()->kind() == OpKind::Param)
    paramsBound_ = true;
  return llvm::Error::success();
}

std::pair<const Value *, const Value *> CudaExecutor::sameLeaf(llvm::StringRef name, const Executor &executor) const {
  const auto *other = dynamic_cast<const CudaExecutor *>(&executor);
  const Value *v = graph_.lookup(name);
  const Value *source = other ? other->graph_.lookup(name) : nullptr;
  if (!other || other->options_.device != options_.device || !v || !source || !isLeaf(v->def()->kind()) ||
      v->type() != source->type() || !other->buffer(source) ||
      program_.bf16Stored.count(v) != other->program_.bf16Stored.count(source))
    return {nullptr, nullptr};
  return {v, source};
}

llvm::Expected<bool> CudaExecutor::shareLeaf(llvm::StringRef name, Executor &owner) {
  auto [v, source] = sameLeaf(name, owner);
  if (!v || v->def()->kind() != OpKind::State || source->def()->kind() != OpKind::State || shadows_.count(v))
    return false;
  // The leaf, the values written in place into it and their aliases all start at its buffer.
  void *old = buffer(v), *shared = static_cast<const CudaExecutor &>(owner).buffer(source);
  for (auto &[value, pointer] : buffers_)
    if (pointer == old)
      pointer = shared;
  if (graph_exec_) { // captured with the old pointer: captured again at the next step
    cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
  }
  for (cudaGraphExec_t &exec : opGraphs_)
    if (exec) {
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  return true;
}

llvm::Error CudaExecutor::copyLeafFrom(llvm::StringRef name, const Executor &from) {
  auto [v, source] = sameLeaf(name, from);
  if (!v)
    return Executor::copyLeafFrom(name, from); // through the host, with bind's checks
  void *data = static_cast<const CudaExecutor &>(from).buffer(source);
  CUDA_CHECK(cudaMemcpyAsync(buffer(v), data, storedBytes(v), cudaMemcpyDeviceToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_)); // `from` may run again (and write its leaf) after this
  return llvm::Error::success();
}

/// Enqueues op `i`'s kernels or GEMM on the stream (nothing for leaves, aliases, grouped ops
/// and assigns). With profileLaunches_, each launch is timed alone.
llvm::Error CudaExecutor::launchOp(size_t i) {
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  if (lowering.kind == OpLowering::Gemm) {
    afterGeneratedKernel_ = false;
    return runGemm(op, gemms_[i]);
  }
  if (lowering.kind == OpLowering::Collective)
    return runCollective(i);
  if (lowering.kind != OpLowering::Kernels)
    return llvm::Error::success();
  // Each kernel parameter is a pointer, or for a result with a BF16 copy two (F32Bf16Out).
  std::vector<void *> pointers;
  std::vector<size_t> params; // where each parameter starts in `pointers`
  auto add = [&](void *p) {
    params.push_back(pointers.size());
    pointers.push_back(p);
  };
  for (size_t a = 0; a < lowering.arguments.size(); ++a) {
    add(buffer(lowering.arguments[a]));
    if (int(a) == lowering.weightCopyArgument) // an F32Bf16Out: the parameters' BF16 copy follows
      pointers.push_back(weightCopy(lowering.arguments[a]));
  }
  if (lowering.arguments.empty()) {
    for (unsigned k = 0; k < op.numOperands(); ++k) // a parameter the kernel reads in BF16: its copy
      add(llvm::is_contained(lowering.bf16Weights, k) ? weightCopy(op.operand(k)) : buffer(op.operand(k)));
    for (unsigned r = 0; r < op.numResults(); ++r) {
      add(buffer(op.result(r)));
      if (void *copy = shadows_.lookup(op.result(r)))
        pointers.push_back(copy);
    }
  }
  for (void *s : scratch_[i])
    add(s);
  for (void *s : persistent_[i])
    add(s);
  std::vector<void *> args;
  for (size_t p : params)
    args.push_back(&pointers[p]);
  // TGC_GPU_PROFILE=launches: each launch, and cuDNN's call, timed on its own under `label`.
  auto timed = [&](const std::string &label, llvm::function_ref<llvm::Error()> enqueue) -> llvm::Error {
    if (!profileLaunches_)
      return enqueue();
    cudaEvent_t events[2] = {nullptr, nullptr};
    auto destroy = llvm::make_scope_exit([&] {
      for (cudaEvent_t event : events)
        if (event)
          cudaEventDestroy(event);
    });
    for (cudaEvent_t &event : events)
      CUDA_CHECK(cudaEventCreate(&event));
    CUDA_CHECK(cudaEventRecord(events[0], stream_));
    if (auto err = enqueue())
      return err;
    CUDA_CHECK(cudaEventRecord(events[1], stream_));
    CUDA_CHECK(cudaEventSynchronize(events[1]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, events[0], events[1]));
    profileMs_[label] += ms;
    return llvm::Error::success();
  };
  std::string label = profileLaunches_ ? profileLabel(i) : "";
  auto cudnn = [&] { return timed(label + " (cuDNN)", [&] { return runCudnnAttention(i, pointers); }); };
  for (size_t l = 0; l < lowering.launches.size(); ++l) {
    if (lowering.cudnnAttention && l == lowering.libraryAt)
      if (auto err = cudnn())
        return err;
    const KernelLaunch &launch = lowering.launches[l];
    auto enqueue = [&]() -> llvm::Error {
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(unsigned(launch.blocks));
      config.blockDim = dim3(unsigned(launch.threads));
      config.stream = stream_;
      cudaLaunchAttribute serialization{};
      serialization.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      serialization.val.programmaticStreamSerializationAllowed = 1;
      if (programmaticLaunch_ && afterGeneratedKernel_) {
        config.attrs = &serialization;
        config.numAttrs = 1;
      }
      CUDA_CHECK(cudaLaunchKernelExC(&config, (const void *)kernels_[i][l], args.data()));
      afterGeneratedKernel_ = true;
      return llvm::Error::success();
    };
    if (auto err = timed(lowering.launches.size() > 1 ? fmt::format("{} #{}", label, l) : label, enqueue))
      return err;
  }
  if (lowering.cudnnAttention && lowering.libraryAt == lowering.launches.size())
    return cudnn();
  return llvm::Error::success();
}

std::string CudaExecutor::profileLabel(size_t i) const {
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  std::string label = lowering.label.empty() ? op.name().str() : lowering.label;
  if (lowering.kind == OpLowering::Gemm)
    label += hasBf16Gemms(op.attrs()) ? " (bf16)" : isFp8(op.operand(0)->type().dtype) ? " (fp8)" : "";
  else if (op.kind() == OpKind::Transpose && isFp8(op.operand(0)->type().dtype))
    label += " (fp8)";
  return label;
}

/// Enqueues one step on the stream: every op in order, then the assigns.
llvm::Error CudaExecutor::launchStep() {
  afterGeneratedKernel_ = false; // the step's first kernel follows the copies that bind its inputs
  std::vector<std::pair<const Value *, const Value *>> assigns;
  // The parameters as the BF16 GEMMs read them (padding: zeros): those the step's AdamW updates
  // it also writes in BF16 (CudaProgram::optimizerWritesWeightCopy; converted once bound).
  int64_t copied = program_.optimizerWritesWeightCopy ? program_.layout.updatedBytes : 0;
  if (weightsBf16_ && assignsParams_ && copied < paramBytes_)
    if (auto err = convertKernel(params_ + copied, weightsBf16_ + copied / 2, (paramBytes_ - copied) / 4))
      return err;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op &op = *ops_[i];
    const OpLowering &lowering = program_.lowering[i];
    if (options_.poisonResults && (lowering.kind == OpLowering::Kernels || lowering.kind == OpLowering::Gemm))
      for (unsigned r = 0; r < op.numResults(); ++r)
        if (!inPlace_.count(op.result(r))) { // poisoning it would poison the operand it updates
          CUDA_CHECK(cudaMemsetAsync(buffer(op.result(r)), 0xFF, storedBytes(op.result(r)), stream_));
          afterGeneratedKernel_ = false;
          if (void *copy = shadows_.lookup(op.result(r)))
            CUDA_CHECK(cudaMemsetAsync(copy, 0xFF, size_t(op.result(r)->type().numElements()) * 2, stream_));
        }
    if (lowering.kind == OpLowering::Assign)
      assigns.emplace_back(op.operand(0), op.operand(1));
    if (commStream_ && !profile_)
      for (size_t c : joinsBefore_[i]) {
        CUDA_CHECK(cudaStreamWaitEvent(stream_, collectives_[c].done, 0));
        afterGeneratedKernel_ = false;
      }
    cudaEvent_t start = nullptr, stop = nullptr;
    bool timed = profile_ && (lowering.kind == OpLowering::Gemm || lowering.kind == OpLowering::Collective ||
                              (lowering.kind == OpLowering::Kernels && !profileLaunches_));
    if (timed) {
      CUDA_CHECK(cudaEventCreate(&start));
      CUDA_CHECK(cudaEventCreate(&stop));
      CUDA_CHECK(cudaEventRecord(start, stream_));
    }
    if (auto err = launchOp(i))
      return err;
    if (timed) {
      CUDA_CHECK(cudaEventRecord(stop, stream_));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      std::string label = profileLabel(i);
      profileMs_[label] += ms;
      if (traceProcess_ >= 0 && profiledSteps_ < TraceLog::instance().runsTraced()) {
        double endUs = TraceLog::instance().nowUs(); // the op just ended: the stream was synchronised
        TraceLog::instance().add(traceProcess_, {label, lowering.kind == OpLowering::Gemm ? "gemm" : "kernel",
                                                 op.numResults() ? "%" + op.result()->name() : "",
                                                 endUs - 1000.0 * ms, 1000.0 * ms, profiledSteps_});
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
  }
  if (profile_)
    ++profiledSteps_;
  // Every all_reduce joins the main stream before the step ends (those whose results only the
  // host reads, the loss, have had no reader to join them).
  if (commStream_ && !profile_)
    for (size_t i = 0; i < ops_.size(); ++i)
      if (program_.lowering[i].kind == OpLowering::Collective)
        CUDA_CHECK(cudaStreamWaitEvent(stream_, collectives_[i].done, 0));
  // Assigns take effect when the step ends, after every op has read the old values; a value
  // written in place is already there.
  for (auto [leaf, value] : assigns)
    if (buffer(leaf) != buffer(value))
      CUDA_CHECK(cudaMemcpyAsync(buffer(leaf), buffer(value), bytesOf(leaf->type()),
                                 cudaMemcpyDeviceToDevice, stream_));
  return llvm::Error::success();
}

/// TGC_GPU_PROFILE=graph, after a step: each op's launches captured once as a graph of
/// kRepeats copies of them, each replay timed: what the op costs inside the step's
/// CUDA graph, launch gaps included. Inference programs only: repeating an op must not change
/// what the step computed.
llvm::Error CudaExecutor::profileOpGraphs() {
  constexpr int kRepeats = 10;
  if (opGraphs_.empty())
    opGraphs_.resize(ops_.size(), nullptr);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (size_t i = 0; i < ops_.size(); ++i) {
    const OpLowering &lowering = program_.lowering[i];
    if (lowering.kind != OpLowering::Kernels && lowering.kind != OpLowering::Gemm)
      continue;
    if (!opGraphs_[i]) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      llvm::Error err = llvm::Error::success();
      for (int r = 0; r < kRepeats && !err; ++r)
        err = launchOp(i);
      cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      if (err)
        return err;
      if (end != cudaSuccess)
        return cudaFailure("cudaStreamEndCapture", __FILE__, __LINE__, cudaGetErrorString(end));
      CUDA_CHECK(cudaGraphInstantiate(&opGraphs_[i], graph, 0));
      cudaGraphDestroy(graph);
      CUDA_CHECK(cudaGraphLaunch(opGraphs_[i], stream_)); // untimed: the first replay uploads it
    }
    CUDA_CHECK(cudaEventRecord(start, stream_));
    CUDA_CHECK(cudaGraphLaunch(opGraphs_[i], stream_));
    CUDA_CHECK(cudaEventRecord(stop, stream_));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    profileMs_[profileLabel(i)] += ms / kRepeats;
    if (profiledSteps_ == 0)
      ++profileCalls_[profileLabel(i)];
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  ++profiledSteps_;
  return llvm::Error::success();
}

llvm::Error CudaExecutor::step() {
  if (auto err = launch())
    return err;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return llvm::Error::success();
}

llvm::Expected<bool> CudaExecutor::fillNormal(llvm::StringRef name, uint64_t stream, double std) {
  const Value *v = graph_.lookup(name);
  if (!v || !isLeaf(v->def()->kind()) || v->type().dtype != DType::F32 || program_.bf16Stored.count(v) ||
      !buffer(v))
    return false;
  void *out = buffer(v);
  int64_t count = v->type().numElements();
  unsigned long long first = stream; // the kernel's parameter type
  void *args[] = {&out, &count, &first, &std};
  unsigned blocks = unsigned(std::min<int64_t>((count + 255) / 256, 8192));
  CUDA_CHECK(cudaLaunchKernel((const void *)fillNormal_, dim3(blocks), dim3(256), args, 0, stream_));
  afterGeneratedKernel_ = false;
  if (v->def()->kind() == OpKind::Param)
    paramsBound_ = true; // the BF16 copies are made from it
  return true;
}

llvm::Error CudaExecutor::feed(llvm::StringRef valueName, llvm::StringRef leafName) {
  const Value *value = graph_.lookup(valueName), *leaf = graph_.lookup(leafName);
  if (!value || !buffer(value) || !leaf || !isLeaf(leaf->def()->kind()) || leaf->type() != value->type() ||
      program_.bf16Stored.count(leaf) != program_.bf16Stored.count(value))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "graph @%s cannot feed %%%s to the leaf %%%s (both must exist, with one type)",
                                   graph_.name().c_str(), valueName.str().c_str(), leafName.str().c_str());
  CUDA_CHECK(cudaMemcpyAsync(buffer(leaf), buffer(value), storedBytes(leaf), cudaMemcpyDeviceToDevice, stream_));
  if (leaf->def()->kind() == OpKind::Param)
    paramsBound_ = true; // its BF16 copy is made again
  return llvm::Error::success();
}

llvm::Expected<unsigned> CudaExecutor::readLater(llvm::StringRef name) {
  const Value *v = graph_.lookup(name);
  if (!v || !buffer(v) || program_.bf16Stored.count(v) || isFp8(v->type().dtype))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "graph @%s has no fp32 or i32 value '%s' to read", graph_.name().c_str(),
                                   name.str().c_str());
  unsigned ticket = 0;
  while (ticket < later_.size() && later_[ticket].pending)
    ++ticket;
  if (ticket == later_.size())
    later_.emplace_back();
  LaterRead &r = later_[ticket];
  size_t bytes = bytesOf(v->type());
  if (r.bytes < bytes) {
    if (r.host)
      CUDA_CHECK(cudaFreeHost(r.host));
    CUDA_CHECK(cudaMallocHost(&r.host, bytes));
    r.bytes = bytes;
  }
  if (!r.done)
    CUDA_CHECK(cudaEventCreateWithFlags(&r.done, cudaEventDisableTiming));
  CUDA_CHECK(cudaMemcpyAsync(r.host, buffer(v), bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaEventRecord(r.done, stream_));
  r.value = v;
  r.pending = true;
  return ticket;
}

llvm::Expected<Tensor> CudaExecutor::collect(unsigned ticket) {
  if (ticket >= later_.size() || !later_[ticket].pending)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "no read queued as ticket %u", ticket);
  LaterRead &r = later_[ticket];
  CUDA_CHECK(cudaEventSynchronize(r.done));
  r.pending = false;
  Tensor t = Tensor::zeros(r.value->type());
  void *host = isFloat(t.type.dtype) ? (void *)t.data.data() : (void *)t.ints.data();
  std::memcpy(host, r.host, bytesOf(t.type));
  return t;
}

llvm::Error CudaExecutor::launch() {
  // Parameters no step assigns, or whose BF16 copy AdamW writes, are converted to BF16 once
  // after they are bound, not per step.
  if (weightsBf16_ && (!assignsParams_ || program_.optimizerWritesWeightCopy) && paramsBound_) {
    if (auto err = convertKernel(params_, weightsBf16_, paramBytes_ / 4))
      return err;
    paramsBound_ = false;
  }
  // The whole step is captured once as a CUDA graph and replayed: one launch a step, no host
  // synchronisation inside it. (Poisoning between runs is a debugging mode and stays eager.)
  if (options_.poisonResults || profile_) {
    if (auto err = launchStep())
      return err;
  } else {
    if (!graph_exec_) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      llvm::Error err = launchStep();
      cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      if (err)
        return err;
      if (end != cudaSuccess)
        return cudaFailure("cudaStreamEndCapture", __FILE__, __LINE__, cudaGetErrorString(end));
      cudaError_t instantiated = cudaGraphInstantiate(&graph_exec_, graph, 0);
      cudaGraphDestroy(graph);
      if (instantiated != cudaSuccess)
        return cudaFailure("cudaGraphInstantiate", __FILE__, __LINE__, cudaGetErrorString(instantiated));
    }
    CUDA_CHECK(cudaGraphLaunch(graph_exec_, stream_));
  }
  if (profileGraphs_) { // each op replayed alone after the step
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return profileOpGraphs();
  }
  return llvm::Error::success();
}

llvm::Expected<std::vector<Tensor>> CudaExecutor::run() {
  if (auto err = step())
    return std::move(err);
  std::vector<Tensor> outputs;
  for (const Value *v : graph_.outputs()) {
    auto t = read(v->name());
    if (!t)
      return t.takeError();
    outputs.push_back(std::move(*t));
  }
  return outputs;
}

llvm::Expected<Tensor> CudaExecutor::read(llvm::StringRef name) const {
  CUDA_CHECK(cudaStreamSynchronize(stream_)); // the steps launched before it
  const Value *v = graph_.lookup(name);
  if (!v || !buffer(v))
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "graph @%s has no value '%s'",
                                   graph_.name().c_str(), name.str().c_str());
  Tensor t = Tensor::zeros(v->type());
  if (isFp8(v->type().dtype)) {
    // What the CPU interpreter holds for an FP8 value: each code times the scale_inv its
    // quantize used.
    const Op *quantize = quantizeOf(v);
    if (!quantize)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "%%%s is FP8 but no quantize op produced it", name.str().c_str());
    std::vector<uint8_t> codes(t.data.size());
    float scaleInv = 0;
    CUDA_CHECK(cudaMemcpy(codes.data(), buffer(v), codes.size(), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(&scaleInv, usedScaleInv_.lookup(quantize), 4, cudaMemcpyDeviceToHost));
    Fp8Format format = v->type().dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
    for (size_t i = 0; i < codes.size(); ++i)
      t.data[i] = fp8ToFloat(codes[i], format) * scaleInv;
    return t;
  }
  if (program_.bf16Stored.count(v)) { // the BF16 a GEMM reads, widened
    std::vector<uint16_t> bits(t.data.size());
    CUDA_CHECK(cudaMemcpy(bits.data(), buffer(v), bits.size() * 2, cudaMemcpyDeviceToHost));
    std::transform(bits.begin(), bits.end(), t.data.begin(), bf16ToFloat);
    return t;
  }
  void *host = isFloat(t.type.dtype) ? (void *)t.data.data() : (void *)t.ints.data();
  CUDA_CHECK(cudaMemcpy(host, buffer(v), bytesOf(v->type()), cudaMemcpyDeviceToHost));
  return t;
}

} // namespace

llvm::Expected<std::unique_ptr<Executor>> createCudaExecutor(const Graph &graph, CudaOptions options) {
  auto executor = std::make_unique<CudaExecutor>(graph, options);
  if (auto err = executor->initialize())
    return std::move(err);
  return std::unique_ptr<Executor>(std::move(executor));
}

#endif

} // namespace tgc
