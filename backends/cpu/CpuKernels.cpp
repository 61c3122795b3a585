// The CPU reference kernels: one eval function per op of ir/Ops.def, written plainly.
#include "backends/cpu/CpuKernels.h"

#include "backends/cpu/Fp8Scaling.h"
#include "backends/cpu/Schedule.h"
#include "backends/cpu/WorkerPool.h"
#include "support/ScalarMath.h"
#include "ir/Attributes.h"
#include "ir/Rope.h"
#include "support/Error.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <limits>
#include <numeric>

namespace tgc::cpu {




using Operands = llvm::ArrayRef<const Tensor *>;
using Results = llvm::MutableArrayRef<Tensor>;

/// Product of the dimensions before the last one: the number of rows of a row-wise op.
int64_t rows(const TensorType &t) { return t.rank() ? t.numElements() / t.dim(-1) : 1; }

llvm::Error evalInput(const AttrMap &, Operands, Results) { return makeError("leaves are bound, not run"); }
llvm::Error evalParam(const AttrMap &, Operands, Results) { return makeError("leaves are bound, not run"); }
llvm::Error evalState(const AttrMap &, Operands, Results) { return makeError("leaves are bound, not run"); }
llvm::Error evalAssign(const AttrMap &, Operands, Results) { return makeError("assigns are run by run()"); }

llvm::Error evalConstant(const AttrMap &attrs, Operands, Results out) {
  std::fill(out[0].data.begin(), out[0].data.end(), float(*attrs.getFloat("value")));
  return llvm::Error::success();
}

llvm::Error evalEmbedding(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &table = *in[0], &ids = *in[1];
  int64_t vocab = table.type.dim(0), dim = table.type.dim(1);
  for (int64_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids.ints[i];
    if (id < 0 || id >= vocab)
      return makeError("token id {} at position {} is outside the vocabulary [0, {})", id, i, vocab);
    std::copy_n(&table.data[id * dim], dim, &out[0].data[i * dim]);
  }
  return llvm::Error::success();
}


template <typename F> llvm::Error broadcastBinary(Operands in, Results out, F f) {
  const Tensor &a = *in[0], &b = *in[1];
  int64_t period = b.size(), n = a.size(); // (sizes computed once: each is a product of dims)
  for (int64_t i = 0; i < n; ++i)
    out[0].data[i] = f(a.data[i], b.data[i % period]);
  return llvm::Error::success();
}

llvm::Error evalAdd(const AttrMap &, Operands in, Results out) {
  return broadcastBinary(in, out, [](float x, float y) { return x + y; });
}
llvm::Error evalMul(const AttrMap &, Operands in, Results out) {
  return broadcastBinary(in, out, [](float x, float y) { return x * y; });
}

/// Elementwise maps: `cost` is an element's work in additions' worth, so that parallelFor
/// splits the transcendental ones (tanhf, expf: some 16 ns an element here) over the threads
/// where there are enough elements. Each element is its own, so the split changes no bit.
constexpr int64_t kCheap = 1, kTranscendental = 64;
template <typename F> llvm::Error unary(Operands in, Results out, F f, int64_t cost = kCheap) {
  const float *x = in[0]->data.data();
  float *y = out[0].data.data();
  parallelChunks(int64_t(out[0].data.size()), cost, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = f(x[i]);
  });
  return llvm::Error::success();
}

llvm::Error evalScale(const AttrMap &attrs, Operands in, Results out) {
  float factor = float(*attrs.getFloat("factor"));
  return unary(in, out, [factor](float x) { return x * factor; });
}

llvm::Error evalGelu(const AttrMap &, Operands in, Results out) {
  return unary(in, out, geluTanh, kTranscendental);
}

llvm::Error evalSilu(const AttrMap &, Operands in, Results out) {
  return unary(in, out, [](float x) { return x / (1.0f + std::exp(-x)); }, kTranscendental);
}

