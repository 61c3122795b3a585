#include "backends/cuda/runtime/ProgramRunner.h"

#include "backends/cuda/lowering/Lowering.h"
#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/runtime/CudaCheck.h"
#include "ir/Attributes.h"
#include "support/Environment.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <fmt/format.h>

namespace tgc {

ProgramRunner::ProgramRunner(const Graph &graph, CudaOptions options, DeviceInfo device,
                             CompiledCudaProgram compiled, std::unique_ptr<CudnnAttentionRunner> attention,
                             std::unique_ptr<Profiler> profiler, std::string description)
    : graph_(graph), options_(options), device_(std::move(device)), description_(std::move(description)),
      program_(std::move(compiled.program)), cubin_(std::move(compiled.cubin)), attention_(std::move(attention)),
      profiler_(std::move(profiler)) {}

ProgramRunner::~ProgramRunner() {
  dropGraphs();
  attention_.reset(); // its handle works on stream_
  if (library_)
    cudaLibraryUnload(library_);
  if (stream_)
    cudaStreamDestroy(stream_);
}

void ProgramRunner::dropGraphs() {
  if (graphExec_) {
    cudaGraphExecDestroy(graphExec_);
    graphExec_ = nullptr;
  }
  for (cudaGraphExec_t &exec : opGraphs_)
    if (exec) {
      cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
  if (flushGraph_) {
    cudaGraphExecDestroy(flushGraph_);
    flushGraph_ = nullptr;
  }
  for (auto &[label, exec] : stepGraphs_)
    cudaGraphExecDestroy(exec);
  stepGraphs_.clear();
}

size_t ProgramRunner::storedBytes(const Value *v) const { return size_t(storedBytesOf(program_, v)); }

llvm::Error ProgramRunner::initialize() {
  CUDA_CHECK(cudaLibraryLoadData(&library_, cubin_.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  programmaticLaunch_ = device_.major >= 9 && environmentSwitch("TGC_PDL", true) && program_.programmatic;
  CUDA_CHECK(cudaStreamCreate(&stream_));
  if (auto err = attention_->setStream(stream_))
    return err;
  CUDA_CHECK(cudaLibraryGetKernel(&toBf16_, library_, "tgc_float_to_bf16"));
  CUDA_CHECK(cudaLibraryGetKernel(&fillNormal_, library_, "tgc_fill_normal"));
  ops_ = graph_.ops();
  if (auto err = gemms_.open(memory_, ops_.size()))
    return err;
  for (const Op *op : ops_)
    if (op->kind() == OpKind::Assign && op->operand(0)->def()->kind() == OpKind::Param)
      assignsParams_ = true;
  if ((profiler_->replaysOps() || profiler_->replaysSteps()) && assignsParams_)
    profiler_->noReplays();
  kernels_.resize(ops_.size());
  scratch_.resize(ops_.size());
  persistent_.resize(ops_.size());
  MemoryPlan plan = planMemory(graph_, program_);
  memoryBreakdown_ = memoryBreakdown(graph_, program_, plan);
  Regions regions;
  if (auto err = allocateRegions(plan, regions))
    return err;
  for (size_t i = 0; i < ops_.size(); ++i)
    if (auto err = placeOp(i, plan, regions))
      return err;
  if (auto err = uploadAddresses())
    return err;
  // The GEMMs once every op is placed: an FP8 operand kept from the step before (fp8-weights)
  // is made by a quantize later in the step, whose scale_inv and block scales the GEMM reads.
  for (size_t i = 0; i < ops_.size(); ++i)
    if (auto err = planGemm(i, plan, regions))
      return err;
  if (auto err = useBf16OperandCopies())
    return err;
  if (auto err = collectives_.prepare(ops_, program_, options_.communicator, memory_, library_))
    return err;
  return gemms_.tune(ops_, buffers_, inPlace_, stream_);
}

/// Intermediates live in one arena laid out by the memory plan; parameters, the gradients
/// AdamW reads and state in three regions of the parameter layout (zeroed: their padding stays
/// zero), or the parameters and state in CudaOptions::regionsOf's where laid out alike; inputs
/// keep buffers of their own.
llvm::Error ProgramRunner::allocateRegions(const MemoryPlan &plan, Regions &regions) {
  const ParameterLayout &layout = program_.layout;
  borrowed_ = borrowableRegions();
  if (borrowed_.params || borrowed_.state) {
    // The owner's uploads (its binds, on its stream) are done before this program reads them.
    CUDA_CHECK(cudaStreamSynchronize(borrowed_.owner->stream_));
  }
  if (borrowed_.params)
    for (const auto &[v, offset] : layout.params)
      borrowedLeaves_.insert(v);
  if (borrowed_.state)
    for (const auto &[v, offset] : layout.state)
      borrowedLeaves_.insert(v);
  regions.params = borrowed_.params ? borrowed_.owner->params_ : nullptr;
  regions.state = borrowed_.state ? borrowed_.owner->state_ : nullptr;
  struct Region {
    char **base;
    int64_t bytes;
    const char *use;
  };
  for (auto [base, bytes, use] : {Region{&regions.arena, plan.arenaBytes, "arena"},
                                  Region{&regions.params, layout.paramBytes, "master weights"},
                                  Region{&regions.grads, layout.gradBytes, "gradients"},
                                  Region{&regions.state, layout.stateBytes, "state"}}) {
    if (*base)
      continue; // the owner's
    auto p = memory_.allocate(size_t(std::max<int64_t>(bytes, 256)), true, use, bytes);
    if (!p)
      return p.takeError();
    *base = static_cast<char *>(*p);
  }
  params_ = regions.params;
  paramBytes_ = layout.paramBytes;
  state_ = regions.state;
  return llvm::Error::success();
}


/// Op `i`'s results in their buffers, its kernels, scratch, persistent buffers and constants,
/// and its GEMM plan.
llvm::Error ProgramRunner::placeOp(size_t i, const MemoryPlan &plan, const Regions &regions) {
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
      auto p = memory_.allocate(std::max<size_t>(size_t(deviceBytesOf(v->type())), 4), true, "inputs");
      if (!p)
        return p.takeError();
      buffers_[v] = *p;
    } else if (const Value *leaf = program_.inPlace.lookup(v)) {
      buffers_[v] = buffer(leaf); // written into the leaf it is assigned to
      if (!buffers_[v])
        return makeError("%{} is written into %{}, which the program defines after it", v->name(), leaf->name());
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
    auto p = memory_.allocate(size_t(floats) * 4, true, "kernel buffers");
    if (!p)
      return p.takeError();
    persistent_[i].push_back(*p);
  }
  if (!lowering.constants.empty()) { // after the persistent buffers, as the kernels expect
    auto p = memory_.upload(lowering.constants.data(), lowering.constants.size() * sizeof(double), "kernel buffers");
    if (!p)
      return p.takeError();
    persistent_[i].push_back(*p);
  }
  if (op.kind() == OpKind::Quantize) {
    usedScaleInv_[&op] = static_cast<float *>(persistent_[i].at(0));
    if (quantizeOptions(op.attrs()).blockScaling) // emitBlockQuantize's buffers after the totals
      blockScales_[&op] = {static_cast<float *>(persistent_[i].at(1)),
                           persistent_[i].size() > 2 ? static_cast<float *>(persistent_[i][2]) : nullptr};
  }
  return llvm::Error::success();
}

/// The address tables of grouped launches over tensors that lie apart (OpLowering::addresses),
/// once every value has its buffer: after each op's constants.
llvm::Error ProgramRunner::uploadAddresses() {
  for (size_t i = 0; i < ops_.size(); ++i) {
    const std::vector<const Value *> &values = program_.lowering[i].addresses;
    if (values.empty())
      continue;
    std::vector<uint64_t> table;
    for (const Value *v : values) {
      if (!buffer(v))
        return makeError("%{}'s grouped launch reads %{}, which has no buffer", ops_[i]->result()->name(), v->name());
      table.push_back(reinterpret_cast<uint64_t>(buffer(v)));
    }
    auto p = memory_.upload(table.data(), table.size() * sizeof(uint64_t), "kernel buffers");
    if (!p)
      return p.takeError();
    persistent_[i].push_back(*p);
  }
  return llvm::Error::success();
}

llvm::Error ProgramRunner::planGemm(size_t i, const MemoryPlan &plan, const Regions &regions) {
  const OpLowering &lowering = program_.lowering[i];
  if (lowering.kind != OpLowering::Gemm)
    return llvm::Error::success();
  if (auto err = gemms_.plan(i, *ops_[i], program_, buffers_, usedScaleInv_, blockScales_, device_.name))
    return err;
  if (gemms_.at(i).bf16) // the BF16 operand copies follow the op's scratch in the plan
    for (int k = 0; k < 2; ++k)
      gemms_.at(i).bf16Operands[k] = regions.arena + plan.opLocalOffsets[i][lowering.scratchFloats.size() + k];
  return llvm::Error::success();
}


// The same bits as converting them at each GEMM, once a step.
llvm::Error ProgramRunner::useBf16OperandCopies() {
  for (size_t i = 0; i < ops_.size(); ++i)
    for (int k = 0; k < 2 && gemms_.at(i).bf16; ++k) {
      const Value *operand = ops_[i]->operand(k);
      gemms_.at(i).fromWeightCopy[k] = isWeight(program_, operand);
      if (program_.bf16Stored.count(operand))
        gemms_.at(i).bf16Operands[k] = buffer(operand);
      else if (program_.bf16Shadowed.count(operand))
        gemms_.at(i).bf16Operands[k] = shadows_.lookup(operand);
      gemms_.at(i).written[k] = program_.bf16Stored.count(operand) || program_.bf16Shadowed.count(operand);
    }
  // The copy holds the parameters read in BF16 (CudaProgram::weightCopyBegin, End).
  if (int64_t bytes = program_.weightCopyEnd - program_.weightCopyBegin; bytes > 0) {
    if (borrowed_.weightCopy) {
      // Each program writes it at its first step and after its parameters are bound, the same
      // bits from the same parameters.
      weightsBf16_ = borrowed_.owner->weightsBf16_;
    } else {
      auto copy = memory_.allocate(size_t(bytes / 2), false, "BF16 weight copy");
      if (!copy)
        return copy.takeError();
      weightsBf16_ = static_cast<char *>(*copy);
    }
    for (size_t i = 0; i < ops_.size(); ++i) {
      for (int k = 0; k < 2; ++k)
        if (gemms_.at(i).fromWeightCopy[k])
          gemms_.at(i).bf16Operands[k] = weightCopy(ops_[i]->operand(k));
      // A BF16 epilogue adds the bias's BF16 copy (cuBLASLt: the bias has the output's type).
      if (addsBf16Bias(program_, *ops_[i])) {
        if (auto err = gemms_.setBias(i, weightCopy(ops_[i]->operand(2))))
          return err;
      }
    }
  }
  return llvm::Error::success();
}


llvm::Error ProgramRunner::convertToBf16(const void *source, void *target, int64_t count) {
  void *args[] = {&source, &target, &count};
  unsigned blocks = unsigned(std::min<int64_t>((count + 255) / 256, 8192));
  CUDA_CHECK(cudaLaunchKernel((const void *)toBf16_, dim3(blocks), dim3(256), args, 0, stream_));
  afterGeneratedKernel_ = false;
  return llvm::Error::success();
}


std::vector<void *> ProgramRunner::launchPointers(size_t i, std::vector<size_t> &params) const {
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  // Each kernel parameter is a pointer, or for a result with a BF16 copy two (F32Bf16Out).
  std::vector<void *> pointers;
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
  return pointers;
}


/// Enqueues op `i`'s kernels or GEMM on the stream (nothing for leaves, aliases, grouped ops
/// and assigns). With profileLaunches_, each launch is timed alone.
llvm::Error ProgramRunner::launchOp(size_t i) {
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  if (lowering.kind == OpLowering::Gemm) {
    afterGeneratedKernel_ = false;
    return gemms_.run(i, op, buffers_, stream_, [&](const void *source, void *target, int64_t count) {
      return convertToBf16(source, target, count);
    });
  }
  if (lowering.kind == OpLowering::Collective) {
    afterGeneratedKernel_ = false;
    return collectives_.run(i, op, buffers_, stream_, profiler_->timesOps());
  }
  if (lowering.kind != OpLowering::Kernels)
    return llvm::Error::success();
  std::vector<size_t> params; // where each parameter starts in `pointers`
  std::vector<void *> pointers = launchPointers(i, params);
  std::vector<void *> args;
  for (size_t p : params)
    args.push_back(&pointers[p]);
  // TGC_GPU_PROFILE=launches: each launch, and cuDNN's call, timed on its own under `label`.
  auto timed = [&](const std::string &label, llvm::function_ref<llvm::Error()> enqueue) -> llvm::Error {
    if (!profiler_->timesLaunches())
      return enqueue();
    auto ms = Profiler::time(stream_, enqueue);
    if (!ms)
      return ms.takeError();
    profiler_->add(label, *ms);
    return llvm::Error::success();
  };
  std::string label = profiler_->timesLaunches() ? profileLabel(i) : "";
  auto cudnn = [&] {
    afterGeneratedKernel_ = false;
    return timed(label + " (cuDNN)", [&] { return attention_->run(i, lowering, pointers); });
  };
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
      cudaLaunchAttribute serialization{}, cooperative{};
      serialization.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      serialization.val.programmaticStreamSerializationAllowed = 1;
      cooperative.id = cudaLaunchAttributeCooperative;
      cooperative.val.cooperative = 1;
      if (launch.cooperative) { // starts once the kernel before it has ended, all its blocks at once
        config.attrs = &cooperative;
        config.numAttrs = 1;
      } else if (programmaticLaunch_ && afterGeneratedKernel_) {
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


std::string ProgramRunner::profileLabel(size_t i) const {
  const Op &op = *ops_[i];
  const OpLowering &lowering = program_.lowering[i];
  std::string label = lowering.label.empty() ? op.name().str() : lowering.label;
  if (lowering.kind == OpLowering::Gemm)
    label += hasBf16Gemms(op.attrs()) ? " (bf16)" : isFp8(op.operand(0)->type().dtype) ? " (fp8)" : "";
  else if (op.kind() == OpKind::Transpose && isFp8(op.operand(0)->type().dtype))
    label += " (fp8)";
  return label;
}


/// The results of bf16Rounding's ops that they write in BF16, in program order (an FP8
/// matmul_bias's BF16 bias is its operand's copy, not a value of the program: not among them).
std::vector<std::string> ProgramRunner::roundedValues() const {
  std::vector<std::string> names;
  for (const Op *op : ops_)
    if (program_.bf16Rounding.count(op))
      for (unsigned r = 0; r < op->numResults(); ++r)
        if (program_.bf16Stored.count(op->result(r)))
          names.push_back(op->result(r)->name());
  return names;
}

/// setTracingValues: op `i`'s results as read() reads them, once the op has run.
llvm::Error ProgramRunner::traceResults(size_t i) {
  const Op &op = *ops_[i];
  OpLowering::Kind kind = program_.lowering[i].kind;
  if (kind == OpLowering::Leaf || kind == OpLowering::Assign || kind == OpLowering::Grouped)
    return llvm::Error::success();
  for (unsigned r = 0; r < op.numResults(); ++r) {
    if (!buffer(op.result(r)))
      continue; // a result without memory of its own
    auto value = read(op.result(r)->name());
    if (!value)
      return value.takeError();
    traced_.emplace_back(op.result(r)->name(), std::move(*value));
  }
  afterGeneratedKernel_ = false; // read() waited for the stream: the next kernel follows nothing
  return llvm::Error::success();
}

/// Enqueues one step on the stream: every op in order, then the assigns.
llvm::Error ProgramRunner::launchStep(llvm::StringRef without) {
  afterGeneratedKernel_ = false; // the step's first kernel follows the copies that bind its inputs
  traced_.clear();
  std::vector<std::pair<const Value *, const Value *>> assigns;
  // The parameters as the BF16 GEMMs read them (padding: zeros): those the step's AdamW updates
  // it also writes in BF16 (CudaProgram::optimizerWritesWeightCopy; converted once bound).
  int64_t begin = program_.weightCopyBegin, end = program_.weightCopyEnd;
  int64_t copied = program_.optimizerWritesWeightCopy ? program_.layout.updatedBytes : begin;
  if (weightsBf16_ && assignsParams_ && copied < end)
    if (auto err = convertToBf16(params_ + copied, weightsBf16_ + (copied - begin) / 2, (end - copied) / 4))
      return err;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const Op &op = *ops_[i];
    const OpLowering &lowering = program_.lowering[i];
    if (options_.poisonResults && lowering.launchesWork())
      for (unsigned r = 0; r < op.numResults(); ++r)
        if (!inPlace_.count(op.result(r))) { // poisoning it would poison the operand it updates
          CUDA_CHECK(cudaMemsetAsync(buffer(op.result(r)), 0xFF, storedBytes(op.result(r)), stream_));
          afterGeneratedKernel_ = false;
          if (void *copy = shadows_.lookup(op.result(r)))
            CUDA_CHECK(cudaMemsetAsync(copy, 0xFF, size_t(op.result(r)->type().numElements()) * 2, stream_));
        }
    if (lowering.kind == OpLowering::Assign)
      assigns.emplace_back(op.operand(0), op.operand(1));
    bool profiling = profiler_->timesOps();
    if (collectives_.concurrent() && !profiling && collectives_.joinsBefore(i)) {
      if (auto err = collectives_.joinBefore(i, stream_))
        return err;
      afterGeneratedKernel_ = false;
    }
    bool timed = profiling && (lowering.kind == OpLowering::Gemm || lowering.kind == OpLowering::Collective ||
                               (lowering.kind == OpLowering::Kernels && !profiler_->timesLaunches()));
    if (!without.empty() && lowering.launchesWork() && profileLabel(i) == without)
      continue;
    if (!timed) {
      if (auto err = launchOp(i))
        return err;
    } else {
      auto ms = Profiler::time(stream_, [&] { return launchOp(i); });
      if (!ms)
        return ms.takeError();
      std::string label = profileLabel(i);
      profiler_->add(label, *ms);
      profiler_->trace(label, lowering.kind == OpLowering::Gemm ? "gemm" : "kernel",
                       op.numResults() ? "%" + op.result()->name() : "", *ms);
    }
    if (tracingValues_)
      if (auto err = traceResults(i))
        return err;
  }
  if (profiler_->timesOps())
    profiler_->endStep();
  // Every all_reduce joins the main stream before the step ends (those whose results only the
  // host reads, the loss, have had no reader to join them).
  if (collectives_.concurrent() && !profiler_->timesOps())
    if (auto err = collectives_.joinAll(program_, stream_))
      return err;
  // Assigns take effect when the step ends, after every op has read the old values; a value
  // written in place is already there.
  for (auto [leaf, value] : assigns)
    if (buffer(leaf) != buffer(value))
      CUDA_CHECK(cudaMemcpyAsync(buffer(leaf), buffer(value), size_t(deviceBytesOf(leaf->type())),
                                 cudaMemcpyDeviceToDevice, stream_));
  return llvm::Error::success();
}

llvm::Error ProgramRunner::step() {
  if (auto err = launch())
    return err;
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return llvm::Error::success();
}

llvm::Expected<cudaGraphExec_t> ProgramRunner::captureGraph(llvm::function_ref<llvm::Error()> enqueue) {
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  llvm::Error err = enqueue();
  cudaError_t end = cudaStreamEndCapture(stream_, &graph); // ends the capture whatever went wrong
  if (err) {
    if (end == cudaSuccess)
      cudaGraphDestroy(graph);
    return std::move(err);
  }
  if (end != cudaSuccess)
    return cudaFailure("cudaStreamEndCapture", __FILE__, __LINE__, cudaGetErrorString(end));
  cudaGraphExec_t exec = nullptr;
  cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (instantiated != cudaSuccess)
    return cudaFailure("cudaGraphInstantiate", __FILE__, __LINE__, cudaGetErrorString(instantiated));
  return exec;
}

llvm::Error ProgramRunner::launch() {
  // Parameters no step assigns, or whose BF16 copy AdamW writes, are converted to BF16 once
  // after they are bound, not per step.
  if (weightsBf16_ && (!assignsParams_ || program_.optimizerWritesWeightCopy) && paramsBound_) {
    if (auto err = convertToBf16(params_ + program_.weightCopyBegin, weightsBf16_,
                                 (program_.weightCopyEnd - program_.weightCopyBegin) / 4))
      return err;
    paramsBound_ = false;
  }
  if (profiler_->replaysSteps())
    if (auto err = profileMarginal())
      return err;
  // The whole step is captured once as a CUDA graph and replayed: one launch a step, no host
  // synchronisation inside it. (Poisoning between runs and tracing values are debugging modes
  // and stay eager.)
  if (options_.poisonResults || profiler_->timesOps() || tracingValues_) {
    if (auto err = launchStep())
      return err;
  } else {
    if (!graphExec_) {
      auto exec = captureGraph([&] { return launchStep(); });
      if (!exec)
        return exec.takeError();
      graphExec_ = *exec;
    }
    CUDA_CHECK(cudaGraphLaunch(graphExec_, stream_));
  }
  if (profiler_->replaysOps()) { // each op replayed alone after the step
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return profileOpGraphs();
  }
  return llvm::Error::success();
}


llvm::Expected<std::vector<Tensor>> ProgramRunner::run() {
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


} // namespace tgc
