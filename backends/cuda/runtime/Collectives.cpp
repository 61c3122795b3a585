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

/// Whether all_reduce `op` sends its values in BF16.
bool reducesInBf16(const Op &op) { return op.attrs().getString("dtype") == std::optional<std::string>("bf16"); }

llvm::Error Collectives::prepare(const std::vector<Op *> &ops, const CudaProgram &program,
                                 Communicator *communicator, DeviceMemory &memory, cudaLibrary_t library) {
  events_.resize(ops.size());
  joinsBefore_.resize(ops.size());
  bool any = false;
  size_t stagedBytes = 0; // the largest BF16 all_reduce: its operands, and the padding between them
  for (size_t i = 0; i < ops.size(); ++i)
    if (program.lowering[i].kind == OpLowering::Collective && reducesInBf16(*ops[i])) {
      size_t bytes = 0;
      for (const Value *operand : ops[i]->operands())
        bytes += size_t(deviceBytesOf(operand->type())) / 2 + 512;
      stagedBytes = std::max(stagedBytes, bytes);
    }
  if (stagedBytes) {
    CUDA_CHECK(cudaLibraryGetKernel(&toBf16_, library, "tgc_float_to_bf16"));
    CUDA_CHECK(cudaLibraryGetKernel(&fromBf16_, library, "tgc_bf16_to_float"));
    CUDA_CHECK(cudaLibraryGetKernel(&roundThroughBf16_, library, "tgc_round_through_bf16"));
  }
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops.size(); ++i)
    index[ops[i]] = i;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (program.lowering[i].kind != OpLowering::Collective)
      continue;
    any = true;
    size_t first = ops.size(); // its results' first reader
    for (unsigned r = 0; r < ops[i]->numResults(); ++r)
      for (const Op *user : ops[i]->result(r)->users())
        first = std::min(first, index.lookup(user));
    if (first < ops.size())
      joinsBefore_[first].push_back(i);
    CUDA_CHECK(cudaEventCreateWithFlags(&events_[i].ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&events_[i].done, cudaEventDisableTiming));
  }
  if (!any || !communicator || communicator->ranks() <= 1)
    return llvm::Error::success(); // one rank: each result is its operand (rounded under bf16)
  if (stagedBytes) {
    auto staging = memory.allocate(stagedBytes, false, "BF16 gradients on the wire");
    if (!staging)
      return staging.takeError();
    staging_ = (unsigned short *)*staging;
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

llvm::Error Collectives::run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream,
                             bool onMainStream) {
  const bool bf16 = reducesInBf16(op);
  if (!nccl_ && bf16) { // one rank: each operand rounded to BF16 and back
    for (unsigned k = 0; k < op.numOperands(); ++k)
      if (auto err = convert(roundThroughBf16_, buffers.lookup(op.operand(k)), buffers.lookup(op.result(k)),
                             op.operand(k)->type().numElements(), stream))
        return err;
    return llvm::Error::success();
  }
  if (!nccl_) { // one rank
    for (unsigned k = 0; k < op.numOperands(); ++k)
      if (buffers.lookup(op.result(k)) != buffers.lookup(op.operand(k)))
        CUDA_CHECK(cudaMemcpyAsync(buffers.lookup(op.result(k)), buffers.lookup(op.operand(k)),
                                   size_t(deviceBytesOf(op.operand(k)->type())), cudaMemcpyDeviceToDevice, stream));
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
  cudaStream_t on = onMainStream ? stream : commStream_;
  if (on != stream) {
    CUDA_CHECK(cudaEventRecord(events_[i].ready, stream));
    CUDA_CHECK(cudaStreamWaitEvent(on, events_[i].ready, 0));
  }
  auto check = [&](int result, const char *call) -> llvm::Error {
    if (result == 0)
      return llvm::Error::success();
    return makeError("error: {} failed for %{}: {} (NCCL {})", call, op.result()->name(), nccl_->errorString(result),
                     result);
  };
  // Under bf16 each call's range goes through the staging buffer: rounded into it, reduced
  // there in BF16, widened into the results (their padding included: zeros stay zeros).
  std::vector<unsigned short *> staged;
  size_t offset = 0;
  for (const Range &c : calls) {
    staged.push_back(bf16 ? staging_ + offset : nullptr);
    offset += (c.bytes / 4 + 255) / 256 * 256; // elements, 512-byte aligned
    if (bf16)
      if (auto err = convert(toBf16_, c.send, staged.back(), int64_t(c.bytes / 4), on))
        return err;
  }
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart"))
    return err;
  for (size_t k = 0; k < calls.size(); ++k) {
    const Range &c = calls[k];
    int result = bf16 ? nccl_->allReduce(staged[k], staged[k], c.bytes / 4, kNcclBfloat16, ncclOp, comm_, on)
                      : nccl_->allReduce(c.send, c.receive, c.bytes / 4, kNcclFloat32, ncclOp, comm_, on);
    if (auto err = check(result, "ncclAllReduce")) {
      nccl_->groupEnd();
      return err;
    }
  }
  if (auto err = check(nccl_->groupEnd(), "ncclGroupEnd"))
    return err;
  for (size_t k = 0; bf16 && k < calls.size(); ++k)
    if (auto err = convert(fromBf16_, staged[k], calls[k].receive, int64_t(calls[k].bytes / 4), on))
      return err;
  if (on != stream)
    CUDA_CHECK(cudaEventRecord(events_[i].done, on));
  return llvm::Error::success();
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
