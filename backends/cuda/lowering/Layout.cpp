// The layout family (layout.cuh): transposes (tiles for the last two axes, bytes for FP8),
// concatenation, slices and padding, and ZeRO's shard (a padded slice of a flattened parameter).
#include "backends/cuda/lowering/Families.h"

#include <fmt/format.h>

namespace tgc {

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
  if (op.kind() == OpKind::Shard) { // this rank's part of x flattened, zeros past its end
    int64_t part = out.numElements(), first = *a.getInt("rank") * part;
    e.elementwise("const float *x, float *out", part,
                  fmt::format("pad<{0}, 1, {0}, {1}, {2}>(x, out)", part, in.numElements(), -first));
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

} // namespace tgc
