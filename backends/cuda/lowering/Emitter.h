// What every kernel family's emitter (one file each in this folder) and the optimizer's
// program-level grouping (OptimizerGroups.cpp) share: the wrapper every generated kernel is, the
// Emitter that writes one op's wrappers and launches, the literals they are written with, and
// launch shapes that must agree for the grouped kernels to give the per-op kernels' bits.
#pragma once

#include "backends/cuda/CudaProgram.h"
#include "ir/Attributes.h"
#include "ir/Fused.h"
#include "ir/Gemv.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <fmt/format.h>
#include <set>
#include <string>
#include <vector>

namespace tgc {

constexpr int kThreads = 256; // threads per block of a generated kernel unless it says otherwise

/// A generated kernel: an extern "C" __global__ function `name` with `params` whose body is
/// the one statement `call`, a kernel template of backends/cuda/kernels/*.cuh instantiated with
/// an op's shapes. `comment` (lines starting with "// ") says which op it is for.
struct KernelText {
  std::string comment, name, params, call;
  int threads = kThreads; // blocks of other than kThreads threads say so in launch bounds
  int minBlocks = 0;       // blocks an SM should hold at once (launch bounds; 0: no bound)
  int clusterBlocks = 0;   // blocks a thread-block cluster (__cluster_dims__; 0: none)
  /// The kernel template calls awaitPreviousKernel (common.cuh) itself, after what it may read
  /// before the kernel before it ends (a GEMV's weights); otherwise the wrapper calls it first.
  bool awaitsItself = false;
};
/// The source of `kernel`.
std::string kernelSource(const KernelText &kernel);

/// AdamW's kernel parameters: operands, then results.
extern const char *const kAdamWParams;
/// kAdamWParams with the new parameters' BF16 copy (F32Bf16Out: the executor passes the
/// parameters' BF16 copy after them).
extern const char *const kAdamWCopyParams;
/// The call of optimizer.cuh's adamw over `count` elements whose first `decayed` have weight
/// decay `decay` (the op's own, or the grouped launch's).
std::string adamwCall(const AttrMap &attrs, int64_t count, int64_t decayed, double decay);
/// Blocks of an elementwise launch over `count` elements (a grid-stride loop past 8192).
int64_t elementwiseBlocks(int64_t count);
/// How many blocks sum_squares' first launch splits `count` elements into (a contiguous range
/// each); the grouped gradient norm splits each gradient the same way.
int64_t sumSquaresBlocks(int64_t count);
/// Blocks of the norm kernels over rows of `width`: a warp per row, kNormRowsPerBlock (8) rows a
/// block, where rows are at most 1024 wide; a block per row where they are wider.
int64_t normBlocks(int64_t rows, int64_t width);

/// The bytes of the parameter region a step reads in BF16, [begin, end): BF16 GEMMs' parameter
/// operands, GEMVs' weights, BF16 epilogues' biases ({0, 0}: none).
std::pair<int64_t, int64_t> weightsReadInBf16(const std::vector<Op *> &ops, const CudaProgram &program);
/// Rewrites the optimizer's lowering over the contiguous parameter layout: every AdamW op as
/// one launch, and the gradient norm's sum_squares and adds as one pair of launches, where
/// their conditions hold (the same bits as one kernel per op). `sources` holds each op's
/// kernels; the replaced ops' kernels go and the grouped kernels come in.
void groupOptimizer(const std::vector<Op *> &ops, CudaProgram &program,
                    std::vector<std::vector<KernelText>> &kernels);
/// A plain cast's blocks over `count` elements and the elements each converts: a range of 4096
/// a block (a multiple of 4 where `count` is, so that they move four at a time; Fp8.cpp).
std::pair<int64_t, int64_t> castBlocks(int64_t count);
/// The AdamW ops whose FP8 weight's cast after them (fp8-weights' quantize of the new weight,
/// per-tensor delayed scaling) can make their update, each with that quantize (AdamWCast.cpp).
llvm::DenseMap<const Op *, const Op *> chooseAdamWInCast(const Graph &graph, const CudaProgram &program);
/// Rewrites each cast of CudaProgram::adamwInCast as one launch that makes the AdamW update it
/// casts; the AdamW op becomes Grouped (the same bits).
void castWithAdamW(const std::vector<Op *> &ops, CudaProgram &program, std::vector<std::vector<KernelText>> &kernels);
/// Rewrites runs of fp8_update ops (only assigns and leaves between them, every result written
/// into its state) as launches of up to 48 updates each, a block an update (Fp8Groups.cpp).
void groupFp8Updates(const std::vector<Op *> &ops, CudaProgram &program,
                     std::vector<std::vector<KernelText>> &kernels);
/// fp8_update's kernel parameters and its call of fp8.cuh's fp8Update, every pointer's name
/// followed by `suffix` (a grouped launch's member number; empty for the op's own kernel).
std::string fp8UpdateParams(const Op &op, const std::string &suffix);
std::string fp8UpdateCall(const Op &op, const std::string &suffix);


constexpr int64_t kChunk = 64; // rows per partial sum of a column reduction
/// Blocks of a column reduction's last launch: 8 columns a block (reduce.cuh's columnTotals).
inline int64_t columnTotalBlocks(int64_t columns) { return (columns + 7) / 8; }
/// A float constant as CUDA source: the literal of its float value.
std::string lit(double v);
inline int64_t rowsOf(const TensorType &t) { return t.rank() ? t.numElements() / t.dim(-1) : 1; }
/// The C type a kernel reads and writes elements of `dtype` as: FP8 values are their bytes.
const char *cType(DType dtype);
/// The FP8 interpretation (cuda_fp8.h) of a quantize's format, and the format's largest value.
const char *fp8Interpretation(const AttrMap &attrs);
double fp8Largest(const AttrMap &attrs);
/// 2^margin, which fp8_update and current scaling divide the scale by.
std::string fp8MarginScale(const AttrMap &attrs);
inline const char *boolText(bool b) { return b ? "true" : "false"; }
/// The error of an op no family lowers.
llvm::Error unsupported(const Op &op);
inline const TensorType &operandType(const Op &op, unsigned i) { return op.operand(i)->type(); }
inline const TensorType &outputType(const Op &op) {
  return op.numResults() ? op.result()->type() : op.operand(0)->type();
}

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
  /// The last launch's blocks wait for each other (KernelLaunch::cooperative): the caller has
  /// checked that they fit the GPU at once.
  void cooperative() { lowering.launches.back().cooperative = true; }
  /// The last launch's kernel runs in clusters of `blocks` blocks (KernelText::clusterBlocks; the
  /// launch's blocks a multiple of it, compute capability 9.0).
  void cluster(int blocks) { kernels.back().clusterBlocks = blocks; }
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

} // namespace tgc
