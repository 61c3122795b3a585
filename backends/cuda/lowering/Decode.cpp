// The generation family (decode.cuh, decode_stream.cuh): the KV-cache writes, the attention over
// the cache, argmax.
#include "backends/cuda/lowering/Families.h"
#include "ir/Rope.h"
#include "support/Environment.h"
#include "support/Error.h"
#include "support/Sampling.h"

#include <fmt/format.h>

#include <algorithm>

namespace tgc {

namespace {

/// The launches that write the caches (kv_write, decode_attention {write_cache}) write only this
/// step's rows where the caches are written in place (results kOut and vOut, `first` and the one
/// after it); otherwise launch 0 copies the caches into them first. Returns the next launch.
unsigned copyCachesUnlessInPlace(const Op &op, Emitter &e, const std::string &params, unsigned first) {
  if (e.program_.inPlace.count(op.result(first)) && e.program_.inPlace.count(op.result(first + 1)))
    return 0;
  int64_t count = op.result(first)->type().numElements();
  e.launch(0, params, elementwiseBlocks(count), fmt::format("kvCopy<{}>(k, v, kOut, vOut)", count));
  return 1;
}

/// Under rope_theta (fuse-cache-rope), the op's constants: ir/Rope.h's table of the cache's T
/// positions for heads of Dh, and ", const double *table" for its launches' parameters.
std::string cacheRopeTable(const Op &op, Emitter &e, int64_t T, int64_t Dh) {
  if (!op.attrs().has("rope_theta"))
    return "";
  std::vector<float> table = ropeTable(ropeOptions(op.attrs(), "rope_theta"), T, Dh);
  e.lowering.constants.assign(table.begin(), table.end());
  return ", const double *table";
}

/// The sample op after argmaxParts (launch 0, into scratch 0): where every row's blocks of
/// 2048 or 4096 logits fit the GPU at once (sampleGrid's blocks an SM), one cooperative launch
/// of them all, its sums in scratch 1, which launch 0 zeroes; otherwise the weights of every
/// token into scratch 1, then a block a row (sampleRows).
llvm::Error emitSample(const Op &op, Emitter &e, int64_t n, int64_t rows, int64_t argChunk) {
  const int64_t chunks = (n + argChunk - 1) / argChunk, stride = op.attrs().getInt("stride").value_or(0);
  const std::string opParams = "const float *x, const int *counters, const float *sampling, const int *seed, int *out",
                    params = opParams + ", float *parts, float *scratch";
  // sampleCluster (compute capability 9.0, where TGC_SAMPLE_CLUSTER=1 asks for it): one launch of
  // a cluster of 8 blocks of 1024 threads a row, a thread at most 8 tokens (vocabularies up to
  // 65,536). Off by default: its tokens are sampleGrid's, but its steps were no shorter
  // (BENCHMARKS.md, session 53).
  constexpr int kClusterBlocks = 8, kClusterThreads = 1024;
  if (e.program_.computeCapability >= 90 && n <= int64_t(8) * kClusterBlocks * kClusterThreads &&
      environmentSwitch("TGC_SAMPLE_CLUSTER", false)) {
    e.lowering.scratchFloats.clear(); // no argmax parts: the cluster takes the row's argmax itself
    e.launch(0, opParams, rows * kClusterBlocks,
             fmt::format("sampleCluster<{}, {}, {}, {}>(x, counters, sampling, seed, out)", n, kClusterBlocks,
                         kClusterThreads, stride),
             kClusterThreads, 1);
    e.cluster(kClusterBlocks);
    return llvm::Error::success();
  }
  const int64_t resident = int64_t(kSampleGridBlocksPerSM) * e.program_.multiprocessors;
  for (int64_t chunk : {int64_t(2048), int64_t(4096)}) {
    int64_t gridChunks = (n + chunk - 1) / chunk;
    if (rows * gridChunks > resident)
      continue;
    e.lowering.scratchFloats.push_back(2 * rows * (kSampleGridRowWords + gridChunks));
    e.launch(0, params, rows * chunks,
             fmt::format("argmaxParts<{0}, {1}>(x, parts); sampleGridClear<{0}, {2}>((unsigned long long *)scratch, {3})",
                         n, argChunk, chunk, rows));
    e.launch(1, params, rows * gridChunks,
             fmt::format("sampleGrid<{}, {}, {}, {}>(x, parts, counters, sampling, seed, (unsigned long long *)scratch, out)",
                         n, argChunk, chunk, stride),
             kSampleGridThreads, kSampleGridBlocksPerSM);
    e.cooperative();
    return llvm::Error::success();
  }
  e.lowering.scratchFloats.push_back(2 * rows * n); // the weights, 64-bit integers
  e.launch(0, params, rows * chunks, fmt::format("argmaxParts<{}, {}>(x, parts)", n, argChunk));
  e.launch(1, params, rows * chunks,
           fmt::format("sampleWeights<{}, {}>(x, parts, sampling, (unsigned long long *)scratch)", n, argChunk));
  e.launch(2, params, rows,
           fmt::format("sampleRows<{}, {}, {}>(x, parts, counters, sampling, seed, (const unsigned long long *)scratch, out)",
                       n, argChunk, stride),
           1024);
  return llvm::Error::success();
}

/// decode_attention. Flash-decoding: each (query, head) split into parts, a block each, the
/// last block of each combining. Where the caches' rows stream (decode_stream.cuh: whole 16-byte
/// chunks) and the parts are read from memory, a fixed number of parts a query, their size from
/// its position: as many as fill the resident blocks once (8 of 128 threads an SM) over the
/// (query, head) pairs (the kernel takes at least a block's turn of keys a part, so short
/// contexts use fewer). Otherwise (decode.cuh) parts of Keys keys: 32 where the queries and heads
/// are fewer than half the SMs (more blocks at the short positions of a decode), else 64. S
/// queries a sequence (a draft's tokens checked at once; 1 in a decode step).
llvm::Error emitDecodeAttention(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  const TensorType &out = outputType(op);
  AttentionHeads heads = attentionHeads(a);
  int64_t B = out.dim(0), S = out.dim(1), D = out.dim(2), T = operandType(op, 1).dim(1), H = heads.heads, Dh = D / H;
  const int64_t pairs = B * S * H, sms = e.program_.multiprocessors;
  // The caches as they are stored: BF16 (chooseBf16Caches) or fp32.
  bool bf16Caches = e.program_.bf16Stored.count(op.operand(1)) && e.program_.bf16Stored.count(op.operand(2));
  const char *cache = bf16Caches ? "unsigned short" : "float";
  const int64_t cacheBytes = bf16Caches ? 2 : 4, chunks = Dh * cacheBytes / 16;
  // The keys and values go through shared tiles of at most 32 KB (decode.cuh's Tiles); under
  // programmatic launch, in place, with the positions an input (written before the step), they
  // load before the kernel awaits the one before it (Early). That pays where the step waits on
  // latency: fewer (query, head) pairs than SMs, heads of at most 64. Elsewhere each block reads
  // its part straight from memory (grouped heads still need the tiles to write their rows).
  int64_t keys = std::min<int64_t>(T, 2 * pairs < sms ? 32 : 64);
  bool write = writesCache(a), latencyBound = pairs < sms && Dh <= 64;
  bool tiles = write && (heads.grouped() || latencyBound) && Dh * cacheBytes % 16 == 0 &&
               2 * keys * Dh * cacheBytes <= 32 * 1024;
  // (decode_stream.cuh's streamable(): rows of a power of two of 16-byte chunks, at most a warp.)
  bool stream = !tiles && Dh * cacheBytes % 16 == 0 && chunks <= 32 && (chunks & (chunks - 1)) == 0;
  // (At most a part per 32 keys of the cache: a part takes at least the kernel's turn, 32 keys
  // or more, so further parts would stay empty.)
  constexpr int64_t kStreamBlocksPerSM = 8;
  int64_t splits = stream ? std::clamp<int64_t>(kStreamBlocksPerSM * sms / pairs, 1, (T + 31) / 32)
                          : (T + keys - 1) / keys;
  if (stream)
    splits = environmentCount("TGC_DECODE_PARTS", splits, (T + 31) / 32, "a part per 32 keys of the cache");
  e.lowering.scratchFloats = {B * S * H * splits * (Dh + 2)};
  e.lowering.persistentFloats = {B * S * H}; // the blocks done, per (query, head)
  if (stream)
    e.uses("decode_stream.cuh");
  const int64_t blocks = B * S * H * splits;
  // The kernel's call: decodeAttentionStream<Bf16, B, H, Dh, T, Splits, Write, KV, Rope, S>, or
  // decodeAttention<Bf16, B, H, Dh, T, Keys, Splits, Write, Tiles, Early, KV, Rope, S>.
  std::string table = cacheRopeTable(op, e, T, Dh);
  bool rope = !table.empty();
  std::string tableArgument = rope ? ", table" : "", scale = lit(*a.getFloat("scale"));
  auto call = [&](bool writing, bool early, const std::string &caches, const std::string &outputs) {
    std::string shape = fmt::format("{}, {}, {}, {}, {}", boolText(hasBf16Gemms(a)), B, H, Dh, T);
    std::string flags = stream ? fmt::format("{}, {}, {}, {}, {}", splits, boolText(writing), heads.kvHeads,
                                             boolText(rope), S)
                               : fmt::format("{}, {}, {}, {}, {}, {}, {}, {}", keys, splits, boolText(writing),
                                             boolText(tiles && writing), boolText(early), heads.kvHeads,
                                             boolText(rope), S);
    return fmt::format("{}<{}, {}>(qkv, {}, positions, out, partial, done, {}, {}{})",
                       stream ? "decodeAttentionStream" : "decodeAttention", shape, flags, caches, scale, outputs,
                       tableArgument);
  };
  const int minBlocks = stream ? int(kStreamBlocksPerSM) : 0;
  if (!write) {
    e.launch(0,
             fmt::format("const float *qkv, const {0} *k, const {0} *v, const int *positions, float *out, "
                         "float *partial, unsigned *done{1}",
                         cache, table),
             blocks, call(false, false, "k, v", "(float *)nullptr, (float *)nullptr"), 128, minBlocks);
    return llvm::Error::success();
  }
  // fuse-kv-write's: the attention reads the caches it writes (kOut, vOut; typed Bf16Out where
  // stored in BF16), copied first where they are not written in place, as kv_write's.
  std::string params = fmt::format("const float *qkv, const {0} *k, const {0} *v, const int *positions, float *out, "
                                   "float *kOut, float *vOut, float *partial, unsigned *done{1}",
                                   cache, table);
  unsigned launch = copyCachesUnlessInPlace(op, e, params, 1);
  bool inPlace = launch == 0;
  const std::string caches = "readable(kOut), readable(vOut)";
  if (heads.grouped() && !tiles) {
    // Grouped heads write their rows only through tiles (decode.cuh): here kv_write's launch,
    // then the attention over the caches it wrote.
    e.launch(launch, params, elementwiseBlocks(B * heads.kvHeads * Dh),
             fmt::format("kvWriteRows<{}, 1, {}, {}, true, {}, {}{}>(qkv, positions, kOut, vOut{})", B, T,
                         heads.kvHeads * Dh, boolText(hasBf16Gemms(a)), D, rope ? fmt::format(", {}", Dh) : "",
                         tableArgument));
    e.launch(launch + 1, params, blocks, call(false, false, caches, "(float *)nullptr, (float *)nullptr"), 128,
             minBlocks);
    return llvm::Error::success();
  }
  const Op *positions = op.operand(3)->def();
  bool early = tiles && e.program_.programmatic && inPlace && positions && positions->kind() == OpKind::Input;
  e.launch(launch, params, blocks, call(true, early, caches, "kOut, vOut"), 128, minBlocks);
  if (early)
    e.awaitsItself();
  return llvm::Error::success();
}

} // namespace

/// Generation's ops (decode.cuh): the KV-cache writes, the attention over the cache, argmax.
llvm::Error emitDecode(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  e.uses("decode.cuh");
  if (op.kind() == OpKind::Argmax || op.kind() == OpKind::Sample) {
    // Parts of 2048 elements a block (a vocabulary of 50k: 25 blocks a row), then a combine;
    // sample (sample.cuh) draws from the parts and the logits (emitSample).
    constexpr int64_t kChunk = 2048;
    int64_t n = operandType(op, 0).dim(-1), rows = operandType(op, 0).numElements() / n, chunks = (n + kChunk - 1) / kChunk;
    e.lowering.scratchFloats = {2 * rows * chunks};
    if (op.kind() == OpKind::Argmax) {
      e.launch(0, "const float *x, int *out, float *scratch", rows * chunks,
               fmt::format("argmaxParts<{}, {}>(x, scratch)", n, kChunk));
      e.launch(1, "const float *x, int *out, float *scratch", rows,
               fmt::format("argmaxCombine<{}, {}>(scratch, out)", n, kChunk), 32);
      return llvm::Error::success();
    }
    e.uses("sample.cuh");
    return emitSample(op, e, n, rows, kChunk);
  }
  // qkv's rows: the queries' Q, then the keys' and the values' D, a cache row's width (Q = D but
  // under grouped-query attention).
  if (op.kind() == OpKind::KvWrite) {
    const TensorType &cache = outputType(op), &qkv = operandType(op, 2);
    int64_t B = cache.dim(0), T = cache.dim(1), D = cache.dim(2), S = qkv.dim(1), Q = qkv.dim(2) - 2 * D;
    bool positioned = op.numOperands() > 3, rope = a.has("rope_theta");
    int64_t Dh = rope ? D / *a.getInt("kv_heads") : 0;
    // qkv as stored: fp32, or BF16 where cuDNN's attention reads its rows in place.
    std::string params = fmt::format("const float *k, const float *v, {} *qkv, {}float *kOut, float *vOut",
                                     e.inputType(op.operand(2)), positioned ? "const int *positions, " : "");
    params += cacheRopeTable(op, e, T, Dh);
    unsigned launch = copyCachesUnlessInPlace(op, e, params, 0);
    e.launch(launch, params, elementwiseBlocks(B * S * D),
             fmt::format("kvWriteRows<{}, {}, {}, {}, {}, {}{}{}>(qkv, {}, kOut, vOut{})", B, S, T, D, boolText(positioned),
                         boolText(hasBf16Gemms(a)), Q != D || rope ? fmt::format(", {}", Q) : "",
                         rope ? fmt::format(", {}", Dh) : "", positioned ? "positions" : "nullptr",
                         rope ? ", table" : ""));
    return llvm::Error::success();
  }
  return emitDecodeAttention(op, e);
}

} // namespace tgc
