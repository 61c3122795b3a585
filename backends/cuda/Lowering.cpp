#include "backends/cuda/Lowering.h"

#include "backends/cuda/KernelCalls.h"
#include "backends/cuda/MemoryPlan.h"
#include "ir/Attributes.h"
#include "ir/Fused.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <map>
#include <set>

namespace tgc {

namespace {

constexpr int64_t kChunk = 64; // rows per partial sum of a column reduction
/// Blocks of a column reduction's last launch: 32 columns a block (reduce.cuh's columnTotal).
int64_t columnTotalBlocks(int64_t columns) { return (columns + 31) / 32; }

/// A float constant as CUDA source: the literal of its float value.
std::string lit(double v) {
  float f = float(v);
  if (std::isinf(f))
    return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  return formatDouble(double(f)) + "f";
}

int64_t rowsOf(const TensorType &t) { return t.rank() ? t.numElements() / t.dim(-1) : 1; }

/// The C type a kernel reads and writes elements of `dtype` as: FP8 values are their bytes.
const char *cType(DType dtype) {
  if (isFp8(dtype))
    return "unsigned char";
  return dtype == DType::I32 ? "int" : "float";
}

const char *fp8Interpretation(const AttrMap &attrs) {
  return fp8FormatOf(attrs) == Fp8Format::E5M2 ? "__NV_E5M2" : "__NV_E4M3";
}
double fp8Largest(const AttrMap &attrs) { return fp8Max(fp8FormatOf(attrs)); }
/// 2^margin, which fp8_update and current scaling divide the scale by.
std::string fp8MarginScale(const AttrMap &attrs) { return lit(std::ldexp(1.0, int(*attrs.getInt("margin")))); }

const char *boolText(bool b) { return b ? "true" : "false"; }

/// Writes one op's kernels: a wrapper per launch that instantiates a kernel template of
/// backends/cuda/kernels with the op's shapes, and the launches the executor makes.
class Emitter {
public:
  Emitter(const Op &op, unsigned index, const CudaProgram &program)
      : op_(op), index_(index), program_(program) {}

  /// The kernel name for launch `i` of this op: k<index>_<op>[_<i>].
  std::string name(unsigned launch = 0) const {
    std::string n = fmt::format("k{}_{}", index_, op_.name().str());
    return launch ? n + "_" + std::to_string(launch) : n;
  }
  /// The parameter type of an operand the kernel reads as floats: fp32, or stored in BF16.
  const char *inputType(const Value *operand) const {
    return program_.bf16Stored.count(operand) ? "const unsigned short" : "const float";
  }
  /// `params` with the results stored in BF16 (after the operands, in order) as Bf16Out, and
  /// those with a BF16 copy as F32Bf16Out: the kernel templates take either as their output.
  std::string bf16Params(const std::string &params) const {
    llvm::SmallVector<llvm::StringRef, 16> list;
    llvm::StringRef(params).split(list, ", ");
    std::string typed;
    for (size_t k = 0; k < list.size(); ++k) {
      std::string param = list[k].str();
      size_t r = k - op_.numOperands();
      if (k >= op_.numOperands() && r < op_.numResults() && llvm::StringRef(param).starts_with("float *")) {
        const Value *result = op_.result(unsigned(r));
        if (program_.bf16Stored.count(result))
          param = "Bf16Out " + param.substr(7);
        else if (program_.bf16Shadowed.count(result))
          param = "F32Bf16Out " + param.substr(7);
      }
      typed += (k ? ", " : "") + param;
    }
    return typed;
  }
  /// Where result `r`'s pointer is in the list the launches take (the executor's order: the
  /// operands, each result followed by its BF16 copy's where it has one, the scratch buffers).
  unsigned resultPointer(unsigned r) const {
    unsigned p = op_.numOperands();
    for (unsigned k = 0; k < r; ++k)
      p += 1 + unsigned(program_.bf16Shadowed.count(op_.result(k)));
    return p;
  }
  unsigned scratchPointer(size_t k) const { return resultPointer(op_.numResults()) + unsigned(k); }
  /// A scratch buffer of `floats` after those already asked for; returns its pointer's place.
  unsigned addScratch(int64_t floats) {
    lowering.scratchFloats.push_back(floats);
    return scratchPointer(lowering.scratchFloats.size() - 1);
  }
  /// The parameter name of the scratch buffer at pointer place `pointer` (addScratch's), and the
  /// parameter list's tail that names them all.
  std::string scratchName(unsigned pointer) const { return fmt::format("scratch{}", pointer - scratchPointer(0)); }
  std::string scratchParams() const {
    std::string params;
    for (size_t k = 0; k < lowering.scratchFloats.size(); ++k)
      params += fmt::format(", float *scratch{}", k);
    return params;
  }
  /// The header (backends/cuda/kernels) whose templates this op's kernels call.
  void uses(const char *header) {
    headers.insert(header);
    lowering.header = header;
  }
  /// A launch of `blocks` blocks running `call`.
  void launch(unsigned index, const std::string &params, int64_t blocks, const std::string &call,
              int threads = kThreads, int minBlocks = 0) {
    std::string comment = "// " + (op_.numResults() ? "%" + op_.result()->name() + " = " : "") +
                          op_.name().str();
    kernels.push_back({comment, name(index), bf16Params(params), call + ";", threads, minBlocks});
    lowering.launches.push_back({name(index), blocks, threads});
  }
  /// The last launch's kernel awaits the kernel before it itself (KernelText::awaitsItself).
  void awaitsItself() { kernels.back().awaitsItself = true; }
  /// An elementwise launch over `count` elements.
  void elementwise(const std::string &params, int64_t count, const std::string &call) {
    launch(0, params, elementwiseBlocks(count), call);
  }
  /// Launch `index` with one block per row.
  void rowwise(unsigned index, const std::string &params, int64_t rows, const std::string &call) {
    launch(index, params, rows, call);
  }
  /// One block of one thread.
  void single(const std::string &params, const std::string &call) {
    launch(0, params, 1, call);
    lowering.launches.back().threads = 1;
  }

  const Op &op_;
  unsigned index_;
  const CudaProgram &program_;
  std::vector<KernelText> kernels; // one per launch
  std::set<std::string> headers;
  OpLowering lowering;
};

llvm::Error unsupported(const Op &op) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "error: %%%s = %s has no GPU lowering yet (the GPU backend runs gpuPipeline's programs)",
      op.numResults() ? op.result()->name().c_str() : "", op.name().str().c_str());
}

const TensorType &operandType(const Op &op, unsigned i) { return op.operand(i)->type(); }
const TensorType &outputType(const Op &op) {
  return op.numResults() ? op.result()->type() : op.operand(0)->type();
}

/// Elementwise ops (elementwise.cuh, embedding.cuh's lookup).
llvm::Error emitElementwise(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  int64_t n = outputType(op).numElements();
  e.uses(op.kind() == OpKind::Embedding ? "embedding.cuh" : "elementwise.cuh");
  switch (op.kind()) {
  case OpKind::Constant:
    e.elementwise("float *out", n, fmt::format("fill<{}>(out, {})", n, lit(*a.getFloat("value"))));
    break;
  case OpKind::Add:
  case OpKind::Mul:
    e.elementwise("const float *x, const float *y, float *out", n,
                  fmt::format("binary<{}, {}, {}>(x, y, out)", boolText(op.kind() == OpKind::Mul), n,
                              operandType(op, 1).numElements()));
    break;
  case OpKind::Scale:
    e.elementwise("const float *x, float *out", n,
                  fmt::format("scale<{}>(x, out, {})", n, lit(*a.getFloat("factor"))));
    break;
  case OpKind::Gelu:
    e.elementwise(std::string(e.inputType(op.operand(0))) + " *x, float *out", n, fmt::format("gelu<{}>(x, out)", n));
    break;
  case OpKind::Silu:
    e.elementwise("const float *x, float *out", n, fmt::format("silu<{}>(x, out)", n));
    break;
  case OpKind::GeluBackward:
    if (op.numResults() > 1) {
      // bias_grad: launch 0 writes dx and sums its columns over chunks of kChunk rows, as
      // reduce_to's first launch sums them (four columns a thread where they divide); launch 1
      // adds the chunks as reduce_to's second does: its bits.
      int64_t columns = outputType(op).dim(-1), rows = n / columns, chunks = (rows + kChunk - 1) / kChunk;
      int64_t per = columns % 4 == 0 ? 4 : 1, columnBlocks = (columns / per + kThreads - 1) / kThreads;
      e.uses("reduce.cuh");
      e.uses("elementwise.cuh"); // the op's header (the kernel-family tests)
      std::string params = fmt::format("const float *dy, {} *x, float *dx, float *dbias, float *scratch",
                                       e.inputType(op.operand(1)));
      e.launch(0, params, chunks * columnBlocks,
               fmt::format("geluBackwardColumnSums<{}, {}, {}, {}, {}>(dy, x, dx, scratch)", columns, rows, per,
                           columnBlocks, kChunk));
      e.launch(1, params, columnTotalBlocks(columns),
               fmt::format("columnSumTotals<{}, {}>(dbias, scratch)", columns, chunks));
      e.lowering.scratchFloats.push_back(2 * chunks * columns);
      break;
    }
    e.elementwise(fmt::format("const float *dy, {} *x, float *dx", e.inputType(op.operand(1))), n,
                  fmt::format("geluBackward<{}>(dy, x, dx)", n));
    break;
  case OpKind::SiluBackward:
    e.elementwise("const float *dy, const float *x, float *dx", n, fmt::format("siluBackward<{}>(dy, x, dx)", n));
    break;
  case OpKind::CausalMask:
    e.elementwise("const float *scores, float *out", n,
                  fmt::format("causalMask<{}, {}>(scores, out, {})", n, outputType(op).dim(-1),
                              lit(a.getFloat("fill").value_or(-HUGE_VAL))));
    break;
  case OpKind::Embedding:
    e.elementwise("const float *table, const int *ids, float *out", n,
                  fmt::format("embedding<{}, {}, {}>(table, ids, out)", n, operandType(op, 0).dim(0),
                              operandType(op, 0).dim(1)));
    break;
  default:
    return unsupported(op);
  }
  return llvm::Error::success();
}

