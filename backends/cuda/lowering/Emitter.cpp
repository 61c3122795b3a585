#include "backends/cuda/lowering/Emitter.h"
#include "backends/cuda/lowering/Families.h"
#include "support/Error.h"

#include "support/Numerics.h"

#include <algorithm>
#include <cmath>

namespace tgc {

std::string lit(double v) {
  float f = float(v);
  if (std::isinf(f))
    return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  return formatDouble(double(f)) + "f";
}

const char *cType(DType dtype) {
  if (isFp8(dtype))
    return "unsigned char";
  return dtype == DType::I32 ? "int" : "float";
}

const char *fp8Interpretation(const AttrMap &attrs) {
  return fp8FormatOf(attrs) == Fp8Format::E5M2 ? "__NV_E5M2" : "__NV_E4M3";
}
double fp8Largest(const AttrMap &attrs) { return fp8Max(fp8FormatOf(attrs)); }
std::string fp8MarginScale(const AttrMap &attrs) { return lit(std::ldexp(1.0, int(fp8Margin(attrs)))); }

llvm::Error unsupported(const Op &op) {
  GpuLoweringInfo info = gpuLoweringOf(op.kind());
  std::string why = info.how == GpuLowering::NotYet && info.where ? info.where
                                                                 : "the GPU backend runs gpuPipeline's programs";
  return makeError("error: %{} = {} has no GPU lowering yet ({})", op.numResults() ? op.result()->name().c_str() : "",
                   op.name().str().c_str(), why);
}

std::string kernelSource(const KernelText &k) {
  std::string bounds = k.minBlocks ? fmt::format("__launch_bounds__({}, {}) ", k.threads, k.minBlocks)
                       : k.threads == kThreads ? ""
                                               : fmt::format("__launch_bounds__({}) ", k.threads);
  if (k.clusterBlocks)
    bounds = fmt::format("__cluster_dims__({}, 1, 1) ", k.clusterBlocks) + bounds;
  return fmt::format("{}\nextern \"C\" __global__ void {}{}({}) {{\n  {}{}\n}}\n\n", k.comment, bounds, k.name,
                     k.params, k.awaitsItself ? "" : "awaitPreviousKernel(); ", k.call);
}

int64_t elementwiseBlocks(int64_t count) { return std::min<int64_t>((count + 255) / 256, 8192); }

int64_t normBlocks(int64_t rows, int64_t width) { return width <= 1024 ? (rows + 7) / 8 : rows; }

int64_t sumSquaresBlocks(int64_t count) { return std::min<int64_t>(1024, (count + 2047) / 2048); }

} // namespace tgc
