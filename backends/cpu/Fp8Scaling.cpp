#include "backends/cpu/Fp8Scaling.h"

#include "models/ProgramInterface.h"
#include "support/ScalarMath.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tgc {

float scaleFromAmax(float amax, Fp8Format format, int margin, float fallback) {
  return scaleFromAmax(amax, fp8Max(format), std::exp2(float(margin)), fallback);
}

float currentScale(float amax, Fp8Format format, int margin) { return scaleFromAmax(amax, format, margin, 1.0f); }

float blockScale(float amax, Fp8Format format) {
  if (!std::isfinite(amax) || amax == 0.0f)
    return 1.0f;
  float scale = fp8Max(format) / amax;
  if (std::isinf(scale))
    scale = FLT_MAX;
  uint32_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  bits &= 0xFF800000u; // the sign and exponent: the power of two at or below
  std::memcpy(&scale, &bits, sizeof bits);
  return scale;
}

BlockQuantizeStats blockQuantize(const float *x, int64_t rows, int64_t cols, int64_t blockRows, Fp8Format format,
                                 float *q) {
  BlockQuantizeStats stats;
  for (int64_t r0 = 0; r0 < rows; r0 += blockRows)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      int64_t r1 = std::min(rows, r0 + blockRows), c1 = std::min(cols, c0 + 128);
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          float v = x[r * cols + c];
          amax = (std::isnan(v) || std::fabs(v) > amax) ? std::fabs(v) : amax;
        }
      float scale = blockScale(amax, format), scaleInv = 1.0f / scale;
      if (std::isfinite(amax) && amax > 0.0f)
        stats.largestScale = std::max(stats.largestScale, scale);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          float v = x[r * cols + c];
          float value = roundToFp8(v * scale, format) * scaleInv;
          stats.flushed += v != 0.0f && value == 0.0f; // (a NaN stays NaN)
          q[r * cols + c] = value;
        }
    }
  return stats;
}

void updateScaling(ScalingState &state, Fp8Format format, int margin, AmaxAlgo algo) {
  std::vector<float> &h = state.amaxHistory;
  if (h.empty())
    return;
  // Taken before the roll. A NaN anywhere makes the max NaN (and the old scale stays).
  float amax = h[0];
  if (algo == AmaxAlgo::Max)
    for (float a : h)
      amax = (std::isnan(a) || a > amax) ? a : amax;
  std::rotate(h.begin(), h.begin() + 1, h.end());
  h[0] = 0.0f;
  state.scale = scaleFromAmax(amax, format, margin, state.scale);
  state.scaleInv = 1.0f / state.scale;
}

std::vector<Fp8TensorSummary> summarizeFp8State(const std::map<std::string, Tensor> &tensors,
                                                const PrecisionConfig &precision, size_t newest) {
  std::vector<Fp8TensorSummary> out;
  const std::string marker = program::kFp8Marker.str(), suffix = ".scale";
  for (const auto &[name, scale] : tensors) {
    size_t at = name.find(marker);
    if (at == std::string::npos || name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::string prefix = name.substr(0, name.size() - suffix.size());
    auto history = tensors.find(prefix + ".amax_history");
    auto scaleInv = tensors.find(prefix + ".scale_inv");
    auto saturations = tensors.find(prefix + ".saturations");
    if (history == tensors.end() || scaleInv == tensors.end() || saturations == tensors.end())
      continue;
    Fp8TensorSummary s;
    s.site = name.substr(0, at);
    s.role = prefix.substr(at + marker.size());
    // A GEMM's output gradient in the gradient's format; the rest E4M3 (FP8 attention's dout
    // and dS too: assign-precision's choice, cuDNN's FP8 gradient's format).
    s.format = s.role == program::fp8RoleName(program::Fp8Role::GradOutput) && precision.fp8Format == Fp8Formats::Hybrid ? "e5m2" : "e4m3";
    s.scale = scale.data[0];
    s.scaleInv = scaleInv->second.data[0];
    s.saturations = saturations->second.data[0];
    const std::vector<float> &h = history->second.data;
    s.historyLength = int64_t(h.size());
    // After each update the step's amax sits at the end and slot 0 is the cleared current one.
    for (size_t i = h.size(); i-- > 1 && s.newestAmax.size() < newest;)
      s.newestAmax.push_back(h[i]);
    if (h.size() == 1)
      s.newestAmax.push_back(h[0]);
    if (auto largest = tensors.find(prefix + ".block_scale_max"); largest != tensors.end()) {
      s.blockScaled = true;
      s.largestBlockScale = largest->second.data[0];
      float amax = s.newestAmax.empty() ? 0.0f : s.newestAmax[0];
      s.smallestBlockScale = amax > 0.0f ? blockScale(amax, s.format == "e5m2" ? Fp8Format::E5M2 : Fp8Format::E4M3) : 0.0f;
    }
    out.push_back(std::move(s));
  }
  return out;
}

} // namespace tgc
