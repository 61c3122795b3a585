// Type rules of the collectives of data parallelism: all_reduce, and ZeRO's reduce_scatter,
// all_gather and shard (a rank's part of a tensor flattened and zero-padded, ir/Ops.def), and
// of a parameter held as such a part.
#include "ir/InferRules.h"
#include "support/Error.h"

namespace tgc::infer {

/// dtype, where present, is "bf16": the values cross the ranks in BF16.
static llvm::Error checkWireDType(const AttrMap &attrs) {
  auto dtype = attrs.getString("dtype");
  if (dtype && *dtype != "bf16")
    return makeError("dtype must be \"bf16\" (or absent: fp32), got \"{}\"", *dtype);
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferAllReduce(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto reduce = attrs.getString("reduce");
  if (!reduce || (*reduce != "avg" && *reduce != "sum" && *reduce != "max"))
    return makeError("needs attribute reduce = \"avg\", \"sum\" or \"max\"");
  if (auto err = checkWireDType(attrs))
    return std::move(err);
  TypeList types;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].dtype != DType::F32)
      return makeError("operand {} is {}: all_reduce takes f32 tensors", i, ops[i].str());
    types.push_back(ops[i]);
  }
  return types;
}

/// A ZeRO op's ranks (and rank, where it takes one): 1 <= rank + 1 <= ranks.
static llvm::Expected<int64_t> shardRanks(const AttrMap &attrs, bool withRank) {
  std::optional<int64_t> ranks = attrs.getInt("ranks"), rank = attrs.getInt("rank");
  if (!ranks || *ranks < 1 || *ranks > 4096)
    return makeError("needs attribute ranks (1 to 4096)");
  if (withRank && (!rank || *rank < 0 || *rank >= *ranks))
    return makeError("needs attribute rank in [0, ranks = {})", *ranks);
  return *ranks;
}

/// f32[ceil(N / ranks)]: a rank's part of `x` flattened and zero-padded to a multiple of ranks.
static llvm::Expected<TensorType> shardOf(const TensorType &x, int64_t ranks, size_t i, const char *op) {
  if (x.dtype != DType::F32)
    return makeError("operand {} is {}: {} takes f32 tensors", i, x.str(), op);
  return TensorType(DType::F32, {(x.numElements() + ranks - 1) / ranks});
}

llvm::Expected<TypeList> inferReduceScatter(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto reduce = attrs.getString("reduce");
  if (!reduce || (*reduce != "avg" && *reduce != "sum"))
    return makeError("needs attribute reduce = \"avg\" or \"sum\"");
  auto ranks = shardRanks(attrs, true);
  if (!ranks)
    return ranks.takeError();
  if (auto err = checkWireDType(attrs))
    return std::move(err);
  TypeList types;
  for (size_t i = 0; i < ops.size(); ++i) {
    auto shard = shardOf(ops[i], *ranks, i, "reduce_scatter");
    if (!shard)
      return shard.takeError();
    types.push_back(*shard);
  }
  return types;
}

llvm::Expected<TypeList> inferAllGather(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto ranks = shardRanks(attrs, false);
  if (!ranks)
    return ranks.takeError();
  TypeList types;
  for (size_t i = 0; i < ops.size(); ++i) {
    if ((ops[i].dtype != DType::F32 && !isFp8(ops[i].dtype)) || ops[i].rank() != 1)
      return makeError("operand {} is {}: all_gather takes f32 or FP8 shards [n]", i, ops[i].str());
    types.push_back(TensorType(ops[i].dtype, {ops[i].dim(0) * *ranks}));
  }
  return types;
}

/// A parameter held as ZeRO rank `rank`'s shard of a tensor of shape `whole`
/// (ShardedFp8Weights.h): f32[ceil(N / ranks)].
llvm::Error checkShardOfWhole(const TensorType &type, const AttrMap &attrs) {
  auto ranks = shardRanks(attrs, true);
  if (!ranks)
    return ranks.takeError();
  auto whole = attrs.getInts("whole");
  if (!whole || whole->empty())
    return makeError("a shard's 'whole' must be a shape");
  int64_t total = 1;
  for (int64_t d : *whole) {
    if (d < 1 || d > (int64_t(1) << 40) / total)
      return makeError("'whole' must be a shape of positive dimensions, at most 2^40 elements");
    total *= d;
  }
  TensorType shard(DType::F32, {(total + *ranks - 1) / *ranks});
  if (type != shard)
    return makeError("a shard of {} elements over {} ranks is {}, got {}", total, *ranks, shard.str(), type.str());
  return llvm::Error::success();
}

llvm::Expected<TypeList> inferShard(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto ranks = shardRanks(attrs, true);
  if (!ranks)
    return ranks.takeError();
  auto shard = shardOf(ops[0], *ranks, 0, "shard");
  if (!shard)
    return shard.takeError();
  return TypeList{*shard};
}

} // namespace tgc::infer
