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

llvm::Error Collectives::prepare(const std::vector<Op *> &ops, const CudaProgram &program,
                                 Communicator *communicator) {
  events_.resize(ops.size());
  joinsBefore_.resize(ops.size());
  bool any = false;
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
    return llvm::Error::success(); // one rank: each result is its operand
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

llvm::Error Collectives::run(size_t i, const Op &op, const BufferMap &buffers, cudaStream_t stream,
                             bool onMainStream) {
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
  if (auto err = check(nccl_->groupStart(), "ncclGroupStart"))
    return err;
  for (const Range &c : calls)
    if (auto err = check(nccl_->allReduce(c.send, c.receive, c.bytes / 4, kNcclFloat32, ncclOp, comm_, on),
                         "ncclAllReduce")) {
      nccl_->groupEnd();
      return err;
    }
  if (auto err = check(nccl_->groupEnd(), "ncclGroupEnd"))
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