llvm::Error evalRope(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &x = *in[0];
  int64_t dh = x.type.dim(-1), half = dh / 2, rows = x.type.dim(-2), count = x.size() / dh;
  // Each position's cos, then sin: of rows 0 .. S - 1, or with positions of the cache's length.
  const Tensor *positions = in.size() > 1 ? in[1] : nullptr;
  int64_t length = positions ? *attrs.getInt("length") : rows, perSequence = count / x.type.dim(0);
  std::vector<float> table = ropeTable(ropeOptions(attrs), length, dh);
  for (int64_t r = 0; r < count; ++r) {
    const float *row = x.data.data() + r * dh;
    float *y = out[0].data.data() + r * dh;
    int64_t t = r % rows;
    if (positions) {
      int64_t b = r / perSequence, first = positions->ints[size_t(b)];
      if (first < 0 || first + rows > length)
        return makeError("position {} of sequence {} is outside rope's length [0, {})", first, b, length);
      t += first;
    }
    for (int64_t i = 0; i < half; ++i) {
      float a = row[i], b = row[i + half];
      rotatePair(a, b, table[size_t(t * half + i)], table[size_t((length + t) * half + i)]);
      y[i] = a;
      y[i + half] = b;
    }
  }
  return llvm::Error::success();
}

/// Mean (0 for RMSNorm) and 1 / sqrt(variance + eps) of one row, accumulated in double: the
/// statistics both norms and their gradients start from.
struct RowStats {
  double mean, rstd;
};
RowStats rowStats(const float *row, int64_t d, bool centered, double eps) {
  double mean = 0, var = 0;
  if (centered) {
    for (int64_t i = 0; i < d; ++i)
      mean += row[i];
    mean /= d;
  }
  for (int64_t i = 0; i < d; ++i)
    var += (row[i] - mean) * (row[i] - mean);
  var /= d;
  return {mean, 1.0 / std::sqrt(var + eps)};
}

/// LayerNorm (centered, with beta) or RMSNorm over the last axis.
llvm::Error normForward(const AttrMap &attrs, Operands in, Results out, bool centered) {
  const Tensor &x = *in[0], &gamma = *in[1];
  double eps = *attrs.getFloat("eps");
  int64_t d = x.type.dim(-1);
  for (int64_t r = 0; r < rows(x.type); ++r) {
    const float *row = &x.data[r * d];
    RowStats stats = rowStats(row, d, centered, eps);
    float mean = float(stats.mean), rstd = float(stats.rstd);
    for (int64_t i = 0; i < d; ++i) {
      float y = (row[i] - mean) * rstd * gamma.data[i];
      out[0].data[r * d + i] = centered ? y + in[2]->data[i] : y;
    }
  }
  return llvm::Error::success();
}

llvm::Error evalLayerNorm(const AttrMap &attrs, Operands in, Results out) {
  return normForward(attrs, in, out, /*centered=*/true);
}
llvm::Error evalRMSNorm(const AttrMap &attrs, Operands in, Results out) {
  return normForward(attrs, in, out, /*centered=*/false);
}

llvm::Error evalReshape(const AttrMap &, Operands in, Results out) {
  out[0].data = in[0]->data;
  out[0].ints = in[0]->ints;
  return llvm::Error::success();
}

llvm::Error evalTranspose(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &x = *in[0];
  std::vector<int64_t> perm = *attrs.getInts("perm");
  unsigned rank = x.type.rank();
  // Strides of the input, read in the output's dimension order.
  std::vector<int64_t> inStrides(rank, 1), permStrides(rank);
  for (int i = int(rank) - 2; i >= 0; --i)
    inStrides[i] = inStrides[i + 1] * x.type.shape[i + 1];
  for (unsigned i = 0; i < rank; ++i)
    permStrides[i] = inStrides[perm[i]];
  const Shape &outShape = out[0].type.shape;
  std::vector<int64_t> index(rank, 0);
  for (int64_t o = 0; o < out[0].size(); ++o) {
    int64_t offset = 0;
    for (unsigned i = 0; i < rank; ++i)
      offset += index[i] * permStrides[i];
    out[0].data[o] = x.data[offset];
    for (int i = int(rank) - 1; i >= 0 && ++index[i] == outShape[i]; --i)
      index[i] = 0;
  }
  return llvm::Error::success();
}

llvm::Error evalSlice(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &x = *in[0];
  int64_t axis = *attrs.getInt("axis"), start = *attrs.getInt("start");
  int64_t size = *attrs.getInt("size");
  int64_t inner = 1, outer = 1;
  for (unsigned i = axis + 1; i < x.type.rank(); ++i)
    inner *= x.type.shape[i];
  for (int64_t i = 0; i < axis; ++i)
    outer *= x.type.shape[i];
  int64_t extent = x.type.shape[axis];
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(&x.data[(o * extent + start) * inner], size * inner,
                &out[0].data[o * size * inner]);
  return llvm::Error::success();
}

