#include "backends/cuda/runtime/Collectives.h"

#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/runtime/CudaCheck.h"

#include <algorithm>

namespace tgc {

Collectives::~Collectives() {
  for (Events &e : events_)
    for (cudaEvent_t event : {e.ready, e.done})
      if (event)
        cudaEventDestroy(event);
  if (commStream_)
    cudaStreamDestroy(commStream_);
}

/// Whether collective `op` sends its values in BF16.
bool reducesInBf16(const Op &op) { return op.attrs().getString("dtype") == std::optional<std::string>("bf16"); }

/// The ranks a ZeRO collective's attributes name (1 for an all_reduce: any).
int64_t ranksOf(const Op &op) { return op.kind() == OpKind::AllReduce ? 1 : *op.attrs().getInt("ranks"); }

constexpr size_t aligned512(size_t bytes) { return (bytes + 511) / 512 * 512; }

/// The staging bytes collective `op` needs over `ranks` ranks: a BF16 all_reduce's operands
/// in BF16 (with the padding between merged runs); a reduce_scatter's operands that need
/// zero-padding to ranks x part, or all of them under bf16 with their parts as they come back.
size_t stagingBytes(const Op &op, int64_t ranks) {
  size_t bytes = 0;
  const bool bf16 = reducesInBf16(op);
  for (const Value *operand : op.operands()) {
    size_t count = size_t(operand->type().numElements()), part = (count + size_t(ranks) - 1) / size_t(ranks);
    if (op.kind() == OpKind::AllReduce && bf16)
      bytes += count * 2 + 1024;
    else if (op.kind() == OpKind::ReduceScatter && (bf16 || size_t(ranks) * part > count))
      bytes += aligned512(size_t(ranks) * part * (bf16 ? 2 : 4)) + (bf16 ? aligned512(part * 2) : 0);
  }
  return bytes;
}

llvm::Error Collectives::prepare(const std::vector<Op *> &ops, const CudaProgram &program,
                                 Communicator *communicator, DeviceMemory &memory, cudaLibrary_t library) {
  events_.resize(ops.size());
  joinsBefore_.resize(ops.size());
  bool any = false;
  const int64_t ranks = communicator ? communicator->ranks() : 1;
  size_t staged = 0; // the largest staging any collective needs (they run one at a time)
  std::vector<size_t> joins = collectiveJoins(ops, program); // (the memory plan's too)
  for (size_t i = 0; i < ops.size(); ++i) {
    if (program.lowering[i].kind != OpLowering::Collective)
      continue;
    any = true;
    // A ZeRO collective's parts are the program's rank count's (NCCL's, the run's).
    if (ops[i]->kind() != OpKind::AllReduce && ranksOf(*ops[i]) != ranks)
      return makeError("error: %{} = {} shards over {} ranks; this run has {}", ops[i]->result()->name(),
                       ops[i]->name().str(), ranksOf(*ops[i]), ranks);
    staged = std::max(staged, stagingBytes(*ops[i], ranks));
    if (joins[i] < ops.size())
      joinsBefore_[joins[i]].push_back(i);
    CUDA_CHECK(cudaEventCreateWithFlags(&events_[i].ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&events_[i].done, cudaEventDisableTiming));
  }
  if (any) {
    CUDA_CHECK(cudaLibraryGetKernel(&toBf16_, library, "tgc_float_to_bf16"));
    CUDA_CHECK(cudaLibraryGetKernel(&fromBf16_, library, "tgc_bf16_to_float"));
    CUDA_CHECK(cudaLibraryGetKernel(&roundThroughBf16_, library, "tgc_round_through_bf16"));
  }
  if (!any || ranks <= 1)
    return llvm::Error::success(); // one rank: each result is its operand (rounded under bf16)
  if (staged) {
    auto staging = memory.allocate(staged, false, "collectives' staging (padded parts, BF16 on the wire)");
    if (!staging)
      return staging.takeError();
    staging_ = (char *)*staging;
  }
  comm_ = communicator->ncclComm();
  if (!comm_)
    return makeError("error: the GPU reduces over ranks through NCCL, and this run's ranks have no "
                     "NCCL communicator");
  auto api = loadNccl();
  if (!api)
    return api.takeError();
  nccl_ = *api;
  CUDA_CHECK(cudaStreamCreateWithFlags(&commStream_, cudaStreamNonBlocking));
  return llvm::Error::success();
}

llvm::Error Collectives::convert(cudaKernel_t kernel, const void *from, void *to, int64_t count,
                                 cudaStream_t stream) const {
  void *args[] = {&from, &to, &count};
  unsigned blocks = unsigned(std::min<int64_t>((count + 255) / 256, 8192));
  CUDA_CHECK(cudaLaunchKernel((const void *)kernel, dim3(blocks), dim3(256), args, 0, stream));
  return llvm::Error::success();
}

llvm::Error Collectives::check(int result, const char *call, const Op &op) const {
  if (result == 0)
    return llvm::Error::success();
  return makeError("error: {} failed for %{}: {} (NCCL {})", call, op.result()->name(), nccl_->errorString(result),
                   result);
}

/// One rank: each result is its operand (a reduce_scatter's part over one rank is the whole
/// operand, flattened; an all_gather's the one part), rounded to BF16 under dtype = "bf16".
llvm::Error Collectives::runOneRank(const Op &op, const BufferMap &buffers, cudaStream_t stream) const {
  for (unsigned k = 0; k < op.numOperands(); ++k) {
    const void *from = buffers.lookup(op.operand(k));
    void *to = buffers.lookup(op.result(k));
    if (reducesInBf16(op)) {
      if (auto err = convert(roundThroughBf16_, from, to, op.operand(k)->type().numElements(), stream))
        return err;
    } else if (to != from) {
      CUDA_CHECK(cudaMemcpyAsync(to, from, size_t(deviceBytesOf(op.operand(k)->type())), cudaMemcpyDeviceToDevice,
                                 stream));
    }
  }
  return llvm::Error::success();
}

llvm::Error Collectives::run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream,
                             bool onMainStream) {
  if (!nccl_)
    return runOneRank(op, buffers, stream);
  cudaStream_t on = onMainStream ? stream : commStream_;
  if (on != stream) {
    CUDA_CHECK(cudaEventRecord(events_[i].ready, stream));
    CUDA_CHECK(cudaStreamWaitEvent(on, events_[i].ready, 0));
  }
  llvm::Error err = op.kind() == OpKind::ReduceScatter ? reduceScatter(op, buffers, on)
                    : op.kind() == OpKind::AllGather   ? allGather(op, buffers, on)
                                                       : allReduce(op, buffers, on);
  if (err)
    return err;
  if (on != stream)
    CUDA_CHECK(cudaEventRecord(events_[i].done, on));
  return llvm::Error::success();
}

