#include "backends/cpu/Fp8Attention.h"

#include "backends/cpu/WorkerPool.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tgc {

namespace {

constexpr int64_t kKeyTile = 128; // cuDNN's tile of keys in the online softmax

/// One (sequence, head)'s operands: row t of a head-major [B][H][T][DH] tensor.
struct Head {
  const float *base;
  int64_t DH;
  const float *row(int64_t t) const { return base + t * DH; }
};

float dot(const float *a, const float *b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += a[i] * b[i];
  return s;
}

/// The dequantized scaled scores of query i against keys [0, i] (causal).
void scoresOf(const Fp8AttentionShape &s, Head q, Head k, int64_t i, const Fp8AttentionScales &c, float *out) {
  for (int64_t j = 0; j <= i; ++j)
    out[j] = dot(q.row(i), k.row(j), s.DH) * s.scale * c.descaleQ * c.descaleK;
}

float maxAbs(const std::vector<float> &x) {
  float m = 0;
  for (float v : x)
    m = std::max(m, std::fabs(v));
  return m;
}

} // namespace

float storeScaled(float x, float scale, std::optional<Fp8Format> format) {
  return format ? roundToFp8(x * scale, *format) : roundToBf16(x * scale);
}

Fp8AttentionForward fp8AttentionForward(const Fp8AttentionShape &s, const std::vector<float> &q,
                                        const std::vector<float> &k, const std::vector<float> &v,
                                        const Fp8AttentionScales &c) {
  const int64_t T = s.T, DH = s.DH, heads = s.B * s.H;
  Fp8AttentionForward f;
  std::vector<float> o(size_t(heads * T * DH)), amaxS(size_t(heads * T), 0.0f);
  f.stats.assign(size_t(heads * T), 0.0f);
  cpu::parallelFor(heads * T, T * DH * T / 2, [&](int64_t row) {
    const int64_t h = row / T, i = row % T;
    Head qh{q.data() + h * T * DH, DH}, kh{k.data() + h * T * DH, DH}, vh{v.data() + h * T * DH, DH};
    std::vector<float> scores(static_cast<size_t>(i + 1)), acc(static_cast<size_t>(DH), 0.0f);
    scoresOf(s, qh, kh, i, c, scores.data());
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    for (int64_t start = 0; start <= i; start += kKeyTile) {
      const int64_t end = std::min(i + 1, start + kKeyTile);
      float tileMax = *std::max_element(scores.begin() + start, scores.begin() + end);
      float mNew = std::max(m, tileMax), correction = std::isinf(m) ? 0.0f : std::exp(m - mNew);
      for (float &a : acc)
        a *= correction;
      l *= correction;
      for (int64_t j = start; j < end; ++j) {
        float p = std::exp(scores[size_t(j)] - mNew);
        l += p;
        float p8 = roundToFp8(p * c.scaleS, Fp8Format::E4M3) * c.descaleS * c.descaleV;
        for (int64_t d = 0; d < DH; ++d)
          acc[size_t(d)] += p8 * vh.row(j)[d];
      }
      m = mNew;
    }
    for (int64_t j = 0; j <= i; ++j) // the normalised probabilities' amax
      amaxS[size_t(row)] = std::max(amaxS[size_t(row)], std::exp(scores[size_t(j)] - m) / l);
    for (int64_t d = 0; d < DH; ++d)
      o[size_t(row * DH + d)] = acc[size_t(d)] / l;
    f.stats[size_t(row)] = m + std::log(l);
  });
  f.amaxS = *std::max_element(amaxS.begin(), amaxS.end());
  f.amaxO = maxAbs(o);
  f.out.resize(o.size());
  for (size_t i = 0; i < o.size(); ++i)
    f.out[i] = storeScaled(o[i], c.scaleO, s.out);
  return f;
}

Fp8AttentionGradients fp8AttentionBackward(const Fp8AttentionShape &s, const std::vector<float> &q,
                                           const std::vector<float> &k, const std::vector<float> &v,
                                           const std::vector<float> &out, const std::vector<float> &dout,
                                           const Fp8AttentionScales &c) {
  const int64_t T = s.T, DH = s.DH, heads = s.B * s.H;
  std::vector<float> dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f), amaxDP(size_t(heads), 0.0f);
  // One (sequence, head) a task: its dk and dv sum over its queries.
  cpu::parallelFor(heads, T * T * DH * 2, [&](int64_t h) {
    const int64_t at = h * T * DH;
    Head qh{q.data() + at, DH}, kh{k.data() + at, DH}, vh{v.data() + at, DH};
    Head oh{out.data() + at, DH}, doh{dout.data() + at, DH};
    std::vector<float> scores(static_cast<size_t>(T)), p(static_cast<size_t>(T)), dS(static_cast<size_t>(T * T));
    float amax = 0;
    for (int64_t i = 0; i < T; ++i) {
      scoresOf(s, qh, kh, i, c, scores.data());
      float m = *std::max_element(scores.begin(), scores.begin() + i + 1), l = 0;
      for (int64_t j = 0; j <= i; ++j)
        l += p[size_t(j)] = std::exp(scores[size_t(j)] - m);
      float D = dot(oh.row(i), doh.row(i), DH) * c.descaleO * c.descaleDO;
      for (int64_t j = 0; j <= i; ++j) {
        p[size_t(j)] /= l;
        float p8 = roundToFp8(p[size_t(j)] * c.scaleS, Fp8Format::E4M3) * c.descaleS * c.descaleDO;
        for (int64_t d = 0; d < DH; ++d)
          dv[size_t(at + j * DH + d)] += p8 * doh.row(i)[d];
        float dP = dot(doh.row(i), vh.row(j), DH) * c.descaleDO * c.descaleV;
        float g = p[size_t(j)] * (dP - D) * s.scale;
        amax = std::max(amax, std::fabs(g));
        dS[size_t(i * T + j)] = roundToFp8(g * c.scaleDP, s.grad) * c.descaleDP;
      }
    }
    amaxDP[size_t(h)] = amax;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        float g = dS[size_t(i * T + j)];
        for (int64_t d = 0; d < DH; ++d) {
          dq[size_t(at + i * DH + d)] += g * kh.row(j)[d] * c.descaleK;
          dk[size_t(at + j * DH + d)] += g * qh.row(i)[d] * c.descaleQ;
        }
      }
  });
  Fp8AttentionGradients g;
  g.amaxDP = *std::max_element(amaxDP.begin(), amaxDP.end());
  g.amaxDQ = maxAbs(dq);
  g.amaxDK = maxAbs(dk);
  g.amaxDV = maxAbs(dv);
  auto store = [&](std::vector<float> &x, float scale) {
    for (float &e : x)
      e = storeScaled(e, scale, s.dqkv);
    return std::move(x);
  };
  g.dq = store(dq, c.scaleDQ);
  g.dk = store(dk, c.scaleDK);
  g.dv = store(dv, c.scaleDV);
  return g;
}

} // namespace tgc
