#include "runtime/Interpreter.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>

namespace tgc {
namespace {

template <typename... Args>
llvm::Error fail(fmt::format_string<Args...> format, Args &&...args) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 fmt::format(format, std::forward<Args>(args)...));
}

using Operands = llvm::ArrayRef<const Tensor *>;
using Results = llvm::MutableArrayRef<Tensor>;

/// Product of the dimensions before the last one: the number of rows of a row-wise op.
int64_t rows(const TensorType &t) { return t.rank() ? t.numElements() / t.dim(-1) : 1; }

llvm::Error evalInput(const Op &, Operands, Results) { return fail("leaves are bound, not run"); }
llvm::Error evalParam(const Op &, Operands, Results) { return fail("leaves are bound, not run"); }

llvm::Error evalEmbedding(const Op &op, Operands in, Results out) {
  const Tensor &table = *in[0], &ids = *in[1];
  int64_t vocab = table.type.dim(0), dim = table.type.dim(1);
  for (int64_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids.ints[i];
    if (id < 0 || id >= vocab)
      return fail("token id {} at position {} is outside the vocabulary [0, {})", id, i, vocab);
    std::copy_n(&table.data[id * dim], dim, &out[0].data[i * dim]);
  }
  return llvm::Error::success();
}

/// Row-major copy of the [rows, cols] matrix `src` (or of its transpose when `transpose`).
void packMatrix(const float *src, int64_t r, int64_t c, bool transpose, std::vector<float> &dst) {
  dst.resize(r * c);
  if (!transpose) {
    std::copy_n(src, r * c, dst.data());
    return;
  }
  // src is stored [c, r]; dst[i][j] = src[j][i].
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      dst[i * c + j] = src[j * r + i];
}

/// Dot product with eight partial sums, always summed in the same order.
float dot(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i)
    acc[i % 8] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

llvm::Error evalMatMul(const Op &op, Operands in, Results out) {
  const Tensor &a = *in[0], &b = *in[1];
  bool ta = op.attrs().getBool("transpose_a").value_or(false);
  bool tb = op.attrs().getBool("transpose_b").value_or(false);
  int64_t m = out[0].type.dim(-2), n = out[0].type.dim(-1);
  int64_t k = ta ? a.type.dim(-2) : a.type.dim(-1);
  int64_t batches = a.size() / (m * k);
  bool sharedB = b.type.rank() == 2;
  // Pack A as [m, k] and B as [n, k] so every output is a contiguous dot product.
  std::vector<float> packedA, packedB;
  for (int64_t batch = 0; batch < batches; ++batch) {
    packMatrix(&a.data[batch * m * k], m, k, ta, packedA);
    if (batch == 0 || !sharedB)
      packMatrix(&b.data[sharedB ? 0 : batch * k * n], n, k, !tb, packedB);
    float *c = &out[0].data[batch * m * n];
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] = dot(&packedA[i * k], &packedB[j * k], k);
  }
  return llvm::Error::success();
}

template <typename F> llvm::Error broadcastBinary(Operands in, Results out, F f) {
  const Tensor &a = *in[0], &b = *in[1];
  int64_t period = b.size();
  for (int64_t i = 0; i < a.size(); ++i)
    out[0].data[i] = f(a.data[i], b.data[i % period]);
  return llvm::Error::success();
}

llvm::Error evalAdd(const Op &, Operands in, Results out) {
  return broadcastBinary(in, out, [](float x, float y) { return x + y; });
}
llvm::Error evalMul(const Op &, Operands in, Results out) {
  return broadcastBinary(in, out, [](float x, float y) { return x * y; });
}

template <typename F> llvm::Error unary(Operands in, Results out, F f) {
  std::transform(in[0]->data.begin(), in[0]->data.end(), out[0].data.begin(), f);
  return llvm::Error::success();
}

llvm::Error evalScale(const Op &op, Operands in, Results out) {
  float factor = float(*op.attrs().getFloat("factor"));
  return unary(in, out, [factor](float x) { return x * factor; });
}

llvm::Error evalGelu(const Op &, Operands in, Results out) {
  // GELU with the tanh approximation, as GPT-2 and TE use.
  return unary(in, out, [](float x) {
    const float c = 0.7978845608028654f; // sqrt(2 / pi)
    return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
  });
}

