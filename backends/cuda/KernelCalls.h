// What the per-op lowering (Lowering.cpp) and the optimizer's program-level grouping
// (OptimizerGroups.cpp) share: the wrapper every generated kernel is, the AdamW call, and
// launch shapes that must agree for the grouped kernels to give the per-op kernels' bits.
#pragma once

#include "backends/cuda/Lowering.h"

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

/// Rewrites the optimizer's lowering over the contiguous parameter layout: every AdamW op as
/// one launch, and the gradient norm's sum_squares and adds as one pair of launches, where
/// their conditions hold (the same bits as one kernel per op). `sources` holds each op's
/// kernels; the replaced ops' kernels go and the grouped kernels come in.
void groupOptimizer(const std::vector<Op *> &ops, CudaProgram &program,
                    std::vector<std::vector<KernelText>> &kernels);

} // namespace tgc