/// Transposes, concatenation, slices and padding (layout.cuh).
llvm::Error emitLayout(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  const TensorType &out = outputType(op), &in = operandType(op, 0);
  int64_t n = out.numElements();
  e.uses("layout.cuh");
  if (op.kind() == OpKind::Transpose) {
    std::vector<int64_t> perm = *a.getInts("perm");
    const char *t = cType(in.dtype);
    std::string params = fmt::format("const {} *x, {} *out", t, t);
    bool swapsLastTwo = in.rank() >= 2;
    for (unsigned d = 0; d + 2 < in.rank(); ++d)
      swapsLastTwo &= perm[d] == int64_t(d);
    swapsLastTwo = swapsLastTwo && perm[in.rank() - 2] == int64_t(in.rank()) - 1;
    if (swapsLastTwo && isFp8(in.dtype) && in.dim(-2) % 16 == 0 && in.dim(-1) % 16 == 0) {
      int64_t rows = in.dim(-2), cols = in.dim(-1), batch = in.numElements() / (rows * cols);
      int64_t tilesR = (rows + 63) / 64, tilesC = (cols + 63) / 64;
      e.launch(0, params, batch * tilesR * tilesC,
               fmt::format("transposeBytes<{}, {}, {}, {}>(x, out)", rows, cols, tilesR * tilesC, tilesC));
      return llvm::Error::success();
    }
    if (swapsLastTwo) {
      int64_t rows = in.dim(-2), cols = in.dim(-1), batch = in.numElements() / (rows * cols);
      int64_t tilesR = (rows + 31) / 32, tilesC = (cols + 31) / 32;
      e.launch(0, params, batch * tilesR * tilesC,
               fmt::format("transposeLastTwo<{}, {}, {}, {}, {}>(x, out)", t, rows, cols, tilesR * tilesC, tilesC));
      return llvm::Error::success();
    }
    // out[o] = x[offset(o)]: each output dimension's extent and the input stride it walks.
    std::vector<int64_t> inStrides(in.rank(), 1);
    for (int i = int(in.rank()) - 2; i >= 0; --i)
      inStrides[i] = inStrides[i + 1] * in.shape[i + 1];
    std::string dims;
    for (unsigned d = 0; d < out.rank(); ++d)
      dims += fmt::format(", {}, {}", out.shape[d], inStrides[perm[d]]);
    e.elementwise(params, n, fmt::format("permute<{}, {}{}>(x, out)", t, n, dims));
    return llvm::Error::success();
  }
  int64_t axis = *a.getInt("axis"), inner = 1;
  for (unsigned i = axis + 1; i < out.rank(); ++i)
    inner *= out.shape[i];
  if (op.kind() == OpKind::Concat) {
    std::string params, extents, parts;
    for (unsigned k = 0; k < op.numOperands(); ++k) {
      params += fmt::format("const float *x{}, ", k);
      extents += fmt::format(", {}", operandType(op, k).shape[axis]);
      parts += fmt::format(", x{}", k);
    }
    e.elementwise(params + "float *out", n,
                  fmt::format("concat<{}, {}, {}{}>(out{})", n, inner, out.shape[axis], extents, parts));
    return llvm::Error::success();
  }
  const char *kernel = op.kind() == OpKind::Slice ? "slice" : "pad";
  e.elementwise("const float *x, float *out", n,
                fmt::format("{}<{}, {}, {}, {}, {}>(x, out)", kernel, n, inner, out.shape[axis], in.shape[axis],
                            *a.getInt("start")));
  return llvm::Error::success();
}