llvm::Error evalSilu(const Op &, Operands in, Results out) {
  return unary(in, out, [](float x) { return x / (1.0f + std::exp(-x)); });
}

llvm::Error evalLayerNorm(const Op &op, Operands in, Results out) {
  const Tensor &x = *in[0], &gamma = *in[1], &beta = *in[2];
  double eps = *op.attrs().getFloat("eps");
  int64_t d = x.type.dim(-1);
  for (int64_t r = 0; r < rows(x.type); ++r) {
    const float *row = &x.data[r * d];
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i)
      mean += row[i];
    mean /= d;
    for (int64_t i = 0; i < d; ++i)
      var += (row[i] - mean) * (row[i] - mean);
    var /= d;
    float rstd = float(1.0 / std::sqrt(var + eps));
    for (int64_t i = 0; i < d; ++i)
      out[0].data[r * d + i] = (row[i] - float(mean)) * rstd * gamma.data[i] + beta.data[i];
  }
  return llvm::Error::success();
}

llvm::Error evalRMSNorm(const Op &op, Operands in, Results out) {
  const Tensor &x = *in[0], &gamma = *in[1];
  double eps = *op.attrs().getFloat("eps");
  int64_t d = x.type.dim(-1);
  for (int64_t r = 0; r < rows(x.type); ++r) {
    const float *row = &x.data[r * d];
    double sumSquares = 0;
    for (int64_t i = 0; i < d; ++i)
      sumSquares += double(row[i]) * row[i];
    float rrms = float(1.0 / std::sqrt(sumSquares / d + eps));
    for (int64_t i = 0; i < d; ++i)
      out[0].data[r * d + i] = row[i] * rrms * gamma.data[i];
  }
  return llvm::Error::success();
}

llvm::Error evalReshape(const Op &, Operands in, Results out) {
  out[0].data = in[0]->data;
  out[0].ints = in[0]->ints;
  return llvm::Error::success();
}