llvm::Error evalCausalMask(const AttrMap &attrs, Operands in, Results out) {
  int64_t t = in[0]->type.dim(-1);
  float fill = float(attrs.getFloat("fill").value_or(-HUGE_VAL));
  out[0].data = in[0]->data;
  for (int64_t r = 0; r < rows(in[0]->type); ++r) {
    int64_t query = r % t;
    for (int64_t key = query + 1; key < t; ++key)
      out[0].data[r * t + key] = fill;
  }
  return llvm::Error::success();
}

/// Row-wise softmax or log-softmax, with the row maximum subtracted first.
llvm::Error softmaxRows(Operands in, Results out, bool log) {
  const Tensor &x = *in[0];
  int64_t d = x.type.dim(-1);
  parallelFor(rows(x.type), x.size() * 16, [&](int64_t r) {
    const float *row = &x.data[r * d];
    float *dst = &out[0].data[r * d];
    float max = *std::max_element(row, row + d);
    double sum = 0;
    for (int64_t i = 0; i < d; ++i)
      sum += std::exp(double(row[i]) - max);
    for (int64_t i = 0; i < d; ++i)
      dst[i] = log ? float(double(row[i]) - max - std::log(sum))
                   : float(std::exp(double(row[i]) - max) / sum);
  });
  return llvm::Error::success();
}

llvm::Error evalSoftmax(const AttrMap &, Operands in, Results out) { return softmaxRows(in, out, false); }
llvm::Error evalLogSoftmax(const AttrMap &, Operands in, Results out) {
  return softmaxRows(in, out, true);
}

llvm::Error evalNLLLoss(const AttrMap &, Operands in, Results out) {
  const Tensor &logp = *in[0], &targets = *in[1];
  int64_t vocab = logp.type.dim(-1);
  double sum = 0;
  for (int64_t i = 0; i < targets.size(); ++i) {
    int32_t t = targets.ints[i];
    if (t < 0 || t >= vocab)
      return makeError("target {} at position {} is outside the vocabulary [0, {})", t, i, vocab);
    sum -= logp.data[i * vocab + t];
  }
  out[0].data[0] = float(sum / double(targets.size()));
  return llvm::Error::success();
}

// Gradients.

llvm::Error evalReduceTo(const AttrMap &, Operands in, Results out) {
  int64_t period = out[0].size(), repeats = in[0]->size() / period;
  for (int64_t j = 0; j < period; ++j) {
    double sum = 0;
    for (int64_t i = 0; i < repeats; ++i)
      sum += in[0]->data[i * period + j];
    out[0].data[j] = float(sum);
  }
  return llvm::Error::success();
}

llvm::Error evalPad(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &x = *in[0];
  int64_t axis = *attrs.getInt("axis"), start = *attrs.getInt("start");
  int64_t size = *attrs.getInt("size"), extent = x.type.shape[axis];
  int64_t inner = 1, outer = 1;
  for (unsigned i = axis + 1; i < x.type.rank(); ++i)
    inner *= x.type.shape[i];
  for (int64_t i = 0; i < axis; ++i)
    outer *= x.type.shape[i];
  for (int64_t o = 0; o < outer; ++o)
    std::copy_n(&x.data[o * extent * inner], extent * inner,
                &out[0].data[(o * size + start) * inner]);
  return llvm::Error::success();
}

llvm::Error evalConcat(const AttrMap &attrs, Operands in, Results out) {
  int64_t axis = *attrs.getInt("axis"), total = out[0].type.shape[axis], start = 0;
  int64_t inner = 1, outer = 1;
  for (unsigned i = axis + 1; i < out[0].type.rank(); ++i)
    inner *= out[0].type.shape[i];
  for (int64_t i = 0; i < axis; ++i)
    outer *= out[0].type.shape[i];
  for (const Tensor *x : in) {
    int64_t extent = x->type.shape[axis];
    for (int64_t o = 0; o < outer; ++o)
      std::copy_n(&x->data[o * extent * inner], extent * inner, &out[0].data[(o * total + start) * inner]);
    start += extent;
  }
  return llvm::Error::success();
}