/// LayerNorm and RMSNorm, with the residual add before them, and their gradients (norms.cuh).
llvm::Error emitNorm(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  std::string eps = formatDouble(*a.getFloat("eps"));
  e.uses("norms.cuh");
  switch (op.kind()) {
  case OpKind::LayerNorm:
  case OpKind::RMSNorm: {
    bool layer = op.kind() == OpKind::LayerNorm;
    int64_t d = outputType(op).dim(-1);
    int64_t rows = rowsOf(outputType(op));
    e.launch(0, layer ? "const float *x, const float *gamma, const float *beta, float *out"
                      : "const float *x, const float *gamma, float *out",
             normBlocks(rows, d),
             fmt::format("layerNorm<{}, {}, {}>(x, gamma, {}, out, {})", boolText(layer), d, rows,
                         layer ? "beta" : "nullptr", eps));
    return llvm::Error::success();
  }
  case OpKind::ResidualNorm: {
    // A warp per row (a block where rows are wider than 1024): the residual sum (the stream goes
    // on) and its normalisation.
    bool layer = isLayerNorm(a);
    int64_t d = outputType(op).dim(-1), rows = rowsOf(outputType(op));
    // y in BF16 where its product writes it so (CudaProgram::bf16Rounding).
    std::string y = fmt::format("const float *x, {} *y, const float *gamma, ", e.inputType(op.operand(1)));
    e.launch(0, y + (layer ? "const float *beta, float *sum, float *normed" : "float *sum, float *normed"),
             normBlocks(rows, d),
             fmt::format("residualNorm<{}, {}, {}>(x, y, gamma, {}, sum, normed, {})", boolText(layer), d, rows,
                         layer ? "beta" : "nullptr", eps));
    return llvm::Error::success();
  }
  case OpKind::LayerNormBackward:
  case OpKind::RMSNormBackward: {
    // Launch 0, a warp per row (a block where rows are wider than 1024): the rows' statistics.
    // Launch 1, a thread per feature (four where they are a multiple of four) over chunks of
    // rows: dx, and each chunk's dgamma (and dbeta). Launch 2: the chunks in order.
    bool layer = op.kind() == OpKind::LayerNormBackward;
    const TensorType &x = operandType(op, 1);
    int64_t d = x.dim(-1), rows = rowsOf(x);
    // Chunks of 32 rows: blocks enough to fill the GPU at d 768 (a block spans up to 1024 features).
    constexpr int64_t kNormChunk = 32;
    int64_t chunks = (rows + kNormChunk - 1) / kNormChunk;
    int64_t perThread = d % 4 == 0 ? 4 : 1, columnBlocks = (d + kThreads * perThread - 1) / (kThreads * perThread);
    bool accumulate = op.numOperands() > 3; // the residual gradient dres, added to dx
    bool sums = op.numResults() > 3;        // dx_sums: dx's column sums too
    // dy in BF16 where its product writes it so (CudaProgram::bf16Rounding).
    std::string params = fmt::format("{} *dy, const float *x, const float *gamma, ", e.inputType(op.operand(0))) +
                         (accumulate ? "const float *dres, " : "") +
                         (layer ? "float *dx, float *dgamma, float *dbeta" : "float *dx, float *dgamma") +
                         (sums ? ", float *dsums" : "") + ", float *scratch";
    e.launch(0, params, normBlocks(rows, d),
             fmt::format("normBackwardStats<{}, {}, {}>(dy, x, gamma, scratch, {})", boolText(layer), d, rows, eps));
    e.launch(1, params, chunks * columnBlocks,
             fmt::format("normBackwardTile<{}, {}, {}, {}, {}>(dy, x, gamma, {}, dx, scratch)", d, rows, kNormChunk,
                         boolText(accumulate), boolText(sums), accumulate ? "dres" : "nullptr"));
    e.launch(2, params, columnTotalBlocks(d),
             fmt::format("normBackwardColumns<{}, {}, {}, {}, {}>(scratch, dgamma, {}, {})", boolText(layer), d, rows,
                         chunks, boolText(sums), layer ? "dbeta" : "(float *)nullptr",
                         sums ? "dsums" : "(float *)nullptr"));
    // Scratch: four doubles a row (its statistics), then two a feature for each chunk (three
    // with dx's sums).
    e.lowering.scratchFloats.push_back(8 * rows + (sums ? 6 : 4) * chunks * d);
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

/// Softmax, log-softmax and the causal softmax of scaled scores, and their gradients
/// (softmax.cuh).
llvm::Error emitSoftmax(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  const TensorType &out = outputType(op);
  int64_t d = out.dim(-1), rows = rowsOf(out);
  e.uses("softmax.cuh");
  switch (op.kind()) {
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
    e.rowwise(0, "const float *x, float *out", rows,
              fmt::format("softmax<{}, {}>(x, out)", boolText(op.kind() == OpKind::LogSoftmax), d));
    return llvm::Error::success();
  case OpKind::MaskedSoftmax:
    e.rowwise(0, "const float *x, float *out", rows,
              fmt::format("maskedSoftmax<{}>(x, out, {})", d, lit(*a.getFloat("scale"))));
    return llvm::Error::success();
  case OpKind::SoftmaxBackward:
  case OpKind::LogSoftmaxBackward:
  case OpKind::MaskedSoftmaxBackward: {
    bool masked = op.kind() == OpKind::MaskedSoftmaxBackward;
    e.rowwise(0, "const float *dy, const float *y, float *dx", rows,
              fmt::format("softmaxBackward<{}, {}, {}>(dy, y, dx, {})",
                          boolText(op.kind() == OpKind::LogSoftmaxBackward), boolText(masked), d,
                          masked ? lit(*a.getFloat("scale")) : "1.0f"));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

/// Cross-entropy and NLL loss, and their gradients (loss.cuh).
llvm::Error emitLoss(const Op &op, Emitter &e) {
  e.uses("loss.cuh");
  switch (op.kind()) {
  case OpKind::CrossEntropy: {
    // Launch 0, one block per row: the row's loss, logsumexp - logit[target], into scratch
    // (and with dloss, the row's gradient). Launch 1, one block: the mean over rows in row order.
    int64_t vocab = operandType(op, 0).dim(-1), rows = operandType(op, 1).numElements();
    // Logits a GEMM wrote in BF16 (CudaProgram::bf16Rounding), or fp32.
    std::string logitsType = e.inputType(op.operand(0));
    if (op.numOperands() > 2) {
      std::string params = logitsType + " *logits, const int *targets, const float *dloss, float *loss, "
                           "float *dlogits, float *scratch";
      e.rowwise(0, params, rows,
                fmt::format("crossEntropyRowsWithGradient<{}, {}>(logits, targets, dloss, dlogits, scratch)", vocab,
                            rows));
      e.launch(1, params, 1, fmt::format("crossEntropyMean<{}>(loss, scratch)", rows));
      e.lowering.scratchFloats.push_back(2 * rows);
      return llvm::Error::success();
    }
    std::string params = logitsType + " *logits, const int *targets, float *loss, float *scratch";
    e.rowwise(0, params, rows, fmt::format("crossEntropyRows<{}>(logits, targets, scratch)", vocab));
    e.launch(1, params, 1, fmt::format("crossEntropyMean<{}>(loss, scratch)", rows));
    e.lowering.scratchFloats.push_back(2 * rows);
    return llvm::Error::success();
  }
  case OpKind::CrossEntropyBackward: {
    int64_t vocab = outputType(op).dim(-1), rows = operandType(op, 2).numElements();
    e.rowwise(0, fmt::format("const float *dloss, {} *logits, const int *targets, float *dlogits",
                             e.inputType(op.operand(1))),
              rows,
              fmt::format("crossEntropyBackward<{}, {}>(dloss, logits, targets, dlogits)", vocab, rows));
    return llvm::Error::success();
  }
  case OpKind::NLLLoss:
    e.rowwise(0, "const float *logp, const int *targets, float *loss", 1,
              fmt::format("nllLoss<{}, {}>(logp, targets, loss)", operandType(op, 0).dim(-1),
                          operandType(op, 1).numElements()));
    return llvm::Error::success();
  case OpKind::NLLLossBackward: {
    int64_t n = outputType(op).numElements();
    e.elementwise("const float *dloss, const float *logp, const int *targets, float *dlogp", n,
                  fmt::format("nllLossBackward<{}, {}, {}>(dloss, logp, targets, dlogp)", outputType(op).dim(-1),
                              operandType(op, 2).numElements(), n));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

/// Column sums, sums of squares and the embedding's gradient (reduce.cuh, embedding.cuh).
llvm::Error emitReduction(const Op &op, Emitter &e) {
  switch (op.kind()) {
  case OpKind::ReduceTo: {
    // Partial sums over chunks of kChunk rows, then the chunks in order.
    int64_t period = outputType(op).numElements(), repeats = operandType(op, 0).numElements() / period;
    // A thread sums 4 adjacent columns where the period is a multiple of 4 (reduce.cuh).
    int64_t threads = period % 4 == 0 ? period / 4 : period;
    int64_t chunks = (repeats + kChunk - 1) / kChunk, columnBlocks = (threads + kThreads - 1) / kThreads;
    e.uses("reduce.cuh");
    // x stored in BF16: a gradient cuDNN's attention or a DGELU epilogue wrote (countReaders).
    std::string params = fmt::format("{} *x, float *out, float *scratch", e.inputType(op.operand(0)));
    e.launch(0, params, chunks * columnBlocks,
             fmt::format("columnSumPartials<{}, {}, {}, {}>(x, scratch)", period, repeats, columnBlocks, kChunk));
    e.launch(1, params, columnTotalBlocks(period),
             fmt::format("columnSumTotals<{}, {}>(out, scratch)", period, chunks));
    e.lowering.scratchFloats.push_back(2 * chunks * period);
    return llvm::Error::success();
  }
  case OpKind::SumSquares: {
    int64_t count = operandType(op, 0).numElements(), blocks = sumSquaresBlocks(count);
    e.uses("reduce.cuh");
    const char *params = "const float *x, float *out, float *scratch";
    e.launch(0, params, blocks,
             fmt::format("sumSquaresPartials<{}, {}>(x, scratch)", count, (count + blocks - 1) / blocks));
    e.launch(1, params, 1, fmt::format("sumSquaresTotal<{}>(out, scratch)", blocks));
    e.lowering.scratchFloats.push_back(2 * blocks);
    return llvm::Error::success();
  }
  case OpKind::EmbeddingBackward: {
    // Rows table rows a block: each block reads every id once for all of them.
    constexpr int64_t kRows = 64;
    int64_t vocab = outputType(op).dim(0), dim = outputType(op).dim(1);
    e.uses("embedding.cuh");
    e.launch(0, "const float *dy, const int *ids, float *dtable", (vocab + kRows - 1) / kRows,
             fmt::format("embeddingBackward<{}, {}, {}, {}>(dy, ids, dtable)", dim, operandType(op, 1).numElements(),
                         vocab, kRows));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
}

/// Clipping, the LR schedule and AdamW (optimizer.cuh).
llvm::Error emitOptimizer(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  e.uses("optimizer.cuh");
  switch (op.kind()) {
  case OpKind::ClipScale: {
    double maxNorm = *a.getFloat("max_norm");
    e.single("const float *sumSquares, float *clip",
             fmt::format("clipScale<{}>(sumSquares, clip, {})", boolText(maxNorm > 0), formatDouble(maxNorm)));
    return llvm::Error::success();
  }
  case OpKind::LRSchedule:
    e.lowering.constants = {*a.getFloat("lr"), *a.getFloat("min_lr"), double(*a.getInt("warmup")),
                            double(*a.getInt("steps"))};
    e.single("const int *step, float *lr, const double *schedule", "lrSchedule(step, lr, schedule)");
    return llvm::Error::success();
  case OpKind::AdamW: {
    int64_t n = outputType(op).numElements();
    e.elementwise(kAdamWParams, n, adamwCall(a, n, n, *a.getFloat("weight_decay")));
    return llvm::Error::success();
  }
  default:
    return unsupported(op);
  }
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
    // rows' sums).
    int64_t count = operandType(op, 0).numElements();
    bool transpose = a.getBool("transpose").value_or(false), current = a.getString("scaling") == "current";
    auto activation = a.getString("activation");
    bool gradient = activation == "gelu_backward", biasGrad = a.getBool("bias_grad").value_or(false);
    int64_t cols = operandType(op, 0).dim(-1), rows = cols ? count / cols : 0;
    int64_t tilesC = (cols + 63) / 64, tilesR = (rows + 63) / 64, tiles = tilesR * tilesC;
    if (transpose && (rows % 16 || cols % 16))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "quantize {transpose=true} %%%s: the GPU's cast-transpose needs both sides "
                                     "multiples of 16, got [%lld, %lld]",
                                     op.result()->name().c_str(), (long long)rows, (long long)cols);
    if (biasGrad && !transpose)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "quantize {bias_grad=true} %%%s: the GPU sums the columns in its "
                                     "cast-transpose only (transpose=true)",
                                     op.result()->name().c_str());
    // A cast-transpose's blocks take tiles in turn, four blocks a multiprocessor (its launch
    // bounds keep them all resident), as few as take the most tiles any block takes; without
    // transpose, a block a range of 4096 elements.
    int64_t resident = 4 * int64_t(e.program_.multiprocessors), most = (tiles + resident - 1) / resident;
    int64_t blocks = std::max<int64_t>(1, transpose ? (tiles + most - 1) / most : (count + 4095) / 4096);
    // (A multiple of 4 elements a block where the count is: the kernels then move four at a time.)
    int64_t perBlock = (count + blocks - 1) / blocks;
    if (count % 4 == 0)
      perBlock = (perBlock + 3) / 4 * 4;
    std::string params = fmt::format("{} *x, const float *scale, const float *scaleInv, {}unsigned char *q, "
                                     "float *amax, float *saturations, {}{}{}float *used",
                                     e.inputType(op.operand(0)),
                                     gradient ? fmt::format("{} *h, ", e.inputType(op.operand(3))) : "",
                                     transpose ? "unsigned char *qT, " : "", biasGrad ? "float *dbias, " : "",
                                     biasGrad ? "float *partials, " : "");
    std::string source = gradient               ? "quantizeGeluGradient(x, h)"
                         : activation == "gelu" ? "quantizeGelu(x)"
                                                : "quantizeX(x)";
    // The largest finite value, then current scaling's margin scale (1 under delayed scaling,
    // written where the partials follow it).
    std::string largest = lit(fp8Largest(a));
    std::string scaling = current    ? fmt::format("{}, {}", largest, fp8MarginScale(a))
                          : biasGrad ? largest + ", 1.0f"
                                     : largest;
    int next = 0;
    if (current)
      e.launch(next++, params, blocks,
               fmt::format("quantizeAmaxBlocks<{}, {}>({}, used)", count, perBlock, source));
    if (transpose)
      e.launch(next++, params, blocks,
               fmt::format("quantizeTransposeBlocks<{}, {}, {}, {}, {}, {}, {}, {}>({}, scale, q, qT, scaleInv, amax, "
                           "saturations, used, {}{})",
                           rows, cols, tiles, tilesC, blocks, fp8Interpretation(a), boolText(current),
                           boolText(biasGrad), source, scaling, biasGrad ? ", partials" : ""),
               128, 4); // fp8.cuh's kQuantizeTransposeThreads
    else
      e.launch(next++, params, blocks,
               fmt::format("quantizeBlocks<{}, {}, {}, {}, {}>({}, scale, q, scaleInv, amax, saturations, used, {})",
                           count, perBlock, blocks, fp8Interpretation(a), boolText(current), source, scaling));
    if (biasGrad) {
      e.uses("reduce.cuh");
      e.launch(next++, params, columnTotalBlocks(cols),
               fmt::format("columnSumTotals<{}, {}>(dbias, partials)", cols, tilesR));
      e.lowering.scratchFloats.push_back(2 * tilesR * cols);
    }
    e.lowering.persistentFloats.push_back(5); // fp8.cuh's kQuantizeUsedFloats
    return llvm::Error::success();
  }
  if (op.kind() == OpKind::Fp8Update) {
    e.launch(0, "const float *history, const float *scale, const float *amax, const float *saturations, "
             "const float *saturated, float *newHistory, float *newScale, float *newScaleInv, "
             "float *newSaturations",
             1,
             fmt::format("fp8Update<{}, {}>(history, scale, amax, saturations, saturated, newHistory, newScale, "
                         "newScaleInv, newSaturations, {}, {})",
                         operandType(op, 0).numElements(), boolText(a.getString("algo") != "most_recent"),
                         lit(fp8Largest(a)), fp8MarginScale(a)),
             256); // kFp8UpdateThreads
    return llvm::Error::success();
  }
  return unsupported(op);
}

/// The gradient's first launch: sum(dout * out) per query (attentionDelta), eight threads a row.
void emitAttentionDelta(Emitter &e, unsigned launch, const std::string &params, bool round, int64_t B, int64_t T,
                        int64_t H, int64_t Dh) {
  e.launch(launch, params, (B * T * H * 8 + kThreads - 1) / kThreads,
           fmt::format("attentionDelta<{}, {}, {}, {}, {}>(dout, out, delta)", boolText(round), B, T, H, Dh));
}

/// Launch `launch`: `from` ([B, T, parts * H * Dh] floats) rounded to BF16 head-major into `to`
/// (toHeadsBf16): q, k and v for the attention's tensor-core kernels and cuDNN's, or dout.
void emitToHeads(Emitter &e, unsigned launch, const std::string &params, int64_t B, int64_t T, int64_t H,
                 int64_t Dh, int parts, const std::string &from, const std::string &to) {
  e.launch(launch, params, elementwiseBlocks(B * T * parts * H * Dh / 4),
           fmt::format("toHeadsBf16<{}, {}, {}, {}, {}>({}, (unsigned short *){})", B, T, parts, H, Dh, from, to));
}

/// The tensor-core attention: the operands first rounded to BF16 in head-major order
/// (toHeadsBf16, into scratch, or with head_major into the forward's third result, which the
/// gradient then reads), then the forward; or the gradient's kernels (sum(dout * out) per query,
/// dk and dv by key tiles, dq by query tiles). Blocks of 64 rows, four warps of 16.
llvm::Error emitAttentionBf16(const Op &op, Emitter &e, int64_t B, int64_t T, int64_t H, int64_t Dh,
                              const std::string &scale) {
  int64_t D = H * Dh, blocks = (T + 63) / 64 * B * H;
  std::string shape = fmt::format("{}, {}, {}, {}", B, T, H, Dh);
  auto toHeads = [&](unsigned launch, const std::string &params, const char *from, const char *to, int parts) {
    emitToHeads(e, launch, params, B, T, H, Dh, parts, from, to);
  };
  bool headMajor = isHeadMajor(op.attrs()); // keep-attention-heads: the copy is a result, or an operand
  int64_t copyFloats = 3 * B * T * D / 2;     // the BF16 q, k, v
  if (op.kind() == OpKind::Attention) {
    // heads: a result stored in BF16 (chooseBf16Heads: a Bf16Out), or scratch.
    const char *params = "const float *qkv, float *out, float *lse, float *heads";
    const char *heads = headMajor ? "heads.p" : "heads";
    if (!headMajor)
      e.lowering.scratchFloats = {copyFloats};
    toHeads(0, params, "qkv", heads, 3);
    e.launch(1, params, blocks,
             fmt::format("attentionForwardBf16<{}>((const unsigned short *){}, out, lse, {})", shape, heads, scale),
             128);
    return llvm::Error::success();
  }
  // With the head-major copy as the operand (in qkv's place), launch 0 (qkv's conversion) is not
  // emitted and the copy needs no scratch; the others keep their numbers.
  e.lowering.scratchFloats = {B * T * D / 2, B * H * T};
  if (!headMajor)
    e.lowering.scratchFloats.insert(e.lowering.scratchFloats.begin(), copyFloats);
  const char *params = headMajor ? "const float *dout, const float *heads, const float *out, const float *lse, "
                                   "float *dqkv, float *doutHeads, float *delta"
                                 : "const float *dout, const float *qkv, const float *out, const float *lse, "
                                   "float *dqkv, float *heads, float *doutHeads, float *delta";
  std::string operands = "(const unsigned short *)doutHeads, (const unsigned short *)heads";
  if (!headMajor)
    toHeads(0, params, "qkv", "heads", 3);
  toHeads(1, params, "dout", "doutHeads", 1);
  emitAttentionDelta(e, 2, params, true, B, T, H, Dh);
  // Three blocks an SM at head dimension 64 (168 registers, from 173, with no spills).
  e.launch(3, params, blocks,
           fmt::format("attentionKeyValueGradBf16<{}>({}, dqkv, {}, lse, delta)", shape, operands, scale), 128,
           Dh <= 64 ? 3 : 0);
  e.launch(4, params, blocks,
           fmt::format("attentionQueryGradBf16<{}>({}, dqkv, {}, lse, delta)", shape, operands, scale), 128);
  return llvm::Error::success();
}

/// cuDNN's fused attention (CudnnAttention) between tgc's launches. The forward: q, k, v to
/// BF16 head-major (as the tensor-core kernels take them) unless cuDNN reads them in place
/// (CudaProgram::qkvRows), cuDNN, and out from BF16 where it is not stored in BF16. The
/// gradient: dout to BF16 head-major unless its GEMM wrote it in BF16 (doutRows), out to BF16
/// where it is not stored so, cuDNN writing dq, dk and dv into dqkv's BF16 form, then dqkv's
/// fp32 form from it.
llvm::Error emitCudnnAttention(const Op &op, Emitter &e, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  int64_t D = H * Dh, headBytes = B * T * D * 2; // one of q, k, v head-major in BF16
  OpLowering &l = e.lowering;
  l.cudnnAttention = true;
  bool headMajor = isHeadMajor(op.attrs());
  auto toHeads = [&](unsigned launch, const std::string &params, const std::string &from, const std::string &to,
                     int parts) { emitToHeads(e, launch, params, B, T, H, Dh, parts, from, to); };
  auto widen = [&](unsigned launch, const std::string &params, int64_t count, const std::string &from,
                   const char *to) {
    e.launch(launch, params, elementwiseBlocks(count / 4),
             fmt::format("widenBf16<{}>((const unsigned short *){}, {})", count, from, to));
  };
  using Buffer = OpLowering::LibraryBuffer;
  // q, k and v: head-major, or in place in qkv's BF16 rows (CudaProgram::qkvRows), D apart.
  auto qkvBuffers = [&](unsigned pointer, bool rows) {
    for (int part = 0; part < 3; ++part)
      l.libraryBuffers.push_back(Buffer{pointer, part * (rows ? D * 2 : headBytes)});
  };
  int64_t workspaceFloats = (e.program_.cudnnAttention.lookup(&op) + 3) / 4;
  if (op.kind() == OpKind::Attention) {
    // Pointers: qkv, out [, its copy], lse, heads (a result with head_major), scratch.
    std::string params = headMajor ? "const float *qkv, float *out, float *lse, float *heads"
                                   : "const float *qkv, float *out, float *lse";
    bool rows = headMajor && e.program_.qkvRows.count(op.result(2)); // heads is qkv's memory
    unsigned heads = rows ? 0 : headMajor ? e.resultPointer(2) : e.addScratch(3 * headBytes / 4);
    bool outStored = e.program_.bf16Stored.count(op.result(0)), outCopy = e.program_.bf16Shadowed.count(op.result(0));
    unsigned outBuffer = outStored ? e.resultPointer(0)
                         : outCopy ? e.resultPointer(0) + 1 // the BF16 copy's pointer follows the fp32 one
                                   : e.addScratch(headBytes / 4);
    unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
    params += e.scratchParams();
    unsigned launch = 0;
    if (!rows)
      toHeads(launch++, params, "qkv", headMajor ? "heads.p" : e.scratchName(heads), 3);
    l.libraryAt = launch;
    qkvBuffers(heads, rows);
    l.libraryBuffers.push_back(Buffer{outBuffer, 0});
    l.libraryBuffers.push_back(Buffer{e.resultPointer(1), 0});
    l.libraryBuffers.push_back(Buffer{workspace, 0});
    if (outCopy)
      widen(launch, params, B * T * D, "out.h", "out.f");
    else if (!outStored)
      widen(launch, params, B * T * D, e.scratchName(outBuffer), "out");
    return llvm::Error::success();
  }
  // Pointers: dout, qkv or heads, out, lse, dqkv [, its copy], scratch.
  std::string params = fmt::format("const float *dout, const float *{}, const float *out, const float *lse, float *dqkv",
                                   headMajor ? "heads" : "qkv");
  const Value *dqkv = op.result(0), *out = op.operand(2);
  bool dqkvStored = e.program_.bf16Stored.count(dqkv), dqkvCopy = e.program_.bf16Shadowed.count(dqkv);
  bool outStored = e.program_.bf16Stored.count(out);
  bool rows = headMajor && e.program_.qkvRows.count(op.operand(1)), doutRows = e.program_.doutRows.count(&op);
  unsigned heads = headMajor ? 1 : e.addScratch(3 * headBytes / 4);
  unsigned doutHeads = doutRows ? 0 : e.addScratch(headBytes / 4), rowSums = e.addScratch(B * H * T);
  unsigned outBuffer = outStored ? 2 : e.addScratch(headBytes / 4);
  unsigned dqkvBuffer = dqkvStored ? e.resultPointer(0)
                        : dqkvCopy ? e.resultPointer(0) + 1 // the BF16 copy's pointer follows the fp32 one
                                   : e.addScratch(3 * headBytes / 4);
  unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
  params += e.scratchParams();
  unsigned launch = 0;
  if (!headMajor)
    toHeads(launch++, params, "qkv", e.scratchName(heads), 3);
  if (!doutRows)
    toHeads(launch++, params, "dout", e.scratchName(doutHeads), 1);
  if (!outStored)
    e.launch(launch++, params, elementwiseBlocks(B * T * D),
             fmt::format("roundToBf16(out, (unsigned short *){}, {})", e.scratchName(outBuffer), B * T * D));
  l.libraryAt = launch;
  qkvBuffers(heads, rows);
  l.libraryBuffers.push_back(Buffer{outBuffer, 0});
  l.libraryBuffers.push_back(Buffer{doutHeads, 0});
  l.libraryBuffers.push_back(Buffer{3, 0}); // lse
  for (int part = 0; part < 3; ++part)
    l.libraryBuffers.push_back(Buffer{dqkvBuffer, part * D * 2});
  l.libraryBuffers.push_back(Buffer{rowSums, 0});
  l.libraryBuffers.push_back(Buffer{workspace, 0});
  if (dqkvCopy) // the fp32 form from the BF16 copy cuDNN wrote
    widen(launch, params, 3 * B * T * D, "dqkv.h", "dqkv.f");
  else if (!dqkvStored)
    widen(launch, params, 3 * B * T * D, e.scratchName(dqkvBuffer), "dqkv");
  return llvm::Error::success();
}

/// Fused attention and its gradient (attention.cuh): BF16 tensor cores under gemm_dtype at
/// head dimensions that are multiples of 16 up to 256, else a thread per row.
llvm::Error emitAttention(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  // The packed qkv's shape: the forward's operand, the gradient's result.
  const TensorType &qkv = op.kind() == OpKind::Attention ? operandType(op, 0) : outputType(op);
  int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / 3, H = *a.getInt("heads"), Dh = D / H;
  bool bf16 = hasBf16Gemms(a);
  std::string scale = lit(*a.getFloat("scale"));
  int64_t blocks = (T + 63) / 64 * B * H;
  e.uses("attention.cuh");
  if (e.program_.cudnnAttention.count(&op))
    return emitCudnnAttention(op, e, B, T, H, Dh);
  if (attentionOnTensorCores(a, Dh))
    return emitAttentionBf16(op, e, B, T, H, Dh, scale);
  if (isHeadMajor(a))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "error: %%%s: head-major q, k, v need the tensor-core attention kernels",
                                   op.result()->name().c_str());
  // A thread per row of a 64-row tile.
  std::string shape = fmt::format("{}, {}, {}, {}", boolText(bf16), T, H, Dh);
  if (op.kind() == OpKind::Attention) {
    e.launch(0, "const float *qkv, float *out, float *lse", blocks,
             fmt::format("attentionForwardSimt<{}>(qkv, out, lse, {})", shape, scale), 64);
    return llvm::Error::success();
  }
  e.lowering.scratchFloats = {B * H * T};
  const char *params =
      "const float *dout, const float *qkv, const float *out, const float *lse, float *dqkv, float *delta";
  emitAttentionDelta(e, 0, params, bf16, B, T, H, Dh);
  e.launch(1, params, blocks, fmt::format("attentionKeyValueGradSimt<{}>(dout, qkv, dqkv, {}, lse, delta)", shape, scale),
           64);
  e.launch(2, params, blocks, fmt::format("attentionQueryGradSimt<{}>(dout, qkv, dqkv, {}, lse, delta)", shape, scale),
           64);
  return llvm::Error::success();
}

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

/// Generation's ops (decode.cuh): the KV-cache writes, the attention over the cache, argmax.
llvm::Error emitDecode(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  e.uses("decode.cuh");
  if (op.kind() == OpKind::Argmax) {
    // Parts of 2048 elements a block (a vocabulary of 50k: 25 blocks a row), then a combine.
    constexpr int64_t kChunk = 2048;
    int64_t n = operandType(op, 0).dim(-1), rows = operandType(op, 0).numElements() / n, chunks = (n + kChunk - 1) / kChunk;
    e.lowering.scratchFloats = {2 * rows * chunks};
    e.launch(0, "const float *x, int *out, float *scratch", rows * chunks,
             fmt::format("argmaxParts<{}, {}>(x, scratch)", n, kChunk));
    e.launch(1, "const float *x, int *out, float *scratch", rows, fmt::format("argmaxCombine<{}, {}>(scratch, out)", n, kChunk),
             32);
    return llvm::Error::success();
  }
  if (op.kind() == OpKind::KvWrite) {
    const TensorType &cache = outputType(op), &qkv = operandType(op, 2);
    int64_t B = cache.dim(0), T = cache.dim(1), D = cache.dim(2), S = qkv.dim(1);
    bool positioned = op.numOperands() > 3;
    std::string params = positioned ? "const float *k, const float *v, const float *qkv, const int *positions, "
                                      "float *kOut, float *vOut"
                                    : "const float *k, const float *v, const float *qkv, float *kOut, float *vOut";
    unsigned launch = copyCachesUnlessInPlace(op, e, params, 0);
    e.launch(launch, params, elementwiseBlocks(B * S * D),
             fmt::format("kvWriteRows<{}, {}, {}, {}, {}, {}>(qkv, {}, kOut, vOut)", B, S, T, D, boolText(positioned),
                         boolText(hasBf16Gemms(a)), positioned ? "positions" : "nullptr"));
    return llvm::Error::success();
  }
  // Flash-decoding: each (sequence, head) split into parts of Keys keys, each part a block,
  // the last block of each combining; parts of 32 keys where the sequences and heads are fewer
  // than the SMs (more blocks at the short positions of a decode), else 64.
  const TensorType &out = outputType(op);
  int64_t B = out.dim(0), D = out.dim(2), T = operandType(op, 1).dim(1), H = *a.getInt("heads"), Dh = D / H;
  int64_t keys = std::min<int64_t>(T, B * H < 132 ? 32 : 64), splits = (T + keys - 1) / keys;
  e.lowering.scratchFloats = {B * H * splits * (Dh + 2)};
  e.lowering.persistentFloats = {B * H}; // the blocks done, per (sequence, head)
  // The caches as they are stored: BF16 (chooseBf16Caches) or fp32.
  bool bf16Caches = e.program_.bf16Stored.count(op.operand(1)) && e.program_.bf16Stored.count(op.operand(2));
  const char *cache = bf16Caches ? "unsigned short" : "float";
  std::string shape = fmt::format("{}, {}, {}, {}, {}, {}, {}", boolText(hasBf16Gemms(a)), B, H, Dh, T, keys, splits);
  const int64_t blocks = B * H * splits;
  if (!writesCache(a)) {
    e.launch(0,
             fmt::format("const float *qkv, const {0} *k, const {0} *v, const int *positions, float *out, "
                         "float *partial, unsigned *done",
                         cache),
             blocks,
             fmt::format("decodeAttention<{}>(qkv, k, v, positions, out, partial, done, {})", shape,
                         lit(*a.getFloat("scale"))),
             128);
    return llvm::Error::success();
  }
  // fuse-kv-write's: the attention reads the caches it writes (kOut, vOut; typed Bf16Out where
  // stored in BF16), copied first where they are not written in place, as kv_write's.
  std::string params = fmt::format("const float *qkv, const {0} *k, const {0} *v, const int *positions, float *out, "
                                   "float *kOut, float *vOut, float *partial, unsigned *done",
                                   cache);
  unsigned launch = copyCachesUnlessInPlace(op, e, params, 1);
  bool inPlace = launch == 0;
  // The keys and values go through shared tiles of at most 32 KB (decode.cuh's Tiles); under
  // programmatic launch, in place, with the positions an input (written before the step), they
  // load before the kernel awaits the one before it (Early).
  int64_t cacheBytes = bf16Caches ? 2 : 4;
  const Op *positions = op.operand(3)->def();
  bool tiles = Dh * cacheBytes % 16 == 0 && 2 * keys * Dh * cacheBytes <= 32 * 1024;
  bool early = tiles && e.program_.programmatic && inPlace && positions && positions->kind() == OpKind::Input;
  e.launch(launch, params, blocks,
           fmt::format("decodeAttention<{}, true, {}, {}>(qkv, readable(kOut), readable(vOut), positions, out, "
                       "partial, done, {}, kOut, vOut)",
                       shape, boolText(tiles), boolText(early), lit(*a.getFloat("scale"))),
           128);
  if (early)
    e.awaitsItself();
  return llvm::Error::success();
}

/// gemmRowsBf16's slices of K (gemv.cuh): 8 (a block of 8 columns), fewer where K has no 8
/// whole steps of 32. (Blocks of 16 columns, which read the rows of x half as often, ran slower:
/// fewer blocks stream the weight. BENCHMARKS.md, session 13.)
int rowsKSplit(int64_t K) {
  int kSplit = 8;
  while (K % (32 * kSplit))
    kSplit /= 2;
  return kSplit;
}

/// A product of few rows against a weight (gemv.cuh): 1 to 8 rows on the CUDA cores, 9 to 64 on
/// tensor cores; matmul_bias_gelu (fuse-gemv-gelu) applies the GELU as it writes.
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
  if (fewRows(op) == FewRows::Gemv) {
    e.launch(0, params, (N + 7) / 8,
             fmt::format("gemvBf16<{}, {}, {}, {}, {}>({})", M, N, K, boolText(bias), boolText(gelu), args));
  } else {
    int kSplit = rowsKSplit(K), columns = 64 / kSplit;
    e.launch(0, params, (N + columns - 1) / columns,
             fmt::format("gemmRowsBf16<{}, {}, {}, {}, {}, {}>({})", M, N, K, kSplit, boolText(bias), boolText(gelu),
                         args));
  }
  e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

/// residual_norm_linear (fuse-residual-norm-gemv): a GEMV whose blocks normalise the rows they
/// read (gemv.cuh), with the GELU after the product where there is one.
llvm::Error emitResidualNormGemv(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  bool layer = isLayerNorm(a), bias = a.getBool("bias").value_or(false), gelu = a.getString("activation") == "gelu";
  unsigned weight = layer ? 4 : 3;
  const TensorType &w = operandType(op, weight);
  int64_t N = w.dim(0), K = w.dim(1), M = operandType(op, 0).numElements() / K;
  e.uses("gemv.cuh");
  // A parameter's weight is read from its BF16 copy. Another weight (a test's input) is first
  // rounded into BF16 scratch by launch 0.
  const Value *wv = op.operand(weight);
  bool param = wv->def() && wv->def()->kind() == OpKind::Param;
  if (param)
    e.lowering.bf16Weights = {weight};
  else
    e.lowering.scratchFloats = {(N * K + 1) / 2};
  std::string params = fmt::format("const float *a, const float *b, const float *gamma, {}const {} *w, "
                                   "{}float *sum, float *out{}",
                                   layer ? "const float *beta, " : "", param ? "unsigned short" : "float",
                                   bias ? "const float *bias, " : "", param ? "" : ", float *scratch");
  unsigned launch = 0;
  if (!param)
    e.launch(launch++, params, elementwiseBlocks(N * K),
             fmt::format("roundToBf16(w, (unsigned short *)scratch, {})", N * K));
  e.launch(launch, params, (N + 7) / 8,
           fmt::format("residualNormGemvBf16<{}, {}, {}, {}, {}, {}>(a, b, gamma, {}, {}, {}, sum, out, {})",
                       boolText(layer), M, N, K, boolText(bias), boolText(gelu), layer ? "beta" : "nullptr",
                       param ? "w" : "(const unsigned short *)scratch", bias ? "bias" : "nullptr",
                       formatDouble(*a.getFloat("eps"))));
  if (param)
    e.awaitsItself(); // its weights load while the kernel before it ends
  return llvm::Error::success();
}

llvm::Error emit(const Op &op, Emitter &e) {
  switch (op.kind()) {
  case OpKind::Constant:
  case OpKind::Embedding:
  case OpKind::Add:
  case OpKind::Mul:
  case OpKind::Scale:
  case OpKind::Gelu:
  case OpKind::Silu:
  case OpKind::GeluBackward:
  case OpKind::SiluBackward:
  case OpKind::CausalMask:
    return emitElementwise(op, e);
  case OpKind::Transpose:
  case OpKind::Concat:
  case OpKind::Slice:
  case OpKind::Pad:
    return emitLayout(op, e);
  case OpKind::LayerNorm:
  case OpKind::RMSNorm:
  case OpKind::ResidualNorm:
  case OpKind::LayerNormBackward:
  case OpKind::RMSNormBackward:
    return emitNorm(op, e);
  case OpKind::Softmax:
  case OpKind::LogSoftmax:
  case OpKind::MaskedSoftmax:
  case OpKind::SoftmaxBackward:
  case OpKind::LogSoftmaxBackward:
  case OpKind::MaskedSoftmaxBackward:
    return emitSoftmax(op, e);
  case OpKind::CrossEntropy:
  case OpKind::CrossEntropyBackward:
  case OpKind::NLLLoss:
  case OpKind::NLLLossBackward:
    return emitLoss(op, e);
  case OpKind::ReduceTo:
  case OpKind::SumSquares:
  case OpKind::EmbeddingBackward:
    return emitReduction(op, e);
  case OpKind::ClipScale:
  case OpKind::LRSchedule:
  case OpKind::AdamW:
    return emitOptimizer(op, e);
  case OpKind::Quantize:
  case OpKind::Fp8Update:
    return emitFp8(op, e);
  case OpKind::Attention:
  case OpKind::AttentionBackward:
    return emitAttention(op, e);
  case OpKind::KvWrite:
  case OpKind::DecodeAttention:
  case OpKind::Argmax:
    return emitDecode(op, e);
  case OpKind::MatMul:
  case OpKind::MatMulBias:
  case OpKind::MatMulBiasGelu:
    return emitGemv(op, e);
  case OpKind::ResidualNormLinear:
    return emitResidualNormGemv(op, e);
  default:
    return unsupported(op);
  }
}

/// Who reads `v`, directly or through reshapes: BF16 GEMMs as their A or B operand, and the
/// rest (the bias of matmul_bias is added in fp32; graph outputs count as the rest).
struct Readers {
  int bf16Gemms = 0, others = 0;
};
void countReaders(const Graph &graph, const CudaProgram &program, const Value *v, Readers &readers) {
  if (llvm::is_contained(graph.outputs(), v))
    ++readers.others;
  for (const Op *user : v->users()) {
    if (user->kind() == OpKind::Reshape) {
      countReaders(graph, program, user->result(), readers);
      continue;
    }
    // cuDNN's attention gradient reads the forward's out in BF16, as a GEMM operand; the column
    // sums of a gradient cuDNN wrote (in BF16: the fp32 form holds the same values) read it so.
    if (program.cudnnAttention.count(user) && user->kind() == OpKind::AttentionBackward && user->operand(2) == v &&
        user->operand(0) != v && user->operand(1) != v && user->operand(3) != v) {
      ++readers.bf16Gemms;
      continue;
    }
    const Op *producer = reshapeRoot(v)->def();
    // The column sums of a gradient a BF16 epilogue or cuDNN writes read it in BF16.
    if (user->kind() == OpKind::ReduceTo && producer &&
        ((producer->kind() == OpKind::AttentionBackward && program.cudnnAttention.count(producer)) ||
         producer->kind() == OpKind::MatMulDGelu)) {
      ++readers.bf16Gemms;
      continue;
    }
    // A quantize reads a cuDNN result (the attention's out, its gradient's dqkv) in BF16: cuDNN
    // writes BF16, so the fp32 form holds the same values, and the FP8 bytes, amax and
    // saturations are the same bits from either (half the bytes read, no widening pass).
    if (user->kind() == OpKind::Quantize && user->operand(0) == v && producer &&
        (producer->kind() == OpKind::Attention || producer->kind() == OpKind::AttentionBackward) &&
        program.cudnnAttention.count(producer)) {
      ++readers.bf16Gemms;
      continue;
    }
    bool operand = isBf16Gemm(*user);
    for (unsigned p = 2; p < user->numOperands(); ++p)
      operand &= user->operand(p) != v;
    ++(operand ? readers.bf16Gemms : readers.others);
  }
}

/// The KV caches a BF16 kv_write writes in place, read by nothing but such writes, BF16
/// decode_attention and their assigns, are stored in BF16 (with the writes' results): half the
/// memory, half the bytes the attention reads, the same values (the writes round them).
void chooseBf16Caches(const Graph &graph, CudaProgram &program) {
  auto readsBf16 = [](const Value *v) {
    for (const Op *user : v->users()) {
      bool bf16 = hasBf16Gemms(user->attrs());
      if (user->kind() == OpKind::Assign || (user->kind() == OpKind::KvWrite && bf16 && user->operand(2) != v) ||
          (user->kind() == OpKind::DecodeAttention && bf16 && user->operand(0) != v))
        continue;
      return false;
    }
    return true;
  };
  for (const Op *op : graph.ops()) {
    // kv_write's caches are its operands and results 0 and 1; decode_attention {write_cache}'s
    // its operands and results 1 and 2.
    bool fused = op->kind() == OpKind::DecodeAttention && writesCache(op->attrs());
    if ((op->kind() != OpKind::KvWrite && !fused) || !hasBf16Gemms(op->attrs()))
      continue;
    for (unsigned r = 0; r < 2; ++r) {
      const Value *cache = op->operand(fused ? r + 1 : r), *written = op->result(fused ? r + 1 : r);
      if (program.inPlace.lookup(written) != cache || cache->def()->kind() != OpKind::State ||
          !readsBf16(cache) || !readsBf16(written) || llvm::is_contained(graph.outputs(), written))
        continue;
      program.bf16Stored.insert(cache);
      program.bf16Stored.insert(written);
    }
  }
}

/// The head-major q, k, v an attention keeps for its gradient (keep-attention-heads) are stored
/// in BF16, as the tensor-core kernels read them: their forward writes the BF16 values its
/// gradient would otherwise make. Each is an attention's third result (or an input: a test's
/// gradient alone), read by head-major gradients alone, or returned.
llvm::Error chooseBf16Heads(const Graph &graph, CudaProgram &program) {
  auto fail = [](const Value *v) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "error: %%%s: head-major q, k, v come from an attention (or an input) and go "
                                   "to its gradient alone on the GPU (they are stored in BF16)",
                                   v->name().c_str());
  };
  for (const Op *op : graph.ops()) {
    bool forward = op->kind() == OpKind::Attention && op->numResults() > 2;
    bool gradient = op->kind() == OpKind::AttentionBackward && isHeadMajor(op->attrs());
    if (!forward && !gradient)
      continue;
    const Value *heads = forward ? op->result(2) : op->operand(1);
    OpKind producer = heads->def()->kind();
    if (producer != OpKind::Attention && producer != OpKind::Input)
      return fail(heads);
    for (const Op *user : heads->users())
      if (user->kind() != OpKind::AttentionBackward || !isHeadMajor(user->attrs()) || user->operand(1) != heads)
        return fail(heads);
    program.bf16Stored.insert(heads);
  }
  return llvm::Error::success();
}

/// `v` and its reshapes into `set`.
void markWithReshapes(llvm::DenseSet<const Value *> &set, const Value *v) {
  set.insert(v);
  for (const Op *user : v->users())
    if (user->kind() == OpKind::Reshape)
      markWithReshapes(set, user->result());
}

/// CudaProgram::bf16Rounding. The bias fc1 adds must be a parameter: the executor's BF16
/// copy of the parameters holds it in BF16.
void chooseBf16Rounding(const Graph &graph, CudaProgram &program) {
  // Neither returned nor written into a leaf nor a gradient of the parameter layout.
  auto intermediate = [&](const Value *v) {
    return !llvm::is_contained(graph.outputs(), v) && !program.inPlace.count(v) && !program.layout.grads.count(v);
  };
  auto onlyGemmsRead = [&](const Value *v) {
    Readers readers;
    countReaders(graph, program, v, readers);
    return readers.others == 0 && readers.bf16Gemms > 0 && intermediate(v);
  };
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::MatMulBiasGelu || !hasBf16Gemms(op->attrs()) || fewRows(*op) != FewRows::None ||
        !isWeight(program, op->operand(2)))
      continue;
    const Value *act = op->result(0), *h = op->result(1);
    bool chosen = onlyGemmsRead(act) && !h->users().empty() && intermediate(h);
    for (const Op *user : h->users())
      chosen &= user->kind() == OpKind::MatMulDGelu && user->operand(0) != h && user->operand(1) != h &&
                onlyGemmsRead(user->result());
    if (!chosen)
      continue;
    program.bf16Rounding.insert(op);
    markWithReshapes(program.bf16Stored, act);
    markWithReshapes(program.bf16Stored, h);
    for (const Op *user : h->users()) {
      program.bf16Rounding.insert(user);
      markWithReshapes(program.bf16Stored, user->result());
    }
  }
  // Whether `v`, an intermediate, is read by at least one op, and each reads it once, as the
  // operand `operandOf` gives for it (-1: an op the rule does not take).
  auto onlyReadAs = [&](const Value *v, auto operandOf) {
    if (v->users().empty() || !intermediate(v))
      return false;
    for (const Op *user : v->users()) {
      int operand = operandOf(*user);
      for (unsigned p = 0; p < user->numOperands(); ++p)
        if ((user->operand(p) == v) != (int(p) == operand))
          return false;
    }
    return true;
  };
  auto storeRounded = [&](const Op *producer, const Value *v) {
    program.bf16Rounding.insert(producer);
    program.bf16Stored.insert(v);
  };
  auto activationOf = [](const Op &op) {
    return op.kind() == OpKind::Quantize ? op.attrs().getString("activation") : std::nullopt;
  };
  for (const Op *op : graph.ops()) {
    // An FP8 layer's pre-activation (its bias add, or the product adding it: fuse-fp8-bias) that
    // only the GELU (or the quantize applying it: fuse-gelu-quantize) and the GELU's gradient
    // (or the quantize making it) read, kept for the gradient: in BF16, as under BF16 the GELU
    // epilogue keeps it (the FP8 recipe's activation memory then stays below BF16's).
    const Op *product = op->kind() == OpKind::Add ? op->operand(0)->def() : op;
    if ((op->kind() == OpKind::Add || op->kind() == OpKind::MatMulBias) && product &&
        product->kind() == (op->kind() == OpKind::Add ? OpKind::MatMul : OpKind::MatMulBias) &&
        isFp8(product->operand(0)->type().dtype)) {
      const Value *h = op->result();
      bool gradient = llvm::any_of(h->users(), [&](const Op *user) {
        return user->kind() == OpKind::GeluBackward || activationOf(*user) == "gelu_backward";
      });
      if (gradient && onlyReadAs(h, [&](const Op &user) {
            return user.kind() == OpKind::Gelu || activationOf(user) == "gelu" ? 0
                   : user.kind() == OpKind::GeluBackward                     ? 1
                   : activationOf(user) == "gelu_backward"                     ? 3
                                                                             : -1;
          }))
        storeRounded(op, h);
    }
    // A norm's output that only quantizes read (an FP8 layer's input: ln1 for qkv, ln2 for fc1),
    // written in BF16 as Transformer Engine's norms write their BF16 activations: the quantize
    // reads two bytes an element instead of four.
    bool norm = op->kind() == OpKind::LayerNorm || op->kind() == OpKind::RMSNorm;
    if (norm || op->kind() == OpKind::ResidualNorm) {
      const Value *y = op->result(norm ? 0 : 1);
      if (onlyReadAs(y, [&](const Op &user) {
            return user.kind() == OpKind::Quantize && !user.attrs().has("activation") ? 0 : -1;
          }))
        storeRounded(op, y);
    }
    // The gradient of an FP8 layer's GELU, an FP8 product's (fc2's dgrad) that only the quantize
    // making fc1's FP8 output gradient of it reads (fuse-gelu-quantize's "gelu_backward"): the
    // product writes it in BF16, as Transformer Engine's dgrad writes the activations' type, and
    // the quantize reads two bytes an element instead of four (E5M2 keeps 3 of BF16's 8
    // significant bits).
    bool tensorCores = fewRows(*op) == FewRows::None &&
                       (op->kind() == OpKind::MatMul || op->kind() == OpKind::MatMulBias) &&
                       (hasBf16Gemms(op->attrs()) || isFp8(op->operand(0)->type().dtype));
    if (tensorCores && op->kind() == OpKind::MatMul && isFp8(op->operand(0)->type().dtype) &&
        op->result()->users().size() == 1 && onlyReadAs(op->result(), [&](const Op &user) {
          return activationOf(user) == "gelu_backward" ? 0 : -1;
        }))
      storeRounded(op, op->result());
    // A product on tensor cores (BF16 or FP8) that only a norm reads: the projection's and fc2's
    // outputs, which the residual norm after them adds to the stream, and the dgrad products of
    // the layers after a norm (qkv's, fc1's), which its gradient reads twice. They are written in
    // BF16, as PyTorch's autocast and Transformer Engine write a GEMM's output in the
    // activations' type: two bytes an element instead of four, written once and read once or
    // twice. A bias is then added from the parameter's BF16 copy (cuBLASLt's BF16 epilogue).
    if (tensorCores && (op->kind() == OpKind::MatMul || isWeight(program, op->operand(2))) &&
        onlyReadAs(op->result(), [](const Op &user) {
          bool gradient = user.kind() == OpKind::LayerNormBackward || user.kind() == OpKind::RMSNormBackward;
          return gradient ? 0 : user.kind() == OpKind::ResidualNorm ? 1 : -1; // dy of a gradient, y of a sum
        }))
      storeRounded(op, op->result());
    // Logits a BF16 GEMM writes for the loss and its gradient alone, which read them in BF16.
    if (tensorCores && op->kind() == OpKind::MatMul && !isFp8(op->operand(0)->type().dtype) &&
        onlyReadAs(op->result(), [](const Op &user) {
          return user.kind() == OpKind::CrossEntropy ? 0 : user.kind() == OpKind::CrossEntropyBackward ? 1 : -1;
        }))
      storeRounded(op, op->result());
  }
}

/// cuDNN's attentions that read their operands where the GEMMs wrote them (CudaProgram::qkvRows,
/// doutRows), into the program: those GEMMs write BF16 (bf16Rounding: qkv's bias is added from
/// its BF16 copy), and the head-major copy the forward would make is qkv's memory.
llvm::Error chooseCudnnRows(const Graph &graph, const LoweringOptions &options, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    if (!program.cudnnAttention.count(op))
      continue;
    if (op->kind() == OpKind::Attention && cudnnReadsQkvRows(graph, *op, options)) {
      const Value *qkv = op->operand(0), *heads = op->result(2);
      for (const Op *user : heads->users())
        if (!program.cudnnAttention.count(user))
          return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                         "error: %%%s: cuDNN runs the attention that reads q, k and v in place "
                                         "but not its gradient %%%s",
                                         op->result()->name().c_str(), user->result()->name().c_str());
      program.bf16Rounding.insert(qkv->def());
      program.bf16Stored.insert(qkv);
      program.qkvRows[heads] = qkv;
    }
    if (op->kind() == OpKind::AttentionBackward && cudnnReadsDoutRows(graph, *op, options)) {
      program.bf16Rounding.insert(op->operand(0)->def());
      program.bf16Stored.insert(op->operand(0));
      program.doutRows.insert(op);
    }
  }
  return llvm::Error::success();
}

/// The values whose producers write them in BF16 for the BF16 GEMMs that read them: f32 results
/// of the ops whose kernels store through an output type (the op table's Bf16Out column: their
/// templates write `out[i] = ...` only, which Bf16Out and F32Bf16Out turn into the right
/// stores), with their reshapes. Into program.bf16Stored when only BF16 GEMMs read them, into
/// bf16Shadowed when others do too.
void chooseBf16Values(const Graph &graph, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    // The op table's Bf16Out column; gemv.cuh's products write through an output type too.
    // cuDNN's attention writes its results in BF16 (the gradient's dqkv too).
    if (!opInfo(op->kind()).bf16Outputs && fewRows(*op) == FewRows::None && !program.cudnnAttention.count(op))
      continue;
    for (unsigned r = 0; r < op->numResults(); ++r) {
      const Value *v = op->result(r);
      Readers readers;
      countReaders(graph, program, v, readers);
      if (v->type().dtype != DType::F32 || readers.bf16Gemms == 0 || program.inPlace.count(v) ||
          program.layout.grads.count(v))
        continue;
      if (op->kind() == OpKind::ResidualNorm && r == 0) // its template writes the sum as a float *
        continue;
      markWithReshapes(readers.others == 0 ? program.bf16Stored : program.bf16Shadowed, v);
    }
  }
}

} // namespace

