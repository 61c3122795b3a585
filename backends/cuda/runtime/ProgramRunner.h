// Runs one compiled program (Compile.h) on one GPU, one step as one CUDA graph replay: places
// its values (the memory plan's arena, the parameter, gradient and state regions, inputs) and
// launches its kernels in program order, with each resource owned by its part: GEMMs
// (Gemms.h), cuDNN's attention (CudnnAttention.h), collectives (Collectives.h), profiling
// (Profiler.h), host staging (HostStaging.h), device memory (DeviceMemory.h). The steps live in
// ProgramRunner.cpp; what the host binds, reads and moves between programs in LeafAccess.cpp.
#pragma once

#include "backends/Executor.h"
#include "backends/cuda/CudaExecutor.h"
#include "backends/cuda/Compile.h"
#include "backends/cuda/runtime/Collectives.h"
#include "backends/cuda/runtime/CudnnAttention.h"
#include "backends/cuda/runtime/Device.h"
#include "backends/cuda/runtime/DeviceMemory.h"
#include "backends/cuda/runtime/Gemms.h"
#include "backends/cuda/runtime/HostStaging.h"
#include "backends/cuda/runtime/Profiler.h"
#include "backends/cuda/lowering/MemoryClasses.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <cuda_runtime.h>
#include <memory>

namespace tgc {

struct MemoryPlan;

class ProgramRunner : public Executor {
public:
  ProgramRunner(const Graph &graph, CudaOptions options, DeviceInfo device, CompiledCudaProgram compiled,
                std::unique_ptr<CudnnAttentionRunner> attention, std::unique_ptr<Profiler> profiler,
                std::string description);
  ~ProgramRunner() override;

  /// Loads the kernels, allocates and places the buffers, plans the GEMMs and collectives.
  llvm::Error initialize();

  // Executor (LeafAccess.cpp, but for the steps).
  llvm::Error bind(llvm::StringRef name, Tensor tensor) override;
  llvm::Expected<std::vector<Tensor>> run() override;
  llvm::Error step() override;
  llvm::Error launch() override;
  void setProfiling(bool on) override { profiler_->setTimingOps(on); }
  std::map<std::string, double> profileByOp() const override { return profiler_->byOp(); }
  void setTracingValues(bool on) override { tracingValues_ = on; }
  std::vector<std::pair<std::string, Tensor>> tracedValues() const override { return traced_; }
  std::vector<std::string> roundedValues() const override;
  llvm::Expected<bool> fillNormal(llvm::StringRef name, uint64_t stream, double std) override;
  llvm::Error feed(llvm::StringRef value, llvm::StringRef leaf) override;
  llvm::Expected<unsigned> readLater(llvm::StringRef name) override;
  llvm::Expected<Tensor> collect(unsigned ticket) override;
  llvm::Error copyLeafFrom(llvm::StringRef name, const Executor &from) override;
  llvm::Expected<bool> shareLeaf(llvm::StringRef name, Executor &owner) override;
  bool borrowsLeaf(llvm::StringRef name) const override;
  llvm::Expected<Tensor> read(llvm::StringRef name) const override;
  llvm::Error runPrologue() override;
  std::string describe() const override { return description_; }
  int64_t deviceBytes() const override { return memory_.bytes(); }
  std::vector<std::string> memoryReport() const override;

private:
  struct Regions {
    char *arena = nullptr, *params = nullptr, *grads = nullptr, *state = nullptr;
  };
  llvm::Error allocateRegions(const MemoryPlan &plan, Regions &regions);
  /// The regions of CudaOptions::regionsOf's program this one uses (LeafAccess.cpp): its
  /// parameters and its state where each is laid out as here (the same leaves by name, type,
  /// storage and offset, the same size), its BF16 weight copy where the parameters are and the
  /// copy spans the same bytes. Nulls for the others.
  struct Borrowed {
    const ProgramRunner *owner = nullptr;
    bool params = false, state = false, weightCopy = false;
  };
  Borrowed borrowableRegions() const;
  /// Op `i`'s results in their buffers, its kernels, scratch, persistent buffers and constants.
  llvm::Error placeOp(size_t i, const MemoryPlan &plan, const Regions &regions);
  /// The address tables of grouped launches over tensors that lie apart (OpLowering::addresses),
  /// once every value has its buffer.
  llvm::Error uploadAddresses();
  /// Op `i`'s GEMM plan (cuBLASLt's descriptors and algorithm, its operands' scales), once
  /// every op is placed.
  llvm::Error planGemm(size_t i, const MemoryPlan &plan, const Regions &regions);
  /// BF16 GEMM operands that are parameters (or reshapes of them) read the BF16 copy of the
  /// parameter region; operands stored in BF16 or with a BF16 copy are read as they are.
  llvm::Error useBf16OperandCopies();
  /// Enqueues one step: every op in order, then the assigns; the ops profiled as `without`
  /// left out (TGC_GPU_PROFILE=marginal).
  llvm::Error launchStep(llvm::StringRef without = {});
  /// Enqueues op `i`'s kernels, GEMM or collective (nothing for leaves, aliases, grouped ops
  /// and assigns).
  llvm::Error launchOp(size_t i);
  /// The pointers op `i`'s launches take, in the order the generated kernels' parameters name.
  std::vector<void *> launchPointers(size_t i, std::vector<size_t> &params) const;
  /// TGC_GPU_PROFILE=graph or bandwidth: each op replayed alone from a graph of its own, timed
  /// (OpProfile.cpp).
  llvm::Error profileOpGraphs();
  /// What `enqueue` puts on the stream, captured and instantiated as a graph (not launched).
  llvm::Expected<cudaGraphExec_t> captureGraph(llvm::function_ref<llvm::Error()> enqueue);
  /// Op `i`'s launches `repeats` times (each after an L2 flush with TGC_GPU_PROFILE=bandwidth),
  /// captured as a graph.
  llvm::Expected<cudaGraphExec_t> captureOpGraph(size_t i, int repeats);
  /// TGC_GPU_PROFILE=marginal, before a step: the step replayed from a graph whole and without
  /// each kind of op in turn; what leaving a kind out saves is what it costs in the chain.
  llvm::Error profileMarginal();
  /// The cache rows a decode step's attentions read: each sequence's position and the rows before.
  llvm::Expected<int64_t> cacheRowsRead() const;
  std::string profileLabel(size_t i) const;
  llvm::Error convertToBf16(const void *source, void *target, int64_t count);
  /// The step's graphs are stale (a leaf's buffer moved): captured again at the next step.
  void dropGraphs();
  /// Leaf `name` here and in `executor`, where that is a ProgramRunner on this device and the two
  /// have one type and one storage (fp32, or BF16 on both sides); else nulls.
  std::pair<const Value *, const Value *> sameLeaf(llvm::StringRef name, const Executor &executor) const;
  void *buffer(const Value *v) const { return buffers_.lookup(v); }
  /// A parameter's place in the BF16 copy of the parameter region's bytes from
  /// CudaProgram::weightCopyBegin (the same index, counted from there).
  void *weightCopy(const Value *param) const {
    return weightsBf16_ + ((char *)buffer(param) - params_ - program_.weightCopyBegin) / 2;
  }
  size_t storedBytes(const Value *v) const;

