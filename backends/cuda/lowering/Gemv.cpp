// The few-row product family (gemv.cuh): GEMVs on the CUDA cores or tensor cores, and the
// residual norm fused into the GEMV that reads it.
#include "backends/cuda/lowering/Families.h"
#include "ir/Gemv.h"

#include <fmt/format.h>

#include <optional>

namespace tgc {

namespace {

/// gemmRowsBf16's slices of K (gemv.cuh): 8 (a block of 8 columns), fewer where K has no 8
/// whole steps of 32. (Blocks of 16 columns, which read the rows of x half as often, ran slower:
/// fewer blocks stream the weight. BENCHMARKS.md, session 13.)
int rowsKSplit(int64_t K) {
  int kSplit = 8;
  while (K % (32 * kSplit))
    kSplit /= 2;
  return kSplit;
}

/// gemvBf16Rows's tile (gemv.cuh): C columns a warp, K split over KS of the block's 8 warps.
/// Measured at gpt-1.3b's and gpt2-124m's decode shapes, one row (tests/bench/gemv_decode.cu,
/// BENCHMARKS.md session 41): a plain product streams best split into slices of K that are
/// whole 512-byte warp loads, a lane holding at most 4 of them and the grid 1024 blocks or more
/// (gpt-1.3b's 24 layers of products: 1093 -> 1011 us on an H100); a fused norm repeats the
/// row's normalisation in every block, so there K stays whole and a warp takes up to 4 columns
/// while a lane holds at most 8 loads (gpt2-124m's qkv and fc1 1.5x). Registers bound the rest:
/// a lane's sums (C * Rows * M).
struct GemvTile {
  int columns = 1, kSplit = 1; // C, KS
};
GemvTile gemvTile(int64_t M, int64_t N, int64_t K, bool normed, bool swiglu) {
  const int64_t rows = swiglu ? 2 : 1, kMinBlocks = 1024;
  GemvTile tile;
  if (!normed)
    for (int kSplit : {8, 4, 2})
      if (K % (256 * kSplit) == 0) {
        tile.kSplit = kSplit;
        break;
      }
  const int64_t loads = (K / tile.kSplit + 255) / 256, maxLoads = normed ? 8 : 4;
  for (int columns : {4, 2}) {
    int64_t blocks = (N + 8 / tile.kSplit * columns - 1) / (8 / tile.kSplit * columns);
    if (columns * rows * loads <= maxLoads && columns * rows * M <= 16 && (normed || blocks >= kMinBlocks)) {
      tile.columns = columns;
      break;
    }
  }
  return tile;
}

/// 2 to 8 rows run on tensor cores (gemmRowsBf16, its m16 tile partly empty) where its shape
/// allows: on the CUDA cores each weight costs M multiply-adds and the rows' loads, which at 8
/// rows bound the step (gpt-1.3b's decode at batch 8 on an H100: 4.47 ms a step on the CUDA
/// cores, 3.61 on tensor cores; BENCHMARKS.md session 41). SwiGLU's paired rows stay on the
/// CUDA cores, and so do heads wider than the tensor-core kernel takes.
bool gemvOnTensorCores(int64_t M, int64_t N, int64_t K, bool swiglu) {
  return M >= 2 && !swiglu && K % 32 == 0 && N <= kMaxTensorColumns;
}

int64_t gemvBlocks(int64_t N, GemvTile tile) {
  int64_t columns = 8 / tile.kSplit * tile.columns;
  return (N + columns - 1) / columns;
}

/// A one-row normalising GEMV's grid of one wave (gemvBf16RowsStrided): where tiles of 4 columns
/// in 2 slices of K (4 loads a lane, two tiles in flight) come to two waves of 4 blocks an SM or
/// more, 4 blocks an SM take them in turn: fewer blocks repeat the norm, and each loads its next
/// tile while it multiplies. gpt-1.3b's qkv and fc1 on an H100: 11.1 -> 10.4 and 14.5 -> 13.5 us
/// (tests/bench/gemv_waves.cu, BENCHMARKS.md session 52). gpt2-124m's (576 and 768 such tiles)
/// keep a block a tile: the wave gained nothing there.
constexpr int kStridedBlocksPerSm = 4;
constexpr GemvTile kStridedNormTile{1, 2};
std::optional<int64_t> stridedNormGemvBlocks(int64_t M, int64_t N, int64_t K, bool swiglu, int multiprocessors) {
  const GemvTile tile = kStridedNormTile;
  const int64_t wave = int64_t(kStridedBlocksPerSm) * multiprocessors;
  if (M != 1 || swiglu || K % (256 * tile.kSplit) || K / tile.kSplit > 4 * 256 || gemvBlocks(N, tile) < 2 * wave)
    return std::nullopt;
  return wave;
}

/// A one-row plain product of long K (gpt-1.3b's fc2, K 8192) likewise, its tiles of 2 columns in
/// 4 slices of K (8 loads a lane), where they come to 1.5 waves or more: 12.06 -> 11.41-11.94 us
/// on an H100 (gemv_waves.cu), gpt-1.3b's batch-1 step 1.243 -> 1.227 ms. Shorter K (the
/// projections, gpt2-124m's fc2) streamed slower in one wave.
constexpr GemvTile kStridedLongTile{1, 4};
std::optional<int64_t> stridedLongGemvBlocks(int64_t M, int64_t N, int64_t K, int multiprocessors) {
  const GemvTile tile = kStridedLongTile;
  const int64_t wave = int64_t(kStridedBlocksPerSm) * multiprocessors;
  if (M != 1 || K % (256 * tile.kSplit) || K / tile.kSplit <= 4 * 256 || K / tile.kSplit > 8 * 256 ||
      2 * gemvBlocks(N, tile) < 3 * wave)
    return std::nullopt;
  return wave;
}

/// gemmRowsBf16's blocks: 64 / kSplit * columnTiles columns each.
int64_t rowsBlocks(int64_t N, int kSplit, int columnTiles = 1) {
  int64_t columns = 64 / kSplit * columnTiles;
  return (N + columns - 1) / columns;
}

/// gemmRowsBf16's column tiles a warp (CG) for 9 to 64 rows: a block reads all of x for its
/// columns, so more columns a block read x fewer times, while fewer blocks stream the weight.
/// Measured at gpt2-124m's and gpt-1.3b's shapes, 16-64 rows (tests/bench/gemm_rows.cu,
/// BENCHMARKS.md session 45): 4 tiles where that still leaves a block for every multiprocessor
/// (gpt-1.3b's qkv and fc1 at 32 rows, 1.2x); else 2 where K is at most N (gpt2-124m's qkv,
/// proj and fc1, 1.1-1.3x); else 1 (fc2's long K: fewer blocks left it slower). The block's
/// sums in shared memory bound row tiles times CG at 8 (32 KB).
int rowsColumnTiles(int64_t M, int64_t N, int64_t K, int kSplit, int multiprocessors) {
  const int64_t rowTiles = (M + 15) / 16;
  if (rowTiles * 4 <= 8 && rowsBlocks(N, kSplit, 4) >= multiprocessors)
    return 4;
  if (rowTiles * 2 <= 8 && K <= N)
    return 2;
  return 1;
}

} // namespace

/// A product of few rows against a weight (gemv.cuh): one row (and up to 8 that the tensor-core
/// kernel does not take) on the CUDA cores in gemvTile's tile, 2 to 64 on tensor cores;
/// matmul_bias_gelu (fuse-gemv-gelu) applies the GELU as it writes.
llvm::Error emitGemv(const Op &op, Emitter &e) {
  const TensorType &w = operandType(op, 1);
  int64_t N = w.dim(0), K = w.dim(1), M = operandType(op, 0).numElements() / K;
  bool bias = op.kind() != OpKind::MatMul, gelu = op.kind() == OpKind::MatMulBiasGelu;
  bool xBf16 = e.program_.bf16Stored.count(op.operand(0));
  e.uses("gemv.cuh");
  e.lowering.bf16Weights = {1};
  std::string params = fmt::format("const {} *x, const unsigned short *w, {}float *out{}", xBf16 ? "unsigned short" : "float",
                                   bias ? "const float *bias, " : "", gelu ? ", float *pre" : "");
  std::string args = fmt::format("x, w, {}, out, {}", bias ? "bias" : "nullptr", gelu ? "pre" : "nullptr");
  if (fewRows(op) == FewRows::Gemv && !gemvOnTensorCores(M, N, K, false)) {
    std::optional<int64_t> strided = stridedLongGemvBlocks(M, N, K, e.program_.multiprocessors);
    GemvTile tile = strided ? kStridedLongTile : gemvTile(M, N, K, /*normed=*/false, /*swiglu=*/false);
    e.launch(0, params, strided ? *strided : gemvBlocks(N, tile),
             fmt::format("gemvBf16{}<{}, {}, {}, {}, {}, {}, {}>({})", strided ? "Strided" : "", M, N, K, tile.columns,
                         tile.kSplit, boolText(bias), boolText(gelu), args),
             kThreads, strided ? kStridedBlocksPerSm : 0);
  } else {
    // 2 to 8 rows keep one tile a warp (their x is small); 9 to 64 take rowsColumnTiles'.
    int kSplit = rowsKSplit(K), tiles = M > 8 ? rowsColumnTiles(M, N, K, kSplit, e.program_.multiprocessors) : 1;
    e.launch(0, params, rowsBlocks(N, kSplit, tiles),
             fmt::format("gemmRowsBf16<{}, {}, {}, {}, {}, {}{}>({})", M, N, K, kSplit, boolText(bias), boolText(gelu),
                         tiles > 1 ? fmt::format(", {}", tiles) : "", args));
  }
  e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

/// residual_norm_linear (fuse-residual-norm-gemv): a GEMV whose blocks normalise the rows they
/// read (gemv.cuh), with the GELU after the product where there is one.
llvm::Error emitResidualNormGemv(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  bool layer = isLayerNorm(a), bias = a.getBool("bias").value_or(false), gelu = a.getString(kActivation) == "gelu";
  bool swiglu = a.getString(kActivation) == "swiglu";
  unsigned weight = layer ? 4 : 3;
  const TensorType &w = operandType(op, weight);
  // (Under SwiGLU the outputs are half the weight's rows: gate and up, a warp each pair.)
  int64_t N = swiglu ? w.dim(0) / 2 : w.dim(0), K = w.dim(1), M = operandType(op, 0).numElements() / K;
  e.uses("gemv.cuh");
  // A parameter's weight is read from its BF16 copy. Another weight (a test's input) is first
  // rounded into BF16 scratch by launch 0.
  const Value *wv = op.operand(weight);
  bool param = wv->def() && wv->def()->kind() == OpKind::Param;
  if (param)
    e.lowering.bf16Weights = {weight};
  else
    e.lowering.scratchFloats = {(w.numElements() + 1) / 2};
  std::string params = fmt::format("const float *a, const float *b, const float *gamma, {}const {} *w, "
                                   "{}float *sum, float *out{}",
                                   layer ? "const float *beta, " : "", param ? "unsigned short" : "float",
                                   bias ? "const float *bias, " : "", param ? "" : ", float *scratch");
  unsigned launch = 0;
  if (!param)
    e.launch(launch++, params, elementwiseBlocks(w.numElements()),
             fmt::format("roundToBf16(w, (unsigned short *)scratch, {})", w.numElements()));
  int mmaKSplit = gemvOnTensorCores(M, N, K, swiglu) ? rowsKSplit(K) : 0;
  std::optional<int64_t> strided =
      mmaKSplit ? std::nullopt : stridedNormGemvBlocks(M, N, K, swiglu, e.program_.multiprocessors);
  GemvTile tile = mmaKSplit ? GemvTile{} : strided ? kStridedNormTile : gemvTile(M, N, K, /*normed=*/true, swiglu);
  int64_t blocks = mmaKSplit ? rowsBlocks(N, mmaKSplit) : strided ? *strided : gemvBlocks(N, tile);
  e.launch(launch, params, blocks,
           fmt::format("residualNormGemvBf16<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}{}>(a, b, gamma, {}, {}, {}, sum, "
                       "out, {})",
                       boolText(layer), M, N, K, tile.columns, tile.kSplit, boolText(bias), boolText(gelu),
                       boolText(swiglu), mmaKSplit, strided ? ", true" : "", layer ? "beta" : "nullptr",
                       param ? "w" : "(const unsigned short *)scratch", bias ? "bias" : "nullptr",
                       formatDouble(*a.getFloat("eps"))),
           kThreads, strided ? kStridedBlocksPerSm : 0);
  if (param)
    e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

} // namespace tgc
