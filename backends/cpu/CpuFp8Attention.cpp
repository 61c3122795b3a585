// CPU reference of fp8_attention and its gradient: the emulation of cuDNN's FP8 attention
// (Fp8Attention.h) on the packed rows the IR holds. FP8 operands arrive as the interpreter holds
// every FP8 tensor, codes times their scale_inv, so the emulation's q, k, v and dout descales
// are 1 (the ops' q_scale_inv and dout_scale_inv are the GPU's); S's and dP's scales are the
// ops' state operands; out and dqkv are BF16 values.
#include "backends/cpu/CpuKernels.h"
#include "backends/cpu/Fp8Attention.h"
#include "ir/Attributes.h"

namespace tgc::cpu {

namespace {

/// The emulation's shape of an attention over packed rows [B, T, 3D].
Fp8AttentionShape shapeOf(const AttrMap &a, const TensorType &packed) {
  Fp8AttentionShape s;
  s.B = packed.dim(0), s.T = packed.dim(1), s.H = a.getInt("heads").value_or(1);
  s.DH = packed.dim(2) / (3 * s.H);
  s.scale = float(a.getFloat("scale").value_or(1.0));
  return s;
}

/// Part `part` (0 q, 1 k, 2 v) of rows [B, T, parts * D] as head-major [B, H, T, DH].
std::vector<float> headsOf(const Fp8AttentionShape &s, const Tensor &rows, int64_t part, int64_t parts) {
  const int64_t D = s.H * s.DH;
  std::vector<float> heads(size_t(s.B * s.H * s.T * s.DH));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.DH; ++d)
          heads[size_t(((b * s.H + h) * s.T + t) * s.DH + d)] =
              rows.data[size_t((b * s.T + t) * parts * D + part * D + h * s.DH + d)];
  return heads;
}

/// Head-major `heads` into part `part` of rows [B, T, parts * D].
void toRows(const Fp8AttentionShape &s, const std::vector<float> &heads, Tensor &rows, int64_t part, int64_t parts) {
  const int64_t D = s.H * s.DH;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t h = 0; h < s.H; ++h)
        for (int64_t d = 0; d < s.DH; ++d)
          rows.data[size_t((b * s.T + t) * parts * D + part * D + h * s.DH + d)] =
              heads[size_t(((b * s.H + h) * s.T + t) * s.DH + d)];
}

} // namespace

llvm::Error evalFp8Attention(const AttrMap &a, Operands in, Results out) {
  Fp8AttentionShape s = shapeOf(a, in[0]->type);
  Fp8AttentionScales c;
  c.scaleS = in[2]->data[0], c.descaleS = in[3]->data[0];
  Fp8AttentionForward f = fp8AttentionForward(s, headsOf(s, *in[0], 0, 3), headsOf(s, *in[0], 1, 3),
                                              headsOf(s, *in[0], 2, 3), c);
  toRows(s, f.out, out[0], 0, 1);
  out[1].data = std::move(f.stats); // [B, H, T], as lse
  out[2].data[0] = f.amaxS;
  return llvm::Error::success();
}

llvm::Error evalFp8AttentionBackward(const AttrMap &a, Operands in, Results out) {
  Fp8AttentionShape s = shapeOf(a, in[1]->type);
  s.grad = in[0]->type.dtype == DType::F8E5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  Fp8AttentionScales c;
  c.scaleS = in[6]->data[0], c.descaleS = in[7]->data[0];
  c.scaleDP = in[8]->data[0], c.descaleDP = in[9]->data[0];
  Fp8AttentionGradients g =
      fp8AttentionBackward(s, headsOf(s, *in[1], 0, 3), headsOf(s, *in[1], 1, 3), headsOf(s, *in[1], 2, 3),
                           headsOf(s, *in[2], 0, 1), headsOf(s, *in[0], 0, 1), c);
  toRows(s, g.dq, out[0], 0, 3);
  toRows(s, g.dk, out[0], 1, 3);
  toRows(s, g.dv, out[0], 2, 3);
  out[1].data[0] = g.amaxDP;
  return llvm::Error::success();
}

} // namespace tgc::cpu
