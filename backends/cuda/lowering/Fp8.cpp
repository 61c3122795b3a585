// The FP8 family (fp8.cuh): quantize (with its cast-transpose, GELU and bias-gradient forms) and
// the delayed-scaling update.
#include "backends/cuda/lowering/Families.h"
#include "support/Error.h"

#include <cmath>
#include <fmt/format.h>

namespace tgc {

namespace {

/// A cast-transpose's blocks: they take tiles in turn, four blocks a multiprocessor (its launch
/// bounds keep them all resident), as few as take the most tiles any block takes.
int64_t castTransposeBlocks(const Emitter &e, int64_t tiles) {
  int64_t resident = 4 * int64_t(e.program_.multiprocessors), most = (tiles + resident - 1) / resident;
  return std::max<int64_t>(1, (tiles + most - 1) / most);
}

/// SwiGLU's gradient of an F that is a multiple of 64 (fc1's FP8 output gradient): the
/// cast-transpose whose blocks take a gate tile and its up tile together
/// (quantizeTransposeSwigluGradient), over the gate half's tiles.
void emitSwigluGradientCastTranspose(Emitter &e, unsigned launch, const std::string &params, int64_t rows, int64_t f,
                                     bool current, const std::string &scaling, const std::string &format) {
  int64_t tilesC = f / 64, tiles = (rows + 63) / 64 * tilesC, blocks = castTransposeBlocks(e, tiles);
  e.launch(launch, params, blocks,
           fmt::format("quantizeTransposeSwigluGradient<{}, {}, {}, {}, {}, {}, {}>(x, h, scale, q, qT, scaleInv, "
                       "amax, saturations, used, {})",
                       rows, f, tiles, tilesC, blocks, format, boolText(current), scaling),
           128, 4); // fp8.cuh's kQuantizeTransposeThreads
}

/// What a quantize kernel converts, as fp8.cuh's source of its values: x, or x through the
/// activation or gradient the quantize applies as it reads (f: SwiGLU's F).
std::string quantizeSource(QuantizeActivation activation, int64_t rows, int64_t cols, int64_t f) {
  switch (activation) {
  case QuantizeActivation::Gelu:
    return "quantizeGelu(x)";
  case QuantizeActivation::GeluBackward:
    return "quantizeGeluGradient(x, h)";
  case QuantizeActivation::Swiglu:
    return fmt::format("quantizeSwiglu<{}>(x)", f);
  case QuantizeActivation::SwigluBackward:
    return fmt::format("quantizeSwigluGradient<{}>(x, h)", f);
  case QuantizeActivation::CrossEntropyBackward:
    return fmt::format("quantizeCrossEntropyGradient<{}, {}>(x, lse, targets, dloss)", cols, rows);
  case QuantizeActivation::None:
    break;
  }
  return "quantizeX(x)";
}

/// q's argument of a cast-transpose's kernel: null where nothing reads q, only the transpose
/// (requantize-transposes' and fp8-weights' copies in the backward), which then writes q_t alone.
std::string rowsArgument(const Op &op, const Emitter &e) {
  return e.program_.transposeOnly.count(&op) ? "(unsigned char *)nullptr" : "q";
}

/// The loss's gradient cast's first launches (activation="cross_entropy_backward"): each row's
/// loss and log-sum-exp (one block a row), then the mean of the losses; returns the next
/// launch's index.
int emitLossLaunches(Emitter &e, const std::string &params, int64_t rows, int64_t cols) {
  e.uses("loss.cuh");
  e.rowwise(0, params, rows, fmt::format("crossEntropyRowsAndLse<{}>(x, targets, rowLosses, lse)", cols));
  e.launch(1, params, 1, fmt::format("crossEntropyMean<{}>(loss, rowLosses)", rows));
  e.lowering.scratchFloats.push_back(2 * rows); // the rows' losses, in doubles
  e.lowering.scratchFloats.push_back(rows);
  return 2;
}

/// A cast's bias gradient (bias_grad), launch `index`: the tile rows' column sums (partials,
/// doubles, [tilesR][cols], the op's scratch) added into dbias, as both casts leave them.
void emitColumnTotals(Emitter &e, int index, const std::string &params, int64_t cols, int64_t tilesR) {
  e.uses("reduce.cuh");
  e.launch(index, params, columnTotalBlocks(cols), fmt::format("columnSumTotals<{}, {}>(dbias, partials)", cols, tilesR));
  e.lowering.scratchFloats.push_back(2 * tilesR * cols);
}

/// quantize {scaling="block"} (fp8.cuh's quantizeBlockScaled): blocks of 256 threads taking
/// 128 x 128 tiles in turn, two a multiprocessor (their registers allow as many), and the
/// tiles' scales in persistent buffers after the op's totals (the read-back and the GEMMs read
/// them). x may be read through its GELU or SwiGLU, or their gradients (fuse-gelu-quantize);
/// with bias_grad the cast sums each tile's columns and a launch after adds the tile rows'
/// (as the per-tensor cast-transpose); the loss's gradient (fuse-cross-entropy-quantize) as the
/// per-tensor cast makes it: each row's loss and log-sum-exp and the mean loss first, then the
/// cast reads the logits through the softmax's gradient.
llvm::Error emitBlockQuantize(const Op &op, Emitter &e, const QuantizeOptions &options, int64_t rows, int64_t cols,
                              const std::string &source) {
  bool loss = options.activation == QuantizeActivation::CrossEntropyBackward; // (transposed: emitFp8 checks)
  bool transpose = options.transpose, gradient = readsHidden(options.activation), biasGrad = options.biasGrad;
  int64_t tilesR = (rows + 127) / 128, tiles = tilesR * (cols / 128);
  int64_t blocks = std::min<int64_t>(tiles, 2 * int64_t(e.program_.multiprocessors));
  std::string params = fmt::format("{} *x, const float *scale, const float *scaleInv, {}unsigned char *q, float *amax, "
                                   "float *saturations, {}{}float *used, float *scales{}",
                                   e.inputType(op.operand(0)),
                                   gradient ? fmt::format("{} *h, ", e.inputType(op.operand(3)))
                                   : loss   ? "const int *targets, const float *dloss, "
                                            : "",
                                   transpose ? "unsigned char *qT, " : "",
                                   biasGrad ? "float *dbias, float *partials, "
                                   : loss   ? "float *loss, float *rowLosses, float *lse, "
                                            : "",
                                   transpose ? ", float *scalesT" : "");
  int next = loss ? emitLossLaunches(e, params, rows, cols) : 0;
  e.launch(next++, params, blocks,
           fmt::format("quantizeBlockScaled<{}, {}, {}, {}, {}, {}, {}>({}, scaleInv, {}, {}, amax, saturations, used, "
                       "scales, {}, {}{})",
                       rows, cols, options.blockRows, blocks, fp8Interpretation(op.attrs()), boolText(transpose),
                       boolText(biasGrad), source, rowsArgument(op, e), transpose ? "qT" : "nullptr",
                       transpose ? "scalesT" : "nullptr", lit(fp8Largest(op.attrs())), biasGrad ? ", partials" : ""),
           256, 2); // fp8.cuh's kBlockCastThreads; its registers (a tile's 64 values a thread) allow two a multiprocessor
  if (biasGrad)
    emitColumnTotals(e, next++, params, cols, tilesR);
  e.lowering.persistentFloats.push_back(6); // fp8.cuh's kQuantizeUsedFloats
  e.lowering.persistentFloats.push_back(blockScaleCount(rows, cols, options.blockRows));
  if (transpose) // q^T: [cols, rows]
    e.lowering.persistentFloats.push_back(blockScaleCount(cols, rows, options.blockRows));
  return llvm::Error::success();
}

} // namespace

std::pair<int64_t, int64_t> castBlocks(int64_t count) {
  int64_t blocks = std::max<int64_t>(1, (count + 4095) / 4096), perBlock = (count + blocks - 1) / blocks;
  if (count % 4 == 0) // the kernels then move four at a time
    perBlock = (perBlock + 3) / 4 * 4;
  return {blocks, perBlock};
}

/// FP8 quantization and the delayed-scaling update (fp8.cuh).
llvm::Error emitFp8(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  e.uses("fp8.cuh");
  if (op.kind() == OpKind::Quantize) {
    // Each block converts a contiguous range of 4096 elements (with transpose=true: 64 x 64
    // tiles in turn, writing q and its transpose) and adds its amax and saturation count into
    // the op's totals (its persistent floats, after used[0]); the last block to finish writes
    // the tensor's, and the scale_inv used, kept for the GEMMs that read the bytes (used[0]). Under
    // current scaling a launch before them takes the tensor's amax, and each block scales by it.
    // x (and h) are read in BF16 where they are stored so. activation="gelu" applies the GELU as
    // it reads x (fc1's pre-activation); "gelu_backward" reads the GELU's gradient x and h, and
    // with bias_grad sums the columns of gelu_backward(x, h) (a launch after adds the tile
    // rows' sums). "cross_entropy_backward" reads logits x: two launches before take each row's
    // loss and log-sum-exp and the mean loss, and the cast-transpose makes the gradient.
    // The elements quantized: q's (SwiGLU's are half of h's; its gradient's, h's).
    int64_t count = outputType(op).numElements();
    QuantizeOptions options = quantizeOptions(a);
    bool transpose = options.transpose, current = options.currentScaling, biasGrad = options.biasGrad;
    bool gradient = readsHidden(options.activation);
    bool swiglu = options.activation == QuantizeActivation::Swiglu || options.activation == QuantizeActivation::SwigluBackward;
    bool loss = options.activation == QuantizeActivation::CrossEntropyBackward;
    int64_t cols = outputType(op).dim(-1), rows = cols ? count / cols : 0;
    int64_t f = options.activation == QuantizeActivation::Swiglu ? cols : cols / 2; // SwiGLU's F
    if (swiglu && f % 4) // (four elements of a half at a time)
      return makeError("quantize {{activation=\"{}\"}} %{}: the GPU's needs SwiGLU's F a multiple of 4, got {}",
                       activationName(options.activation), op.result()->name().c_str(), (long long)f);
    std::string source = quantizeSource(options.activation, rows, cols, f);
    if (loss && !transpose)
      return makeError("quantize {{activation=\"cross_entropy_backward\"}} %{}: the GPU makes the loss's "
                       "gradient in its cast-transpose only (transpose=true)",
                       op.result()->name().c_str());
    if (options.blockScaling)
      return emitBlockQuantize(op, e, options, rows, cols, source);
    int64_t tilesC = (cols + 63) / 64, tilesR = (rows + 63) / 64, tiles = tilesR * tilesC;
    if (transpose && (rows % 16 || cols % 16))
      return makeError("quantize {{transpose=true}} %{}: the GPU's cast-transpose needs both sides "
                       "multiples of 16, got [{}, {}]",
                       op.result()->name().c_str(), (long long)rows, (long long)cols);
    if (biasGrad && !transpose)
      return makeError("quantize {{bias_grad=true}} %{}: the GPU sums the columns in its "
                       "cast-transpose only (transpose=true)",
                       op.result()->name().c_str());
    // A cast-transpose's blocks as castTransposeBlocks; without transpose, castBlocks's.
    auto [blocks, perBlock] = castBlocks(count);
    if (transpose) {
      blocks = castTransposeBlocks(e, tiles);
      perBlock = (count + blocks - 1) / blocks;
      if (count % 4 == 0)
        perBlock = (perBlock + 3) / 4 * 4;
    }
    std::string params = fmt::format("{} *x, const float *scale, const float *scaleInv, {}unsigned char *q, "
                                     "float *amax, float *saturations, {}{}{}float *used",
                                     e.inputType(op.operand(0)),
                                     gradient ? fmt::format("{} *h, ", e.inputType(op.operand(3)))
                                     : loss   ? "const int *targets, const float *dloss, "
                                              : "",
                                     transpose ? "unsigned char *qT, " : "",
                                     biasGrad ? "float *dbias, " : loss ? "float *loss, " : "",
                                     biasGrad ? "float *partials, " : loss ? "float *rowLosses, float *lse, " : "");
    // The largest finite value, then current scaling's margin scale (1 under delayed scaling,
    // written where the partials follow it).
    std::string largest = lit(fp8Largest(a));
    std::string scaling = current    ? fmt::format("{}, {}", largest, fp8MarginScale(a))
                          : biasGrad ? largest + ", 1.0f"
                                     : largest;
    int next = loss ? emitLossLaunches(e, params, rows, cols) : 0;
    if (current)
      e.launch(next++, params, blocks,
               fmt::format("quantizeAmaxBlocks<{}, {}>({}, used)", count, perBlock, source));
    if (transpose && options.activation == QuantizeActivation::SwigluBackward && f % 64 == 0 && !biasGrad)
      emitSwigluGradientCastTranspose(e, next++, params, rows, f, current, scaling, fp8Interpretation(a));
    else if (transpose)
      e.launch(next++, params, blocks,
               fmt::format("quantizeTransposeBlocks<{}, {}, {}, {}, {}, {}, {}, {}>({}, scale, {}, qT, scaleInv, amax, "
                           "saturations, used, {}{})",
                           rows, cols, tiles, tilesC, blocks, fp8Interpretation(a), boolText(current),
                           boolText(biasGrad), source, rowsArgument(op, e), scaling, biasGrad ? ", partials" : ""),
               128, 4); // fp8.cuh's kQuantizeTransposeThreads
    else
      e.launch(next++, params, blocks,
               fmt::format("quantizeBlocks<{}, {}, {}, {}, {}>({}, scale, q, scaleInv, amax, saturations, used, {})",
                           count, perBlock, blocks, fp8Interpretation(a), boolText(current), source, scaling));
    if (biasGrad)
      emitColumnTotals(e, next++, params, cols, tilesR);
    e.lowering.persistentFloats.push_back(6); // fp8.cuh's kQuantizeUsedFloats
    return llvm::Error::success();
  }
  if (op.kind() == OpKind::Fp8Update) {
    e.launch(0, fp8UpdateParams(op, ""), 1, fp8UpdateCall(op, ""), 256); // kFp8UpdateThreads
    return llvm::Error::success();
  }
  return unsupported(op);
}

} // namespace tgc