std::string kernelSource(const KernelText &k) {
  std::string bounds = k.minBlocks ? fmt::format("__launch_bounds__({}, {}) ", k.threads, k.minBlocks)
                       : k.threads == kThreads ? ""
                                               : fmt::format("__launch_bounds__({}) ", k.threads);
  return fmt::format("{}\nextern \"C\" __global__ void {}{}({}) {{\n  {}{}\n}}\n\n", k.comment, bounds, k.name,
                     k.params, k.awaitsItself ? "" : "awaitPreviousKernel(); ", k.call);
}

const char *const kAdamWParams =
    "const float *param, const float *grad, const float *m, const float *v, const float *lr, "
    "const float *clip, const int *step, float *newParam, float *newM, float *newV";
const char *const kAdamWCopyParams =
    "const float *param, const float *grad, const float *m, const float *v, const float *lr, "
    "const float *clip, const int *step, F32Bf16Out newParam, float *newM, float *newV";

std::string adamwCall(const AttrMap &a, int64_t count, int64_t decayed, double decay) {
  return fmt::format("adamw<{}, {}>(param, grad, m, v, lr, clip, step, newParam, newM, newV, {}, {}, {}, {})", count,
                     decayed, formatDouble(*a.getFloat("beta1")), formatDouble(*a.getFloat("beta2")),
                     lit(*a.getFloat("eps")), formatDouble(decay));
}

