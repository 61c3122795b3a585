// FP8 weights under ZeRO (fp8-weights after adamw with shard: optimizer | gradients). The adamw
// pass rebuilds every parameter from the ranks' updated fp32 shards: one all_gather, 4 bytes a
// parameter over the wire, and a whole fp32 copy of each on every rank. An FP8 weight kept in
// FP8 between steps needs only its FP8 codes whole: each rank quantizes its updated shard (at the
// scale every rank shares), the codes are all-gathered (1 byte a parameter), the amaxes reduced
// by their maximum and the saturation counts by their sum, and the transpose the backward reads
// is made from the gathered codes. The fp32 master stays a shard: the parameter itself becomes
// f32[ceil(N / ranks)] {whole = shape, rank, ranks}, which the trainer gathers into a checkpoint
// and cuts from one (as the moments), and which no op of the step reads but AdamW and the quantize.
//
// The same bits as the fp32 gather: per-tensor quantization is elementwise at one scale, the
// maximum of the shards' amaxes is the whole's (the zero padding adds nothing), and so is the
// sum of their counts. Delayed per-tensor scaling only: a current scale is the tensor's own
// amax's, block scales are laid out along the whole's rows.
#pragma once

#include "ir/Graph.h"

#include "llvm/Support/Error.h"

#include <vector>

namespace tgc {

/// The updated fp32 shard that adamw gathers into `weight` (an FP8 weight whose per-tensor
/// delayed-scaling quantize is `quantize`), where only that quantize, the shard AdamW reads
/// and the assign of the gathered value read the weight. Else null: the weight keeps the fp32
/// gather.
Value *updatedShard(const Value *weight, const Op &quantize);

struct ShardedFp8Weight {
  Value *weight;
  /// The quantize of the updated shard: q's codes of the shard, its amax and count.
  Op *next;
  /// The state the step leaves: q, amax, count, and q_t where the transpose is kept.
  llvm::SmallVector<Value *, 4> states;
};

/// After each `next`: one all_gather of the codes, one all_reduce of the amaxes (max) and one
/// of the counts (sum), each weight's whole codes (and their transpose) assigned to its state;
/// the weights become their shards and leave the fp32 gather.
llvm::Error gatherInFp8(Graph &graph, const std::vector<ShardedFp8Weight> &weights);

} // namespace tgc
