#include "backends/cuda/lowering/Traffic.h"

#include "backends/cuda/lowering/MemoryPlan.h"
#include "ir/Attributes.h"

#include "llvm/ADT/SmallPtrSet.h"

#include <algorithm>

namespace tgc {

namespace {

/// The value whose memory `v` is: through reshapes, and from a result written in place to its leaf.
const Value *memoryOf(const CudaProgram &program, const Value *v) {
  v = reshapeRoot(v);
  while (const Value *leaf = program.inPlace.lookup(v))
    v = reshapeRoot(leaf);
  return v;
}

/// The bytes of one row of a KV cache [batch, positions, ...].
int64_t cacheRowBytes(const CudaProgram &program, const Value *cache) {
  const auto &shape = cache->type().shape;
  return shape.size() < 2 ? 0 : storedBytesOf(program, cache) / std::max<int64_t>(shape[0] * shape[1], 1);
}

} // namespace

int64_t opTraffic(const CudaProgram &program, const Op &op, int64_t cacheRows) {
  const bool bf16Products = hasBf16Gemms(op.attrs());
  llvm::SmallPtrSet<const Value *, 16> counted;
  int64_t bytes = 0;
  auto rows = [&](const Value *cache, int64_t n) {
    counted.insert(memoryOf(program, cache));
    bytes += n * cacheRowBytes(program, cache);
  };
  if (op.kind() == OpKind::Embedding) { // the table's rows the indices name
    const Value *table = op.operand(0);
    counted.insert(memoryOf(program, table));
    bytes += op.operand(1)->type().numElements() * storedBytesOf(program, table) /
             std::max<int64_t>(table->type().shape[0], 1);
  } else if (op.kind() == OpKind::Slice) { // the part it keeps
    counted.insert(memoryOf(program, op.operand(0)));
    bytes += storedBytesOf(program, op.result());
  } else if (op.kind() == OpKind::DecodeAttention) { // the caches' rows up to each position
    for (unsigned c = 1; c <= 2; ++c)
      rows(op.operand(c), cacheRows);
    if (writesCache(op.attrs())) // a row each sequence
      for (unsigned c = 1; c <= 2; ++c)
        bytes += op.operand(0)->type().shape[0] * cacheRowBytes(program, op.operand(c));
  } else if (op.kind() == OpKind::KvWrite) { // the rows of the tokens written
    const TensorType &qkv = op.operand(2)->type();
    for (unsigned c = 0; c < 2; ++c)
      rows(op.operand(c), qkv.numElements() / std::max<int64_t>(qkv.shape.back(), 1));
  }
  auto count = [&](const Value *v) {
    if (!counted.insert(memoryOf(program, v)).second)
      return;
    bool weightCopy = bf16Products && v->type().shape.size() >= 2 && isWeight(program, v);
    bytes += weightCopy ? v->type().numElements() * 2 : storedBytesOf(program, v);
  };
  for (const Value *v : op.operands())
    count(v);
  for (unsigned r = 0; r < op.numResults(); ++r)
    count(op.result(r));
  return bytes;
}

} // namespace tgc