llvm::Error evalEmbeddingBackward(const AttrMap &, Operands in, Results out) {
  const Tensor &dy = *in[0], &ids = *in[1];
  int64_t vocab = out[0].type.dim(0), dim = out[0].type.dim(1);
  // Rows are accumulated in position order: the same sum every run.
  for (int64_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids.ints[i];
    if (id < 0 || id >= vocab)
      return makeError("token id {} at position {} is outside the vocabulary [0, {})", id, i, vocab);
    for (int64_t j = 0; j < dim; ++j)
      out[0].data[id * dim + j] += dy.data[i * dim + j];
  }
  return llvm::Error::success();
}

template <typename F> llvm::Error binaryMap(Operands in, Results out, F f, int64_t cost = kCheap) {
  const float *a = in[0]->data.data(), *b = in[1]->data.data();
  float *y = out[0].data.data();
  parallelChunks(out[0].size(), cost, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = f(a[i], b[i]);
  });
  return llvm::Error::success();
}

llvm::Error evalGeluBackward(const AttrMap &attrs, Operands in, Results out) {
  auto err = binaryMap(in, out, geluTanhGradient, kTranscendental);
  if (err || out.size() < 2)
    return err;
  // bias_grad: dx summed as reduce_to sums it.
  const Tensor &dx = out[0];
  return evalReduceTo(attrs, {&dx}, out.drop_front());
}

llvm::Error evalGeluInner(const AttrMap &, Operands in, Results out) {
  return unary(in, out, geluTanhInner, kTranscendental);
}
llvm::Error evalGeluOf(const AttrMap &, Operands in, Results out) { return binaryMap(in, out, geluTanhOf); }
llvm::Error evalGeluGradientOf(const AttrMap &, Operands in, Results out) {
  const float *dy = in[0]->data.data(), *x = in[1]->data.data(), *t = in[2]->data.data();
  float *y = out[0].data.data();
  parallelChunks(out[0].size(), 8, [&](int64_t, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      y[i] = geluTanhGradientOf(dy[i], x[i], t[i]);
  });
  return llvm::Error::success();
}

llvm::Error evalSiluBackward(const AttrMap &, Operands in, Results out) {
  return binaryMap(in, out, [](float dy, float x) {
    float s = 1.0f / (1.0f + std::exp(-x));
    return dy * s * (1.0f + x * (1.0f - s));
  }, kTranscendental);
}

/// Shared by layer_norm_backward and rms_norm_backward. With xhat the normalised row and
/// g = dy * gamma: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) for LayerNorm, and
/// dx = rstd * (g - xhat * mean(g * xhat)) for RMSNorm; plus dres where given (in fp32, as add).
llvm::Error normBackward(const AttrMap &attrs, Operands in, Results out, bool centered) {
  const Tensor &dy = *in[0], &x = *in[1], &gamma = *in[2];
  double eps = *attrs.getFloat("eps");
  int64_t d = x.type.dim(-1);
  std::vector<double> dgamma(d, 0.0), dbeta(d, 0.0), xhat(d);
  for (int64_t r = 0; r < rows(x.type); ++r) {
    const float *row = &x.data[r * d], *dyRow = &dy.data[r * d];
    auto [mean, rstd] = rowStats(row, d, centered, eps);
    double meanG = 0, meanGX = 0;
    for (int64_t i = 0; i < d; ++i) {
      xhat[i] = (row[i] - mean) * rstd;
      double g = double(dyRow[i]) * gamma.data[i];
      meanG += g;
      meanGX += g * xhat[i];
      dgamma[i] += double(dyRow[i]) * xhat[i];
      dbeta[i] += dyRow[i];
    }
    meanG = centered ? meanG / d : 0.0;
    meanGX /= d;
    for (int64_t i = 0; i < d; ++i) {
      double g = double(dyRow[i]) * gamma.data[i];
      float grad = float(rstd * (g - meanG - xhat[i] * meanGX));
      out[0].data[r * d + i] = in.size() > 3 ? in[3]->data[r * d + i] + grad : grad;
    }
  }
  for (int64_t i = 0; i < d; ++i) {
    out[1].data[i] = float(dgamma[i]);
    if (centered)
      out[2].data[i] = float(dbeta[i]);
  }
  return llvm::Error::success();
}