llvm::Error Collectives::allReduce(const Op &op, const BufferMap &buffers, cudaStream_t on) const {
  const bool bf16 = reducesInBf16(op);
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
    ranges.push_back({(char *)buffers.lookup(op.operand(k)), (char *)buffers.lookup(op.result(k)),
                      size_t(deviceBytesOf(op.operand(k)->type()))});
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
  // Under bf16 each call's range goes through the staging buffer: rounded into it, reduced
  // there in BF16, widened into the results (their padding included: zeros stay zeros).
  std::vector<char *> staged;
  size_t offset = 0;
  for (const Range &c : calls) {
    staged.push_back(bf16 ? staging_ + offset : nullptr);
    offset += aligned512(c.bytes / 2);
    if (bf16)
      if (auto err = convert(toBf16_, c.send, staged.back(), int64_t(c.bytes / 4), on))
        return err;
  }
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart", op))
    return err;
  for (size_t k = 0; k < calls.size(); ++k) {
    const Range &c = calls[k];
    int result = bf16 ? nccl_->allReduce(staged[k], staged[k], c.bytes / 4, kNcclBfloat16, ncclOp, comm_, on)
                      : nccl_->allReduce(c.send, c.receive, c.bytes / 4, kNcclFloat32, ncclOp, comm_, on);
    if (auto err = check(result, "ncclAllReduce", op)) {
      nccl_->groupEnd();
      return err;
    }
  }
  if (auto err = check(nccl_->groupEnd(), "ncclGroupEnd", op))
    return err;
  for (size_t k = 0; bf16 && k < calls.size(); ++k)
    if (auto err = convert(fromBf16_, staged[k], calls[k].receive, int64_t(calls[k].bytes / 4), on))
      return err;
  return llvm::Error::success();
}