int64_t elementwiseBlocks(int64_t count) { return std::min<int64_t>((count + 255) / 256, 8192); }

int64_t normBlocks(int64_t rows, int64_t width) { return width <= 1024 ? (rows + 7) / 8 : rows; }

int64_t sumSquaresBlocks(int64_t count) { return std::min<int64_t>(1024, (count + 2047) / 2048); }

namespace {

/// How the executor runs `op`, before its kernels are written (Kernels), or why it cannot.
llvm::Expected<OpLowering::Kind> loweringKind(const Op &op) {
  if (fewRows(op) != FewRows::None)
    return OpLowering::Kernels;
  if (isLeaf(op.kind()) && op.kind() != OpKind::Constant)
    return OpLowering::Leaf;
  if (op.kind() == OpKind::Assign)
    return OpLowering::Assign;
  if (op.kind() == OpKind::Reshape)
    return OpLowering::Alias;
  if (op.kind() == OpKind::AllReduce)
    return OpLowering::Collective;
  if (op.kind() == OpKind::MatMul) {
    bool fp8 = isFp8(op.operand(0)->type().dtype);
    if (fp8 && (op.attrs().getBool("transpose_a").value_or(false) || !op.attrs().getBool("transpose_b").value_or(false)))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "error: the FP8 GEMM %%%s is not in cuBLASLt's TN layout (matmul(A, B) "
                                     "{transpose_b=true}); run legalize-fp8-gemm first",
                                     op.result()->name().c_str());
    if (!fp8 && op.operand(0)->type().dtype != DType::F32)
      return unsupported(op);
    return OpLowering::Gemm;
  }
  if (op.kind() == OpKind::MatMulBias || op.kind() == OpKind::MatMulBiasGelu || op.kind() == OpKind::MatMulDGelu)
    return OpLowering::Gemm; // cuBLASLt's BIAS, GELU_AUX_BIAS or DGELU epilogue
  for (const Value *v : op.operands())
    if (v->type().dtype != DType::F32 && v->type().dtype != DType::I32 &&
        !(isFp8(v->type().dtype) && op.kind() == OpKind::Transpose))
      return unsupported(op);
  return OpLowering::Kernels;
}