llvm::Error evalLayerNormBackward(const AttrMap &attrs, Operands in, Results out) {
  if (auto err = normBackward(attrs, in, out, /*centered=*/true); err || out.size() < 4)
    return err;
  // dx_sums: dx summed as reduce_to sums it.
  return evalReduceTo(attrs, {&out[0]}, out.drop_front(3));
}
llvm::Error evalRMSNormBackward(const AttrMap &attrs, Operands in, Results out) {
  return normBackward(attrs, in, out, /*centered=*/false);
}

llvm::Error evalSoftmaxBackward(const AttrMap &, Operands in, Results out) {
  const Tensor &dy = *in[0], &y = *in[1];
  int64_t d = y.type.dim(-1);
  for (int64_t r = 0; r < rows(y.type); ++r) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i)
      dot += double(dy.data[r * d + i]) * y.data[r * d + i];
    for (int64_t i = 0; i < d; ++i)
      out[0].data[r * d + i] = float(y.data[r * d + i] * (dy.data[r * d + i] - dot));
  }
  return llvm::Error::success();
}

llvm::Error evalLogSoftmaxBackward(const AttrMap &, Operands in, Results out) {
  const Tensor &dy = *in[0], &y = *in[1];
  int64_t d = y.type.dim(-1);
  for (int64_t r = 0; r < rows(y.type); ++r) {
    double sum = 0;
    for (int64_t i = 0; i < d; ++i)
      sum += dy.data[r * d + i];
    for (int64_t i = 0; i < d; ++i)
      out[0].data[r * d + i] = float(dy.data[r * d + i] - std::exp(double(y.data[r * d + i])) * sum);
  }
  return llvm::Error::success();
}