llvm::Error evalTranspose(const Op &op, Operands in, Results out) {
  const Tensor &x = *in[0];
  std::vector<int64_t> perm = *op.attrs().getInts("perm");
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

llvm::Error evalSlice(const Op &op, Operands in, Results out) {
  const Tensor &x = *in[0];
  int64_t axis = *op.attrs().getInt("axis"), start = *op.attrs().getInt("start");
  int64_t size = *op.attrs().getInt("size");
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

llvm::Error evalCausalMask(const Op &, Operands in, Results out) {
  int64_t t = in[0]->type.dim(-1);
  out[0].data = in[0]->data;
  for (int64_t r = 0; r < rows(in[0]->type); ++r) {
    int64_t query = r % t;
    for (int64_t key = query + 1; key < t; ++key)
      out[0].data[r * t + key] = -std::numeric_limits<float>::infinity();
  }
  return llvm::Error::success();
}

/// Row-wise softmax or log-softmax, with the row maximum subtracted first.
llvm::Error softmaxRows(Operands in, Results out, bool log) {
  const Tensor &x = *in[0];
  int64_t d = x.type.dim(-1);
  for (int64_t r = 0; r < rows(x.type); ++r) {
    const float *row = &x.data[r * d];
    float *dst = &out[0].data[r * d];
    float max = *std::max_element(row, row + d);
    double sum = 0;
    for (int64_t i = 0; i < d; ++i)
      sum += std::exp(double(row[i]) - max);
    for (int64_t i = 0; i < d; ++i)
      dst[i] = log ? float(double(row[i]) - max - std::log(sum))
                   : float(std::exp(double(row[i]) - max) / sum);
  }
  return llvm::Error::success();
}

llvm::Error evalSoftmax(const Op &, Operands in, Results out) { return softmaxRows(in, out, false); }
llvm::Error evalLogSoftmax(const Op &, Operands in, Results out) {
  return softmaxRows(in, out, true);
}

llvm::Error evalNLLLoss(const Op &, Operands in, Results out) {
  const Tensor &logp = *in[0], &targets = *in[1];
  int64_t vocab = logp.type.dim(-1);
  double sum = 0;
  for (int64_t i = 0; i < targets.size(); ++i) {
    int32_t t = targets.ints[i];
    if (t < 0 || t >= vocab)
      return fail("target {} at position {} is outside the vocabulary [0, {})", t, i, vocab);
    sum -= logp.data[i * vocab + t];
  }
  out[0].data[0] = float(sum / double(targets.size()));
  return llvm::Error::success();
}

using EvalFn = llvm::Error (*)(const Op &, Operands, Results);
const EvalFn kEvalFns[] = {
#define OP(Enum, Name, MinOperands, MaxOperands, Results) &eval##Enum,
#include "ir/Ops.def"
};

} // namespace

llvm::Error evalOp(const Op &op, Operands operands, Results results) {
  return kEvalFns[static_cast<unsigned>(op.kind())](op, operands, results);
}

llvm::Error Interpreter::bind(llvm::StringRef name, Tensor tensor) {
  const Value *v = graph_.lookup(name);
  if (!v || (v->def()->kind() != OpKind::Input && v->def()->kind() != OpKind::Param))
    return fail("graph @{} has no input or parameter named '{}'", graph_.name(), name.str());
  if (tensor.type != v->type())
    return fail("'{}' is {}, but a {} was given", name.str(), v->type().str(), tensor.type.str());
  size_t expected = size_t(tensor.size());
  if ((isFloat(tensor.type.dtype) ? tensor.data.size() : tensor.ints.size()) != expected)
    return fail("'{}' holds the wrong number of elements", name.str());
  bound_[v] = std::move(tensor);
  return llvm::Error::success();
}

llvm::Error Interpreter::bindAll(const std::map<std::string, Tensor> &tensors) {
  for (const auto &[name, tensor] : tensors)
    if (auto err = bind(name, tensor))
      return err;
  return llvm::Error::success();
}

const Tensor *Interpreter::lookup(llvm::StringRef name) const {
  const Value *v = graph_.lookup(name);
  if (!v)
    return nullptr;
  auto it = bound_.find(v);
  if (it != bound_.end())
    return &it->second;
  auto jt = values_.find(v);
  return jt == values_.end() ? nullptr : &jt->second;
}

llvm::Expected<std::vector<Tensor>> Interpreter::run() {
  values_.clear();
  std::vector<Op *> ops = graph_.ops();
  // The last op that reads each value: after it the value is freed.
  llvm::DenseMap<const Value *, size_t> lastUse;
  for (size_t i = 0; i < ops.size(); ++i)
    for (const Value *v : ops[i]->operands())
      lastUse[v] = i;
  auto get = [&](const Value *v) -> const Tensor * {
    auto it = bound_.find(v);
    if (it != bound_.end())
      return &it->second;
    auto jt = values_.find(v);
    return jt == values_.end() ? nullptr : &jt->second;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op &op = *ops[i];
    if (op.kind() == OpKind::Input || op.kind() == OpKind::Param) {
      if (!bound_.count(op.result()))
        return fail("{} %{} was not given a value", op.name().str(), op.result()->name());
      continue;
    }
    llvm::SmallVector<const Tensor *, 4> operands;
    for (const Value *v : op.operands())
      operands.push_back(get(v));
    llvm::SmallVector<Tensor, 1> results;
    for (unsigned r = 0; r < op.numResults(); ++r)
      results.push_back(Tensor::zeros(op.result(r)->type()));
    if (auto err = evalOp(op, operands, results))
      return fail("%{} = {}: {}", op.result()->name(), op.name().str(),
                  llvm::toString(std::move(err)));
    for (unsigned r = 0; r < op.numResults(); ++r)
      values_[op.result(r)] = std::move(results[r]);
    if (keepAll_)
      continue;
    for (const Value *v : op.operands()) {
      bool isOutput = llvm::is_contained(graph_.outputs(), v);
      if (lastUse[v] == i && !isOutput && !bound_.count(v))
        values_.erase(v);
    }
  }
  std::vector<Tensor> outputs;
  for (const Value *v : graph_.outputs())
    outputs.push_back(*get(v));
  return outputs;
}

} // namespace tgc