/// The program's source: the kernel headers it uses, then each kernel once. Ops whose kernels
/// would be the same text (a layer's ops and the next layer's, at the same shapes) launch the
/// first op's, so NVRTC compiles each distinct kernel once.
std::string assembleSource(const std::set<std::string> &headers, const std::vector<std::vector<KernelText>> &kernels,
                           CudaProgram &program) {
  std::string source = "// Generated by tgc: one kernel per distinct op instance, a template of "
                       "backends/cuda/kernels instantiated with its shapes.\n";
  for (const std::string &header : headers)
    source += "#include \"" + header + "\"\n";
  source += "\n";
  std::map<std::string, std::string> first; // params, call and threads -> the kernel's name
  for (size_t i = 0; i < kernels.size(); ++i) {
    for (const KernelText &k : kernels[i]) {
      std::string key = fmt::format("{}|{}|{}", k.params, k.call, k.threads);
      auto [it, added] = first.emplace(key, k.name);
      if (added) {
        source += kernelSource(k);
        continue;
      }
      for (KernelLaunch &launch : program.lowering[i].launches)
        if (launch.name == k.name)
          launch.name = it->second;
    }
  }
  return source;
}

} // namespace

namespace {

/// `v` is an intermediate that `reader` alone reads, once.
bool readOnlyBy(const Graph &graph, const Value *v, const Op &reader) {
  if (llvm::is_contained(graph.outputs(), v) || v->users().size() != 1 || v->users().front() != &reader)
    return false;
  return llvm::count(reader.operands(), v) == 1;
}

/// A BF16 or FP8 GEMM of many rows that could write its output in BF16 instead.
bool writesBf16Instead(const Op *gemm, OpKind kind) {
  return gemm && gemm->kind() == kind && (hasBf16Gemms(gemm->attrs()) || isFp8(gemm->operand(0)->type().dtype)) &&
         fewRows(*gemm) == FewRows::None;
}

} // namespace