llvm::Error evalNLLLossBackward(const AttrMap &, Operands in, Results out) {
  const Tensor &dloss = *in[0], &targets = *in[2];
  int64_t vocab = out[0].type.dim(-1), n = targets.size();
  float g = float(-double(dloss.data[0]) / double(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t t = targets.ints[i];
    if (t < 0 || t >= vocab)
      return makeError("target {} at position {} is outside the vocabulary [0, {})", t, i, vocab);
    out[0].data[i * vocab + t] = g;
  }
  return llvm::Error::success();
}

// Precision.

Fp8Format formatOf(const AttrMap &attrs) {
  return fp8FormatOf(attrs);
}

// quantize {scaling="block"}: q in blocks of block_rows x 128, {the tensor's amax (given), q's
// largest block scale}, the count of values flushed to zero; its transpose from x again in 1 x
// 128 blocks along x's rows (block_rows 1: the blocks differ from q's), or q's transposed (128 x
// 128: the same blocks). The statistics are q's: the transpose's bytes are not counted again.
static llvm::Error quantizeInBlocks(const Tensor &x, float amax, const QuantizeOptions &options, bool transpose,
                                    Results out) {
  int64_t cols = x.type.dim(-1), rows = cols ? x.size() / cols : 0;
  BlockQuantizeStats stats =
      blockQuantize(x.data.data(), rows, cols, options.blockRows, options.format, out[0].data.data());
  out[1].data = {amax, stats.largestScale};
  out[2].data[0] = float(stats.flushed);
  if (!transpose)
    return llvm::Error::success();
  std::vector<float> xt(x.data.size());
  const std::vector<float> &source = options.blockRows == 1 ? x.data : out[0].data;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      xt[c * rows + r] = source[r * cols + c];
  if (options.blockRows == 1)
    blockQuantize(xt.data(), cols, rows, 1, options.format, out[3].data.data());
  else
    out[3].data = std::move(xt);
  return llvm::Error::success();
}

llvm::Error evalQuantize(const AttrMap &attrs, Operands in, Results out) {
  Tensor activated;
  QuantizeOptions options = quantizeOptions(attrs);
  if (options.activation == QuantizeActivation::Gelu) { // gelu(x), as the gelu op computes it
    activated = *in[0];
    for (float &v : activated.data)
      v = geluTanh(v);
  }
  bool transpose = options.transpose;
  if (options.activation == QuantizeActivation::GeluBackward) { // gelu_backward(x, h) as that op computes it, with its bias_grad
    llvm::SmallVector<Tensor, 2> results{Tensor::zeros(in[0]->type)};
    if (options.biasGrad)
      results.push_back(std::move(out.back()));
    if (auto err = evalGeluBackward(attrs, {in[0], in[3]}, results))
      return err;
    activated = std::move(results[0]);
    if (results.size() > 1)
      out.back() = std::move(results[1]);
  }
  if (options.activation == QuantizeActivation::Swiglu) { // swiglu(h), as the swiglu op computes it
    llvm::SmallVector<Tensor, 1> results{Tensor::zeros(TensorType(in[0]->type.dtype, out[0].type.shape))};
    if (auto err = evalSwiglu(attrs, {in[0]}, results))
      return err;
    activated = std::move(results[0]);
  }
  if (options.activation == QuantizeActivation::SwigluBackward) { // swiglu_backward(dy, h), as that op computes it
    llvm::SmallVector<Tensor, 1> results{Tensor::zeros(in[3]->type)};
    if (auto err = evalSwigluBackward(attrs, {in[0], in[3]}, results))
      return err;
    activated = std::move(results[0]);
  }
  if (options.activation == QuantizeActivation::CrossEntropyBackward) { // the loss and its dlogits, as cross_entropy gives them
    llvm::SmallVector<Tensor, 2> results{Tensor::zeros(out.back().type), Tensor::zeros(in[0]->type)};
    if (auto err = evalCrossEntropy(attrs, {in[0], in[3], in[4]}, results))
      return err;
    out.back() = std::move(results[0]);
    activated = std::move(results[1]);
  }
  const Tensor &x = activated.data.empty() ? *in[0] : activated;
  if (options.biasGrad && options.activation == QuantizeActivation::None) { // x's columns, as reduce_to sums them
    if (auto err = evalReduceTo(attrs, {&x}, out.take_back()))
      return err;
  }
  float scale = in[1]->data[0], scaleInv = in[2]->data[0];
  Fp8Format format = formatOf(attrs);
  float max = fp8Max(format), amax = 0.0f;
  for (float v : x.data) {
    amax = (std::isnan(v) || std::fabs(v) > amax) ? std::fabs(v) : amax;
  }
  if (options.blockScaling)
    return quantizeInBlocks(x, amax, options, transpose, out);
  if (options.currentScaling) {
    // Current scaling: the scale of the tensor's own amax, as fp8_update makes one from a
    // history's (1 where the amax is 0, inf or NaN).
    scale = currentScale(amax, format, int(options.margin));
    scaleInv = 1.0f / scale;
  }
  // In chunks over the threads: each element its own, the counts integers (no bit moves).
  int64_t n = x.size();
  std::vector<int64_t> saturated(size_t(chunkCount(n)), 0); // a count a chunk
  parallelChunks(n, 16, [&](int64_t c, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = x.data[i], scaled = v * scale;
      saturated[size_t(c)] += std::fabs(scaled) > max;
      // The tensor holds what a GEMM reads: the FP8 code times scale_inv.
      out[0].data[i] = roundToFp8(scaled, format) * scaleInv;
    }
  });
  out[1].data[0] = amax;
  out[2].data[0] = float(std::accumulate(saturated.begin(), saturated.end(), int64_t(0)));
  if (transpose) { // q as [R, C] transposed
    int64_t cols = x.type.dim(-1), rows = cols ? x.size() / cols : 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        out[3].data[c * rows + r] = out[0].data[r * cols + c];
  }
  return llvm::Error::success();
}

llvm::Error evalFp8Update(const AttrMap &attrs, Operands in, Results out) {
  ScalingState state;
  state.scale = in[1]->data[0];
  state.amaxHistory = in[0]->data;
  state.amaxHistory[0] = in[2]->data[0]; // the producer's amax goes into the current slot
  AmaxAlgo algo = attrs.getString("algo") == "most_recent" ? AmaxAlgo::MostRecent : AmaxAlgo::Max;
  updateScaling(state, formatOf(attrs), int(fp8Margin(attrs)), algo);
  out[0].data = std::move(state.amaxHistory);
  out[1].data[0] = state.scale;
  out[2].data[0] = state.scaleInv;
  if (out.size() > 4) // a block-scaled quantize's largest block scale
    out[4].data[0] = in[2]->data[1];
  out[3].data[0] = in[3]->data[0] + in[4]->data[0];
  return llvm::Error::success();
}

