// Type rules of the precision ops: quantize (FP8 E4M3 or E5M2 under delayed, current or block
// scaling) and fp8_update (delayed scaling's amax history and scale).
#include "ir/Attributes.h"
#include "ir/InferRules.h"
#include "support/Error.h"

#include <fmt/format.h>

namespace tgc::infer {

namespace {
const TensorType kBlockAmax(DType::F32, {2}); // a block-scaled quantize's {amax, largest block scale}

llvm::Expected<DType> fp8FormatAttr(const AttrMap &attrs) {
  auto format = attrs.getString(kFp8Format);
  if (format == "e4m3")
    return DType::F8E4M3;
  if (format == "e5m2")
    return DType::F8E5M2;
  return makeError("attribute 'format' must be \"e4m3\" or \"e5m2\"");
}

/// The FP8 scale margin of quantize {scaling="current"} and fp8_update: scale / 2^margin.
llvm::Error checkMarginAttr(const AttrMap &attrs) {
  auto margin = requireIntAttr(attrs, "margin");
  if (!margin)
    return margin.takeError();
  if (*margin < 0 || *margin > 64)
    return makeError("'margin' must be between 0 and 64, got {}", *margin);
  return llvm::Error::success();
}

/// Block scaling's shape rules: blocks of 1 x 128 or 128 x 128 along the last dimension, which a
/// multiple of 128, and the rows too where a block spans them (128 x 128, or a transpose's 1 x 128
/// blocks along the rows). Its scale is the block's own: no margin.
llvm::Error checkBlockScaling(const TensorType &x, const AttrMap &attrs) {
  auto rows = requireIntAttr(attrs, "block_rows");
  if (!rows)
    return rows.takeError();
  if (*rows != 1 && *rows != 128)
    return makeError("'block_rows' must be 1 or 128, got {}", *rows);
  if (attrs.has("margin"))
    return makeError("block scaling takes each block's own amax: no 'margin'");
  if (x.rank() < 1 || x.dim(-1) % 128)
    return makeError("block scaling needs a last dimension that is a multiple of 128, got {}", x.str());
  int64_t count = x.numElements() / x.dim(-1);
  bool spansRows = *rows == 128 || attrs.getBool("transpose").value_or(false);
  if (spansRows && count % 128)
    return makeError("block scaling with {} needs a row count that is a multiple of 128, got {} rows of {}",
                     *rows == 128 ? "128 x 128 blocks" : "a transpose", count, x.str());
  return llvm::Error::success();
}

} // namespace

llvm::Expected<TypeList> inferQuantize(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  auto format = fp8FormatAttr(attrs);
  if (!format)
    return format.takeError();
  if (auto err = requireFloat(ops[0], "input"))
    return std::move(err);
  if (ops[1] != kScalar || ops[2] != kScalar)
    return makeError("scale and scale_inv must be f32[], got {} and {}", ops[1].str(), ops[2].str());
  // Current scaling (the tensor's own amax) names its margin; delayed scaling has neither.
  if (auto scaling = attrs.getString("scaling")) {
    if (*scaling != "current" && *scaling != "block")
      return makeError("attribute 'scaling' must be \"current\" or \"block\" (or absent: delayed), got \"{}\"",
                       *scaling);
    if (*scaling == "current") {
      if (auto err = checkMarginAttr(attrs))
        return std::move(err);
    } else if (auto err = checkBlockScaling(ops[0], attrs)) {
      return std::move(err);
    }
  } else if (attrs.has("block_rows")) {
    return makeError("'block_rows' belongs to block scaling: add scaling=\"block\"");
  } else if (attrs.getInt("margin")) {
    return makeError("'margin' belongs to current scaling: add scaling=\"current\"");
  }
  auto activation = attrs.getString("activation");
  if (activation && *activation != "gelu" && *activation != "gelu_backward" && *activation != "swiglu" &&
      *activation != "swiglu_backward" && *activation != "cross_entropy_backward")
    return makeError("attribute 'activation' must be \"gelu\", \"gelu_backward\", \"swiglu\", \"swiglu_backward\" "
                     "or \"cross_entropy_backward\" (or absent), got \"{}\"",
                     *activation);
  bool gradient = activation == "gelu_backward" || activation == "swiglu_backward";
  bool loss = activation == "cross_entropy_backward";
  size_t expected = gradient ? 4 : loss ? 5 : 3;
  if (ops.size() != expected)
    return makeError(gradient ? "activation=\"{}\" takes four operands (x, scale, scale_inv, h), got {}"
                     : loss ? "activation=\"{}\" takes five operands (logits, scale, scale_inv, targets, dloss), got {}"
                            : "{}quantize takes three operands (x, scale, scale_inv) without an activation that "
                              "reads more, got {}",
                     activation.value_or(""), ops.size());
  // What is quantized: x, or SwiGLU's h [..., 2F] -> [..., F], or its gradient of dy [..., F]
  // and h [..., 2F] -> [..., 2F].
  TensorType quantized = ops[0];
  if (activation == "swiglu" || activation == "swiglu_backward") {
    const TensorType &h = activation == "swiglu" ? ops[0] : ops[3];
    if (h.rank() < 1 || h.dim(-1) % 2)
      return makeError("swiglu's h needs an even last dimension, got {}", h.str());
    Shape half = h.shape;
    half.back() /= 2;
    if (activation == "swiglu_backward" && ops[0].shape != half)
      return makeError("dy must be h's half ({}), got {}", TensorType(ops[0].dtype, half).str(), ops[0].str());
    quantized = activation == "swiglu" ? TensorType(h.dtype, half) : h;
  } else if (gradient && ops[3] != ops[0]) {
    return makeError("h must have the type of x ({}), got {}", ops[0].str(), ops[3].str());
  }
  if (loss) { // the targets and dloss of cross_entropy(logits, targets, dloss)
    if (auto lossTypes = inferCrossEntropy({ops[0], ops[3], ops[4]}, attrs, {}); !lossTypes)
      return lossTypes.takeError();
  }
  bool biasGrad = attrs.getBool("bias_grad").value_or(false);
  if (biasGrad && activation && activation != "gelu_backward")
    return makeError("bias_grad=true sums x or gelu_backward(x, h), not gelu(x), SwiGLU or its gradient, or the "
                     "loss's gradient: drop activation=\"{}\"",
                     *activation);
  // Under block scaling the amax is a pair: max |x| and the largest block scale (each block's
  // own from its amax; blocks of zeros take none), both maxima over any split of the blocks.
  bool block = attrs.getString("scaling") == "block";
  TypeList types{TensorType(*format, quantized.shape), block ? kBlockAmax : kScalar, kScalar};
  if (attrs.getBool("transpose").value_or(false)) {
    if (quantized.rank() < 2)
      return makeError("transpose=true needs an input of rank 2 or more, got {}", quantized.str());
    int64_t cols = quantized.dim(-1);
    types.push_back(TensorType(*format, {cols, quantized.numElements() / std::max<int64_t>(cols, 1)}));
  }
  if (biasGrad) {
    if (ops[0].rank() < 1)
      return makeError("bias_grad needs x of rank >= 1");
    types.push_back(TensorType(DType::F32, {ops[0].dim(-1)}));
  }
  if (loss)
    types.push_back(kScalar);
  return types;
}

llvm::Expected<TypeList> inferFp8Update(Operands ops, const AttrMap &attrs, llvm::ArrayRef<TensorType>) {
  if (auto format = fp8FormatAttr(attrs); !format)
    return format.takeError();
  if (auto err = checkMarginAttr(attrs))
    return std::move(err);
  auto algo = attrs.getString("algo");
  if (algo != "max" && algo != "most_recent")
    return makeError("attribute 'algo' must be \"max\" or \"most_recent\"");
  const TensorType &history = ops[0];
  if (history.dtype != DType::F32 || history.rank() != 1)
    return makeError("amax_history must be f32[L], got {}", history.str());
  for (int i : {1, 3, 4})
    if (ops[i] != kScalar)
      return makeError("scale, saturations and saturated must be f32[], got {}", ops[i].str());
  if (ops[2] != kScalar && ops[2] != kBlockAmax)
    return makeError("amax must be f32[] (or f32[2], a block-scaled quantize's), got {}", ops[2].str());
  // A block-scaled quantize's pair: its largest block scale passes through as a fifth result.
  if (ops[2] == kBlockAmax)
    return TypeList{history, kScalar, kScalar, kScalar, kScalar};
  return TypeList{history, kScalar, kScalar, kScalar};
}

} // namespace tgc::infer