bool cudnnReadsQkvRows(const Graph &graph, const Op &forward, const LoweringOptions &options) {
  if (!options.storeBf16 || !options.bf16Rounding || forward.kind() != OpKind::Attention ||
      forward.numResults() != 3)
    return false;
  // qkv from a BF16 GEMM adding a parameter's bias (the executor's BF16 copy holds it), read by
  // this attention alone; its head-major copy read by head-major gradients alone, as q, k, v.
  const Value *qkv = forward.operand(0), *heads = forward.result(2);
  const Op *gemm = qkv->def();
  if (!writesBf16Instead(gemm, OpKind::MatMulBias) || !readOnlyBy(graph, qkv, forward) ||
      !reshapeRoot(gemm->operand(2))->def() || reshapeRoot(gemm->operand(2))->def()->kind() != OpKind::Param ||
      heads->users().empty() || llvm::is_contained(graph.outputs(), heads))
    return false;
  return llvm::all_of(heads->users(), [&](const Op *user) {
    return user->kind() == OpKind::AttentionBackward && isHeadMajor(user->attrs()) && readOnlyBy(graph, heads, *user) &&
           user->operand(1) == heads;
  });
}

bool cudnnReadsDoutRows(const Graph &graph, const Op &backward, const LoweringOptions &options) {
  if (!options.storeBf16 || !options.bf16Rounding || backward.kind() != OpKind::AttentionBackward)
    return false;
  // dout from a BF16 GEMM, read by this gradient alone: the GEMM rounds it as the gradient would.
  const Value *dout = backward.operand(0);
  return writesBf16Instead(dout->def(), OpKind::MatMul) && readOnlyBy(graph, dout, backward) &&
         !dout->def()->attrs().getBool("transpose_a").value_or(false);
}

