// What the host does with a running program's leaves and values: binds them, reads them back
// (FP8 values as their codes times the scale_inv used, BF16 stores widened), feeds one value
// into a leaf on the device, queues reads for later, and shares or copies a leaf between two
// programs on one GPU (a prefill and its decode step); runs the prologue that makes the leaves a
// step derives from the others (the FP8 weights between steps).
#include "backends/cuda/runtime/ProgramRunner.h"
#include "backends/Prologue.h"
#include "ir/Attributes.h"
#include "support/Error.h"

#include "backends/cuda/lowering/MemoryPlan.h"
#include "backends/cuda/runtime/CudaCheck.h"
#include "support/Numerics.h"

#include <algorithm>
#include <cstring>

namespace tgc {

llvm::Error ProgramRunner::bind(llvm::StringRef name, Tensor tensor) {
  const Value *v = graph_.lookup(name);
  if (!v || !isLeaf(v->def()->kind()) || v->def()->kind() == OpKind::Constant)
    return makeError("graph @{} has no input, parameter or state named '{}'", graph_.name().c_str(),
                     name.str().c_str());
  if (tensor.type != v->type())
    return makeError("'{}' is {}, but a {} was given", name.str().c_str(), v->type().str().c_str(),
                     tensor.type.str().c_str());
  if (isFp8(v->type().dtype))
    return makeError("'{}' is {}: FP8 tensors come from quantize ops, not from the host", name.str().c_str(),
                     v->type().str().c_str());
  const void *host = isFloat(tensor.type.dtype) ? (const void *)tensor.data.data()
                                                : (const void *)tensor.ints.data();
  std::vector<uint16_t> bf16;
  if (program_.bf16Stored.count(v)) { // a leaf stored in BF16 (a KV cache): rounded as its writes round
    bf16.resize(tensor.data.size());
    std::transform(tensor.data.begin(), tensor.data.end(), bf16.begin(), floatToBf16);
    host = bf16.data();
  }
  size_t bytes = storedBytes(v);
  if (bytes <= HostStaging::kSlotBytes) {
    // A small input (a decode step's tokens and positions) through pinned staging memory: the
    // copy is queued behind the steps launched, where one from pageable memory may wait for them.
    if (auto err = staging_.upload(buffer(v), host, bytes, stream_))
      return err;
  } else {
    // From pageable memory: the call returns once `host` is staged, so the tensor may go.
    CUDA_CHECK(cudaMemcpyAsync(buffer(v), host, bytes, cudaMemcpyHostToDevice, stream_));
  }
  if (v->def()->kind() == OpKind::Param)
    paramsBound_ = true;
  return llvm::Error::success();
}

std::pair<const Value *, const Value *> ProgramRunner::sameLeaf(llvm::StringRef name, const Executor &executor) const {
  const auto *other = dynamic_cast<const ProgramRunner *>(&executor);
  const Value *v = graph_.lookup(name);
  const Value *source = other ? other->graph_.lookup(name) : nullptr;
  if (!other || other->options_.device != options_.device || !v || !source || !isLeaf(v->def()->kind()) ||
      v->type() != source->type() || !other->buffer(source) ||
      program_.bf16Stored.count(v) != other->program_.bf16Stored.count(source))
    return {nullptr, nullptr};
  return {v, source};
}

llvm::Expected<bool> ProgramRunner::shareLeaf(llvm::StringRef name, Executor &owner) {
  auto [v, source] = sameLeaf(name, owner);
  if (!v || v->def()->kind() != OpKind::State || source->def()->kind() != OpKind::State || shadows_.count(v))
    return false;
  // The leaf, the values written in place into it and their aliases all start at its buffer.
  void *old = buffer(v), *shared = static_cast<const ProgramRunner &>(owner).buffer(source);
  for (auto &[value, pointer] : buffers_)
    if (pointer == old)
      pointer = shared;
  dropGraphs(); // captured with the old pointer
  return true;
}

bool ProgramRunner::borrowsLeaf(llvm::StringRef name) const {
  const Value *v = graph_.lookup(name);
  return v && borrowedLeaves_.count(v);
}

ProgramRunner::Borrowed ProgramRunner::borrowableRegions() const {
  Borrowed borrowed;
  const auto *owner = dynamic_cast<const ProgramRunner *>(options_.regionsOf);
  if (!owner || owner->options_.device != options_.device)
    return borrowed;
  // Every leaf of this region at the owner's offset, with the owner's type and storage, and the
  // regions the same size: then the owner's bytes are this program's.
  auto alike = [&](const llvm::DenseMap<const Value *, int64_t> &mine, int64_t myBytes,
                   const llvm::DenseMap<const Value *, int64_t> &theirs, int64_t theirBytes) {
    if (myBytes == 0 || myBytes != theirBytes || mine.size() != theirs.size())
      return false;
    for (const auto &[v, offset] : mine) {
      const Value *other = owner->graph_.lookup(v->name());
      auto it = other ? theirs.find(other) : theirs.end();
      if (it == theirs.end() || it->second != offset || other->type() != v->type() ||
          program_.bf16Stored.count(v) != owner->program_.bf16Stored.count(other))
        return false;
    }
    return true;
  };
  const ParameterLayout &mine = program_.layout, &theirs = owner->program_.layout;
  borrowed.owner = owner;
  borrowed.params = owner->params_ && alike(mine.params, mine.paramBytes, theirs.params, theirs.paramBytes);
  borrowed.state = owner->state_ && alike(mine.state, mine.stateBytes, theirs.state, theirs.stateBytes);
  borrowed.weightCopy = borrowed.params && owner->weightsBf16_ &&
                        program_.weightCopyBegin == owner->program_.weightCopyBegin &&
                        program_.weightCopyEnd == owner->program_.weightCopyEnd;
  return borrowed;
}

llvm::Error ProgramRunner::copyLeafFrom(llvm::StringRef name, const Executor &from) {
  auto [v, source] = sameLeaf(name, from);
  if (!v)
    return Executor::copyLeafFrom(name, from); // through the host, with bind's checks
  void *data = static_cast<const ProgramRunner &>(from).buffer(source);
  CUDA_CHECK(cudaMemcpyAsync(buffer(v), data, storedBytes(v), cudaMemcpyDeviceToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_)); // `from` may run again (and write its leaf) after this
  return llvm::Error::success();
}


// The prologue's ops (backends/Prologue.h) launched outside a step: each operand read from a
// leaf takes its value where it is not already in the leaf's memory (the arena's scale a step's
// update writes, say), and each result goes to its leaf where not written there in place.
llvm::Error ProgramRunner::runPrologue() {
  std::vector<PrologueOp> prologue = prologueOps(graph_);
  llvm::DenseMap<const Op *, size_t> index;
  for (size_t i = 0; i < ops_.size(); ++i)
    index[ops_[i]] = i;
  auto copy = [&](const Value *to, const Value *from) -> llvm::Error {
    if (buffer(to) == buffer(from))
      return llvm::Error::success();
    if (storedBytes(to) != storedBytes(from))
      return makeError("the prologue cannot copy %{} into %{}: they are stored in {} and {} bytes",
                       from->name(), to->name(), storedBytes(from), storedBytes(to));
    CUDA_CHECK(cudaMemcpyAsync(buffer(to), buffer(from), storedBytes(to), cudaMemcpyDeviceToDevice, stream_));
    afterGeneratedKernel_ = false;
    return llvm::Error::success();
  };
  for (const PrologueOp &p : prologue) {
    for (unsigned k = 0; k < p.op->numOperands(); ++k)
      if (p.operandLeaves[k]) // (else made by the prologue's op before, where the step makes it)
        if (auto err = copy(p.op->operand(k), p.operandLeaves[k]))
          return err;
    size_t i = index.lookup(p.op);
    if (const Value *skip = program_.lowering[i].zeroInPrologue)
      CUDA_CHECK(cudaMemsetAsync(buffer(skip), 0, 4, stream_)); // AdamW's skip: 0.0f
    // A collective (the FP8 codes of sharded weights, gathered) on this stream, in turn.
    llvm::Error err = program_.lowering[i].kind == OpLowering::Collective
                          ? collectives_.run(i, *p.op, buffers_, stream_, /*onMainStream=*/true)
                          : launchOp(i);
    if (err)
      return err;
    for (unsigned r = 0; r < p.op->numResults(); ++r)
      if (const Value *leaf = p.resultLeaves[r])
        if (auto err = copy(leaf, p.op->result(r)))
          return err;
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return llvm::Error::success();
}

llvm::Expected<bool> ProgramRunner::fillNormal(llvm::StringRef name, uint64_t stream, double std) {
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

llvm::Error ProgramRunner::feed(llvm::StringRef valueName, llvm::StringRef leafName) {
  const Value *value = graph_.lookup(valueName), *leaf = graph_.lookup(leafName);
  if (!value || !buffer(value) || !leaf || !isLeaf(leaf->def()->kind()) || leaf->type() != value->type() ||
      program_.bf16Stored.count(leaf) != program_.bf16Stored.count(value))
    return makeError("graph @{} cannot feed %{} to the leaf %{} (both must exist, with one type)",
                     graph_.name().c_str(), valueName.str().c_str(), leafName.str().c_str());
  CUDA_CHECK(cudaMemcpyAsync(buffer(leaf), buffer(value), storedBytes(leaf), cudaMemcpyDeviceToDevice, stream_));
  if (leaf->def()->kind() == OpKind::Param)
    paramsBound_ = true; // its BF16 copy is made again
  return llvm::Error::success();
}

llvm::Expected<unsigned> ProgramRunner::readLater(llvm::StringRef name) {
  const Value *v = graph_.lookup(name);
  if (!v || !buffer(v) || program_.bf16Stored.count(v) || isFp8(v->type().dtype))
    return makeError("graph @{} has no fp32 or i32 value '{}' to read", graph_.name().c_str(), name.str().c_str());
  auto ticket = staging_.readLater(buffer(v), size_t(deviceBytesOf(v->type())), stream_);
  if (!ticket)
    return ticket.takeError();
  if (*ticket >= laterValues_.size())
    laterValues_.resize(*ticket + 1);
  laterValues_[*ticket] = v;
  return *ticket;
}

llvm::Expected<Tensor> ProgramRunner::collect(unsigned ticket) {
  auto bytes = staging_.collect(ticket);
  if (!bytes)
    return bytes.takeError();
  Tensor t = Tensor::zeros(laterValues_[ticket]->type());
  void *host = isFloat(t.type.dtype) ? (void *)t.data.data() : (void *)t.ints.data();
  std::memcpy(host, *bytes, size_t(deviceBytesOf(t.type)));
  return t;
}


// A block-scaled quantize's q (or its transpose, q^T: [cols, rows] of x [rows, cols]) as the CPU
// holds it: each code times its block's scale_inv, read where emitBlockQuantize wrote them (the
// layouts cuBLASLt reads: 1 x 128 blocks of R rows [K/128][R], 128 x 128 ones [R/128][ceil4(K/128)]).
llvm::Expected<Tensor> ProgramRunner::readBlockScaled(const Op &quantize, const Value *v,
                                                      const std::vector<uint8_t> &codes, Tensor t) const {
  bool transposed = isQuantizeTranspose(quantize, v);
  QuantizeOptions options = quantizeOptions(quantize.attrs());
  const TensorType &x = quantize.operand(0)->type();
  int64_t cols = x.dim(-1), rows = x.numElements() / cols;
  if (transposed)
    std::swap(rows, cols);
  int64_t blockRows = options.blockRows;
  std::vector<float> scales(static_cast<size_t>(blockScaleCount(rows, cols, blockRows)));
  float *device = transposed ? blockScales_.lookup(&quantize).second : blockScales_.lookup(&quantize).first;
  CUDA_CHECK(cudaMemcpy(scales.data(), device, scales.size() * 4, cudaMemcpyDeviceToHost));
  Fp8Format format = v->type().dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      size_t block = size_t(blockScaleIndex(r, k, rows, cols, blockRows));
      t.data[size_t(r * cols + k)] = fp8ToFloat(codes[size_t(r * cols + k)], format) * scales[block];
    }
  return t;
}

llvm::Expected<Tensor> ProgramRunner::read(llvm::StringRef name) const {
  CUDA_CHECK(cudaStreamSynchronize(stream_)); // the steps launched before it
  const Value *v = graph_.lookup(name);
  if (!v || !buffer(v))
    return makeError("graph @{} has no value '{}'", graph_.name().c_str(), name.str().c_str());
  Tensor t = Tensor::zeros(v->type());
  if (isFp8(v->type().dtype)) {
    // What the CPU interpreter holds for an FP8 value: each code times the scale_inv its
    // quantize used.
    const Op *quantize = quantizeOf(v);
    if (!quantize)
      return makeError("%{} is FP8 but no quantize op produced it", name.str().c_str());
    std::vector<uint8_t> codes(t.data.size());
    float scaleInv = 0;
    CUDA_CHECK(cudaMemcpy(codes.data(), buffer(v), codes.size(), cudaMemcpyDeviceToHost));
    if (blockScales_.count(quantize))
      return readBlockScaled(*quantize, v, codes, std::move(t));
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
  CUDA_CHECK(cudaMemcpy(host, buffer(v), size_t(deviceBytesOf(v->type())), cudaMemcpyDeviceToHost));
  return t;
}


} // namespace tgc
