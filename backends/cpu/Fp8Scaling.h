// FP8 delayed scaling (Transformer Engine's DelayedScaling, fp8.md): quantization of one tensor
// and the update of its scaling state after each step.
#pragma once

#include "backends/Tensor.h"
#include "models/ModelConfig.h"
#include "support/Numerics.h"

#include <map>
#include <string>
#include <vector>

namespace tgc {

enum class AmaxAlgo { Max, MostRecent };

struct ScalingState {
  float scale = 1.0f;    // step 1 quantizes with scale 1
  float scaleInv = 1.0f; // what the GEMM multiplies back
  std::vector<float> amaxHistory; // [0] is the current step's slot
};

/// After a step whose amax was recorded into amaxHistory[0]: the amax to scale by (the
/// history's max, or the current slot), the roll (new[i] = old[i+1], new[L-1] = old[0], then
/// new[0] = 0) and the new scale: (fp8_max / amax) / 2^margin when amax is finite and > 0, else
/// the old one; an infinite scale becomes FLT_MAX.
void updateScaling(ScalingState &state, Fp8Format format, int margin, AmaxAlgo algo);

/// (fp8_max / amax) / 2^margin where amax is finite and > 0 (an infinite result becomes FLT_MAX),
/// else `fallback`: the scale delayed scaling takes from a history's amax.
float scaleFromAmax(float amax, Fp8Format format, int margin, float fallback);
/// Current scaling's scale of a tensor whose amax is `amax` (1 where it is 0, inf or NaN).
float currentScale(float amax, Fp8Format format, int margin);

/// Block scaling's scale (Transformer Engine's Float8BlockScaling with its default power-of-two
/// scales): fp8_max / amax rounded down to a power of two (its mantissa bits cleared), FLT_MAX's
/// (2^127) where that ratio is infinite, and 1 where the amax is 0, inf or NaN.
float blockScale(float amax, Fp8Format format);

/// What blockQuantize saw: the nonzero values that became zero (a power-of-two scale from the
/// block's own amax saturates nothing: flushing is what the recipe loses), and the largest scale
/// of a block whose amax is finite and nonzero (0 where none is).
struct BlockQuantizeStats {
  int64_t flushed = 0;
  float largestScale = 0.0f;
};

/// The values a GEMM reads of x [rows, cols] quantized in blocks of blockRows x 128 (blockRows
/// 1 or 128; cols, and rows where blockRows is 128, multiples of 128): each FP8 code times its
/// block's 1 / blockScale. Writes them to `q` (rows x cols).
BlockQuantizeStats blockQuantize(const float *x, int64_t rows, int64_t cols, int64_t blockRows, Fp8Format format,
                                 float *q);

/// One quantized tensor's scaling state, as `tgc inspect` shows it.
struct Fp8TensorSummary {
  std::string site;   // the GEMM: h0.attn.qkv, lm_head, ...
  std::string role;   // input | weight | grad_output
  std::string format; // e4m3 | e5m2
  float scale = 0, scaleInv = 0;
  std::vector<float> newestAmax; // newest first
  double saturations = 0;        // elements clipped to the largest finite value, all steps
  int64_t historyLength = 0;
  /// Under block scaling the scale and history go unread: the newest step's block scales range
  /// from the smallest (the block of the newest amax) to the largest (0: no nonzero block yet),
  /// and `saturations` counts the values flushed to zero instead (nothing saturates).
  bool blockScaled = false;
  float smallestBlockScale = 0, largestBlockScale = 0;
};

/// The FP8 state among a program's state tensors (names `<site>.fp8.<role>.scale`, ...), in
/// name order.
std::vector<Fp8TensorSummary> summarizeFp8State(const std::map<std::string, Tensor> &tensors,
                                                const PrecisionConfig &precision,
                                                size_t newest = 4);

} // namespace tgc