std::optional<CudnnAttentionShape> cudnnAttentionShape(const Graph &graph, const Op &op,
                                                       const LoweringOptions &options) {
  if (op.kind() != OpKind::Attention && op.kind() != OpKind::AttentionBackward)
    return std::nullopt;
  const AttrMap &a = op.attrs();
  const TensorType &qkv = op.kind() == OpKind::Attention ? op.operand(0)->type() : op.result(0)->type();
  CudnnAttentionShape shape;
  shape.B = qkv.dim(0);
  shape.T = qkv.dim(1);
  shape.H = *a.getInt("heads");
  shape.DH = qkv.dim(2) / 3 / shape.H;
  shape.scale = *a.getFloat("scale");
  shape.backward = op.kind() == OpKind::AttentionBackward;
  if (!hasBf16Gemms(a) || !attentionOnTensorCores(a, shape.DH) || shape.DH % 8 || shape.DH > 128)
    return std::nullopt;
  if (!shape.backward) {
    shape.qkvRows = cudnnReadsQkvRows(graph, op, options);
  } else {
    const Op *forward = op.operand(1)->def();
    shape.qkvRows = isHeadMajor(a) && forward && cudnnReadsQkvRows(graph, *forward, options);
    shape.doutRows = cudnnReadsDoutRows(graph, op, options);
  }
  return shape;
}

namespace {

/// An FP8 matmul_bias adds its bias's BF16 copy: cuBLASLt's FP8 epilogues take no other bias
/// type (CudaProgram::bf16Rounding, whatever the options).
llvm::Error chooseFp8Biases(const Graph &graph, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::MatMulBias || !isFp8(op->operand(0)->type().dtype))
      continue;
    if (!isWeight(program, op->operand(2)))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "error: %%%s: an FP8 matmul_bias adds a parameter's BF16 copy (cuBLASLt's FP8 "
                                     "epilogue); %%%s is not a parameter",
                                     op->result()->name().c_str(), op->operand(2)->name().c_str());
    program.bf16Rounding.insert(op);
  }
  return llvm::Error::success();
}

} // namespace

bool addsBf16Bias(const CudaProgram &program, const Op &op) {
  return (op.kind() == OpKind::MatMulBias || op.kind() == OpKind::MatMulBiasGelu) && program.bf16Rounding.count(&op);
}

llvm::Expected<CudaProgram> lowerToCuda(const Graph &graph, LoweringOptions options) {
  CudaProgram program;
  program.cudnnAttention = options.cudnnAttention;
  program.multiprocessors = options.multiprocessors > 0 ? options.multiprocessors : 132;
  std::vector<Op *> ops = graph.ops();
  for (const Op *op : ops) {
    auto kind = loweringKind(*op);
    if (!kind)
      return kind.takeError();
    program.lowering.push_back(OpLowering{});
    program.lowering.back().kind = *kind; // Kernels: written below, once the BF16 values are chosen
  }
  program.inPlace = inPlaceValues(graph, program);
  // Programmatic launch where nothing writes the parameters (a decode step, a prompt: the
  // few-row products load their weights before they await the kernel before them) and no
  // collective runs on a stream of its own.
  program.programmatic =
      llvm::none_of(program.lowering, [](const OpLowering &l) { return l.kind == OpLowering::Collective; }) &&
      llvm::none_of(ops, [](const Op *op) {
        return op->kind() == OpKind::Assign && op->operand(0)->def() && op->operand(0)->def()->kind() == OpKind::Param;
      });
  chooseBf16Caches(graph, program); // before the layout: they take half the state memory
  if (auto err = chooseBf16Heads(graph, program))
    return std::move(err);
  program.layout = layoutParameters(graph, program);
  if (auto err = chooseFp8Biases(graph, program))
    return std::move(err);
  if (options.storeBf16) {
    if (options.bf16Rounding)
      chooseBf16Rounding(graph, program);
    if (auto err = chooseCudnnRows(graph, options, program))
      return std::move(err);
    chooseBf16Values(graph, program);
  }
  std::vector<std::vector<KernelText>> kernels(ops.size());
  std::set<std::string> headers = {"common.cuh"};
  for (unsigned i = 0; i < ops.size(); ++i) {
    if (program.lowering[i].kind != OpLowering::Kernels)
      continue;
    Emitter e(*ops[i], i, program);
    if (auto err = emit(*ops[i], e))
      return std::move(err);
    kernels[i] = std::move(e.kernels);
    headers.insert(e.headers.begin(), e.headers.end());
    program.lowering[i] = std::move(e.lowering);
  }
  if (options.groupOptimizer)
    groupOptimizer(ops, program, kernels);
  program.source = assembleSource(headers, kernels, program);
  return program;
}

} // namespace tgc
