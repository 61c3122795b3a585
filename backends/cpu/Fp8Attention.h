// FP8 attention on the CPU as cuDNN's FP8 fused attention computes it (the arithmetic of
// cudnn_frontend's reference, test/python/sdpa/fp8_ref.py): the reference cuDNN's results are
// compared with (GpuFp8AttentionTest.cpp). Causal, one head of keys per query head.
//
// Forward: scores = q k^T descaleQ descaleK scale; an online softmax over tiles of 128 keys,
// each tile's unnormalised probabilities exp(s - running max) quantized to E4M3 at scaleS and
// multiplied by v (times descaleS descaleV); the output normalised at the end, then stored at
// scaleO in the output's type. Gradient: the normalised probabilities P from the scores, dv =
// E4M3(P scaleS)^T dout descaleS descaleDO, dP = dout v^T descaleDO descaleV, D = rowsum(out
// dout) descaleO descaleDO, dS = P (dP - D) scale, quantized at scaleDP to the gradient's type;
// dq = dS k descaleDP descaleK, dk = dS^T q descaleDP descaleQ, each stored at its scale.
#pragma once

#include "support/Numerics.h"

#include <cstdint>
#include <optional>
#include <vector>

namespace tgc {

struct Fp8AttentionShape {
  int64_t B = 0, T = 0, H = 0, DH = 0;
  float scale = 1;
  std::optional<Fp8Format> out;  // the forward's output: FP8, or BF16 where none
  Fp8Format grad = Fp8Format::E4M3; // dout and dS
  std::optional<Fp8Format> dqkv; // dq, dk, dv: FP8, or BF16 where none
};

/// The factors into FP8 (scale) and out of it (descale) of each quantized tensor.
struct Fp8AttentionScales {
  float descaleQ = 1, descaleK = 1, descaleV = 1, scaleS = 1, descaleS = 1, scaleO = 1;
  float descaleO = 1, descaleDO = 1, scaleDP = 1, descaleDP = 1, scaleDQ = 1, scaleDK = 1, scaleDV = 1;
};

/// The values stored (FP8 values decoded, or BF16 values), head-major [B][H][T][DH]; the
/// statistics (log-sum-exp of the scores) [B][H][T]; amaxes of the values before their scale.
struct Fp8AttentionForward {
  std::vector<float> out, stats;
  float amaxS = 0, amaxO = 0;
};
struct Fp8AttentionGradients {
  std::vector<float> dq, dk, dv;
  float amaxDP = 0, amaxDQ = 0, amaxDK = 0, amaxDV = 0;
};

/// q, k, v: the E4M3 values (decoded, not descaled), head-major.
Fp8AttentionForward fp8AttentionForward(const Fp8AttentionShape &shape, const std::vector<float> &q,
                                        const std::vector<float> &k, const std::vector<float> &v,
                                        const Fp8AttentionScales &scales);
/// out: the forward's stored output; dout: values in the gradient's format; both head-major.
Fp8AttentionGradients fp8AttentionBackward(const Fp8AttentionShape &shape, const std::vector<float> &q,
                                           const std::vector<float> &k, const std::vector<float> &v,
                                           const std::vector<float> &out, const std::vector<float> &dout,
                                           const Fp8AttentionScales &scales);

/// x stored at `scale` in `format` (FP8 decoded, or BF16 where none).
float storeScaled(float x, float scale, std::optional<Fp8Format> format);

} // namespace tgc