// Data parallelism: each result is its operand here; the interpreter then reduces the results
// over the ranks through its communicator, where it has one (Interpreter::setCommunicator).
llvm::Error evalAllReduce(const AttrMap &, Operands in, Results out) {
  for (size_t i = 0; i < in.size(); ++i)
    out[i] = *in[i];
  return llvm::Error::success();
}

// ZeRO: rank r's part of each operand flattened and zero-padded (ir/Ops.def). Here each rank's
// own values: the interpreter reduces or gathers over the ranks through its communicator
// (Interpreter::runCollective), where it has one.
llvm::Error evalShard(const AttrMap &a, Operands in, Results out) {
  int64_t n = out[0].type.numElements(), first = *a.getInt("rank") * n;
  const std::vector<float> &x = in[0]->data;
  for (int64_t i = 0; i < n && first + i < int64_t(x.size()); ++i)
    out[0].data[i] = x[first + i];
  return llvm::Error::success();
}

llvm::Error evalReduceScatter(const AttrMap &a, Operands in, Results out) {
  for (size_t i = 0; i < in.size(); ++i)
    if (llvm::Error err = evalShard(a, in.slice(i, 1), out.slice(i, 1)))
      return err;
  return llvm::Error::success();
}

llvm::Error evalAllGather(const AttrMap &, Operands in, Results out) {
  // (One rank: each result is its operand. More take the interpreter's communicator.)
  for (size_t i = 0; i < in.size(); ++i)
    std::copy(in[i]->data.begin(), in[i]->data.end(), out[i].data.begin());
  return llvm::Error::success();
}

// Optimizer.

llvm::Error evalSumSquares(const AttrMap &, Operands in, Results out) {
  double sum = 0;
  for (float v : in[0]->data)
    sum += double(v) * v;
  out[0].data[0] = float(sum);
  return llvm::Error::success();
}

llvm::Error evalClipScale(const AttrMap &attrs, Operands in, Results out) {
  double maxNorm = *attrs.getFloat("max_norm");
  double norm = std::sqrt(double(in[0]->data[0]));
  out[0].data[0] = !std::isfinite(norm) ? 0.0f // a step to skip (adamw)
                   : maxNorm > 0        ? float(std::min(1.0, maxNorm / (norm + 1e-6)))
                                        : 1.0f;
  return llvm::Error::success();
}

llvm::Error evalLRSchedule(const AttrMap &attrs, Operands in, Results out) {
  out[0].data[0] = float(learningRate(attrs, in[0]->ints[0]));
  return llvm::Error::success();
}

llvm::Error evalAdamW(const AttrMap &attrs, Operands in, Results out) {
  const Tensor &param = *in[0], &grad = *in[1], &m = *in[2], &v = *in[3];
  float lr = in[4]->data[0], clip = in[5]->data[0];
  int32_t step = in[6]->ints[0];
  if (step < 1)
    return makeError("step must be >= 1, got {}", step);
  double beta1 = *attrs.getFloat("beta1"), beta2 = *attrs.getFloat("beta2");
  float eps = float(*attrs.getFloat("eps"));
  float decay = float(1.0 - double(lr) * *attrs.getFloat("weight_decay"));
  // torch.optim.AdamW (single-tensor path): bias corrections in double, elementwise in float.
  double bc1 = 1.0 - std::pow(beta1, step), bc2 = 1.0 - std::pow(beta2, step);
  float stepSize = float(lr / bc1), bc2Sqrt = float(std::sqrt(bc2));
  float b1 = float(beta1), b2 = float(beta2);
  if (clip == 0.0f) { // clip_scale's skip: the gradients are not finite, nothing changes
    out[0].data = param.data;
    out[1].data = m.data;
    out[2].data = v.data;
    return llvm::Error::success();
  }
  for (size_t i = 0; i < param.data.size(); ++i) {
    float g = grad.data[i] * clip;
    float p = param.data[i] * decay;
    float mi = m.data[i] + (1.0f - b1) * (g - m.data[i]);
    float vi = v.data[i] * b2 + (1.0f - b2) * g * g;
    float denom = std::sqrt(vi) / bc2Sqrt + eps;
    out[0].data[i] = p - stepSize * (mi / denom);
    out[1].data[i] = mi;
    out[2].data[i] = vi;
  }
  return llvm::Error::success();
}


} // namespace tgc::cpu