/// ZeRO's gradient reduce-scatter: each operand (N elements, flattened) zero-padded to R x n in
/// the staging buffer (rounded to BF16 under bf16; an fp32 operand with N = R x n is sent as it
/// lies), NCCL's reduce-scatter of it, this rank's part n into the result (widened from BF16
/// under bf16).
llvm::Error Collectives::reduceScatter(const Op &op, const BufferMap &buffers, cudaStream_t on) const {
  const bool bf16 = reducesInBf16(op);
  const size_t ranks = size_t(ranksOf(op)), width = bf16 ? 2 : 4;
  const int ncclOp = *parseReduceOp(*op.attrs().getString("reduce")) == ReduceOp::Avg ? kNcclAvg : kNcclSum;
  struct Part {
    char *send, *receive;
    size_t count, part;
  };
  std::vector<Part> parts;
  size_t offset = 0;
  for (unsigned k = 0; k < op.numOperands(); ++k) {
    Part p;
    p.count = size_t(op.operand(k)->type().numElements());
    p.part = size_t(op.result(k)->type().numElements());
    const bool padded = ranks * p.part > p.count;
    char *operand = (char *)buffers.lookup(op.operand(k));
    // An fp32 operand of whole parts is sent from where it lies; the others are staged.
    const bool staged = bf16 || padded;
    p.send = staged ? staging_ + offset : operand;
    offset += staged ? aligned512(ranks * p.part * width) : 0;
    p.receive = bf16 ? staging_ + offset : (char *)buffers.lookup(op.result(k));
    offset += bf16 ? aligned512(p.part * width) : 0;
    if (bf16) {
      if (auto err = convert(toBf16_, operand, p.send, int64_t(p.count), on))
        return err;
    } else if (padded) {
      CUDA_CHECK(cudaMemcpyAsync(p.send, operand, p.count * 4, cudaMemcpyDeviceToDevice, on));
    }
    if (padded)
      CUDA_CHECK(cudaMemsetAsync(p.send + p.count * width, 0, (ranks * p.part - p.count) * width, on));
    parts.push_back(p);
  }
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart", op))
    return err;
  for (const Part &p : parts)
    if (auto err = check(nccl_->reduceScatter(p.send, p.receive, p.part, bf16 ? kNcclBfloat16 : kNcclFloat32, ncclOp,
                                              comm_, on),
                         "ncclReduceScatter", op)) {
      nccl_->groupEnd();
      return err;
    }
  if (auto err = check(nccl_->groupEnd(), "ncclGroupEnd", op))
    return err;
  for (unsigned k = 0; bf16 && k < op.numOperands(); ++k)
    if (auto err = convert(fromBf16_, parts[k].receive, buffers.lookup(op.result(k)), int64_t(parts[k].part), on))
      return err;
  return llvm::Error::success();
}

/// ZeRO's parameter all-gather: each rank's part n of each operand into the result's R x n, in
/// rank order (fp32: the master weights; FP8: the codes of FP8 weights, a byte each).
llvm::Error Collectives::allGather(const Op &op, const BufferMap &buffers, cudaStream_t on) const {
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart", op))
    return err;
  for (unsigned k = 0; k < op.numOperands(); ++k)
    if (auto err = check(nccl_->allGather(buffers.lookup(op.operand(k)), buffers.lookup(op.result(k)),
                                          size_t(op.operand(k)->type().numElements()),
                                          isFp8(op.operand(k)->type().dtype) ? kNcclUint8 : kNcclFloat32, comm_, on),
                         "ncclAllGather", op)) {
      nccl_->groupEnd();
      return err;
    }
  return check(nccl_->groupEnd(), "ncclGroupEnd", op);
}

llvm::Error Collectives::joinBefore(size_t i, cudaStream_t stream) const {
  for (size_t c : joinsBefore_[i])
    CUDA_CHECK(cudaStreamWaitEvent(stream, events_[c].done, 0));
  return llvm::Error::success();
}

llvm::Error Collectives::joinAll(const CudaProgram &program, cudaStream_t stream) const {
  for (size_t i = 0; i < events_.size(); ++i)
    if (program.lowering[i].kind == OpLowering::Collective)
      CUDA_CHECK(cudaStreamWaitEvent(stream, events_[i].done, 0));
  return llvm::Error::success();
}

} // namespace tgc