  const Graph &graph_;
  CudaOptions options_;
  DeviceInfo device_;
  std::string description_;
  std::vector<Op *> ops_;
  CudaProgram program_;
  std::string cubin_;
  MemoryBreakdown memoryBreakdown_; // the plan's, by class (memoryReport)
  // The resources, each owned by its part (destroyed after the body of ~ProgramRunner).
  DeviceMemory memory_;
  HostStaging staging_;
  GemmRunner gemms_;
  Collectives collectives_;
  std::unique_ptr<CudnnAttentionRunner> attention_;
  std::unique_ptr<Profiler> profiler_;
  std::vector<const Value *> laterValues_; // readLater's value for each ticket
  cudaStream_t stream_ = nullptr;
  cudaLibrary_t library_ = nullptr;
  cudaKernel_t toBf16_ = nullptr;     // the prelude's f32 -> BF16 conversion
  cudaKernel_t fillNormal_ = nullptr; // the prelude's normal draws (fillNormal)
  cudaGraphExec_t graphExec_ = nullptr;
  std::vector<cudaGraphExec_t> opGraphs_; // TGC_GPU_PROFILE=graph: per op
  void *flushL2_ = nullptr;                // TGC_GPU_PROFILE=bandwidth: written before each replay
  size_t flushBytes_ = 0;
  cudaGraphExec_t flushGraph_ = nullptr;   // the flushes alone, timed to take them out
  // TGC_GPU_PROFILE=marginal: the whole step's graph (label ""), then one without each kind.
  std::vector<std::pair<std::string, cudaGraphExec_t>> stepGraphs_;
  /// Kernels launched with programmatic stream serialization (compute capability 9.0 on): each
  /// may start while the generated kernel before it ends; it waits for it in awaitPreviousKernel
  /// (common.cuh) before touching memory. Only in programs without cuBLASLt GEMMs nor
  /// collectives that write no parameters (CudaProgram::programmatic: a decode step); TGC_PDL=0
  /// turns it off.
  bool programmaticLaunch_ = false;
  /// Whether the last launch in the stream was one of the generated kernels: only those are
  /// followed programmatically.
  bool afterGeneratedKernel_ = false;
  std::vector<std::vector<cudaKernel_t>> kernels_; // per op, per launch
  std::vector<std::vector<void *>> scratch_;       // per op
  std::vector<std::vector<void *>> persistent_;    // per op
  llvm::Expected<Tensor> readBlockScaled(const Op &quantize, const Value *v, const std::vector<uint8_t> &codes,
                                         Tensor t) const;
  llvm::DenseMap<const Op *, float *> usedScaleInv_; // per quantize op: the scale_inv it used
  // Per block-scaled quantize op: its q's block scales, and its transpose's (or null).
  BlockScaleMap blockScales_;
  BufferMap buffers_;
  BufferMap shadows_;                     // BF16 copies of bf16Shadowed values
  llvm::DenseSet<const Value *> inPlace_; // results written into their assigned leaf's buffer
  // Parameters in one buffer (ParameterLayout), and when BF16 GEMMs read them, a BF16 copy of
  // that buffer written once at the start of each step instead of a conversion per GEMM.
  char *params_ = nullptr;
  int64_t paramBytes_ = 0;
  char *weightsBf16_ = nullptr;
  char *state_ = nullptr;
  // The regions this program uses of another's (CudaOptions::regionsOf), and the leaves in them.
  Borrowed borrowed_;
  llvm::DenseSet<const Value *> borrowedLeaves_;
  // Whether the program assigns parameters (training): then the BF16 copy is written inside
  // each step; otherwise (generation) once after the parameters are bound, outside the steps.
  // paramsBound_: the parameters changed since their BF16 copy was made (at first: never made).
  bool assignsParams_ = false, paramsBound_ = true;
  // setTracingValues: the steps run eagerly, each op's results read back after it (ops run by
  // a group's launches, Grouped, are not: their values are written elsewhere in the step).
  bool tracingValues_ = false;
  std::vector<std::pair<std::string, Tensor>> traced_;
  llvm::Error traceResults(size_t i);
};

} // namespace tgc
