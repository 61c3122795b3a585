#include "models/GPTBuilder.h"

#include "models/ProgramInterface.h"

#include <cmath>

namespace tgc {
namespace {

class GPTBuilder {
public:
  GPTBuilder(const ModelConfig &config, int64_t batch, GPTOutput output, Graph &graph)
      : c_(config), batch_(batch), output_(output), b_(graph) {}

  llvm::Error build();

private:
  using Dims = llvm::SmallVector<int64_t, 4>;

  /// A normal-initialised matrix; `decay` marks it for AdamW's weight decay.
  Value *weight(const std::string &name, Dims dims, double std, bool decay) {
    return b_.param(name, TensorType(DType::F32, dims),
                    attrs({{"decay", decay}, {"init", std::string("normal")}, {"std", std}}));
  }
  Value *constant(const std::string &name, Dims dims, const char *init) {
    return b_.param(name, TensorType(DType::F32, dims), attrs({{"init", std::string(init)}}));
  }
  Value *op(OpKind kind, llvm::ArrayRef<Value *> operands, const std::string &name,
            AttrMap a = {}) {
    return b_.create(kind, operands, std::move(a), name);
  }
  /// x @ weight^T (+ bias), weight stored [out, in] as in torch.nn.Linear.
  Value *linear(Value *x, const std::string &name, int64_t in, int64_t out, double std) {
    Value *w = weight(name + ".weight", {out, in}, std, /*decay=*/true);
    Value *y = op(OpKind::MatMul, {x, w}, name, attrs({{"transpose_b", true}}));
    if (!c_.bias)
      return y;
    Value *bias = constant(name + ".bias", {out}, "zeros");
    return op(OpKind::Add, {y, bias}, name + ".out");
  }
  Value *norm(Value *x, const std::string &name) {
    Value *gamma = constant(name + ".weight", {c_.dModel}, "ones");
    if (c_.norm == NormKind::RMSNorm)
      return op(OpKind::RMSNorm, {x, gamma}, name, attrs({{"eps", c_.normEps}}));
    Value *beta = constant(name + ".bias", {c_.dModel}, "zeros");
    return op(OpKind::LayerNorm, {x, gamma, beta}, name, attrs({{"eps", c_.normEps}}));
  }
  Value *attention(Value *x, const std::string &p);
  Value *decodeAttention(Value *x, const std::string &p);
  Value *mlp(Value *x, const std::string &p);

  const ModelConfig &c_;
  int64_t batch_;
  GPTOutput output_;
  Builder b_;
  double std_ = 0.02;
  Value *pos_ = nullptr; // Decode: the position written this step
};

Value *GPTBuilder::decodeAttention(Value *x, const std::string &p) {
  int64_t B = batch_, T = c_.seqLen, D = c_.dModel, H = c_.heads, Dh = c_.headDim();
  Value *qkv = linear(x, p + ".qkv", D, 3 * D, std_);
  auto part = [&](int64_t index, const char *name) {
    return op(OpKind::Slice, {qkv}, p + "." + name,
              attrs({{"axis", int64_t(2)}, {"start", index * D}, {"size", D}}));
  };
  Value *q = part(0, "q"), *k = part(1, "k"), *v = part(2, "v");
  AttrMap zeros = attrs({{"init", std::string("zeros")}});
  auto cached = [&](Value *row, const char *name) {
    Value *cache = b_.state(p + "." + name, TensorType(DType::F32, {B, T, D}), zeros);
    Value *written = op(OpKind::KvWrite, {cache, row, pos_}, p + "." + name + ".new");
    b_.create(OpKind::Assign, {cache, written}, {}, "");
    return written;
  };
  Value *keys = cached(k, program::kKeyCache.data()), *values = cached(v, program::kValueCache.data());
  Value *context = op(OpKind::DecodeAttention, {q, keys, values, pos_}, p + ".context.flat",
                      attrs({{"heads", H}, {"scale", 1.0 / std::sqrt(double(Dh))}}));
  return linear(context, p + ".proj", D, D, std_ / std::sqrt(2.0 * c_.layers));
}

Value *GPTBuilder::attention(Value *x, const std::string &p) {
  int64_t B = batch_, T = c_.seqLen, D = c_.dModel, H = c_.heads, Dh = c_.headDim();
  Value *qkv = linear(x, p + ".qkv", D, 3 * D, std_);
  // [B, T, 3D] -> q, k, v as [B, H, T, Dh].
  auto head = [&](int64_t index, const char *name) {
    Value *part = op(OpKind::Slice, {qkv}, p + "." + name,
                     attrs({{"axis", int64_t(2)}, {"start", index * D}, {"size", D}}));
    Value *split = op(OpKind::Reshape, {part}, p + "." + name + ".heads",
                      attrs({{"shape", std::vector<int64_t>{B, T, H, Dh}}}));
    return op(OpKind::Transpose, {split}, p + "." + name + ".bhtd",
              attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  };
  Value *q = head(0, "q"), *k = head(1, "k"), *v = head(2, "v");
  Value *scores = op(OpKind::MatMul, {q, k}, p + ".scores", attrs({{"transpose_b", true}}));
  Value *scaled = op(OpKind::Scale, {scores}, p + ".scores.scaled",
                     attrs({{"factor", 1.0 / std::sqrt(double(Dh))}}));
  Value *masked = op(OpKind::CausalMask, {scaled}, p + ".scores.masked");
  Value *probs = op(OpKind::Softmax, {masked}, p + ".probs");
  Value *context = op(OpKind::MatMul, {probs, v}, p + ".context");
  Value *merged = op(OpKind::Transpose, {context}, p + ".context.bthd",
                     attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  Value *flat = op(OpKind::Reshape, {merged}, p + ".context.flat",
                   attrs({{"shape", std::vector<int64_t>{B, T, D}}}));
  // GPT-2 scales the init of projections into the residual stream by 1/sqrt(2 * layers).
  return linear(flat, p + ".proj", D, D, std_ / std::sqrt(2.0 * c_.layers));
}

Value *GPTBuilder::mlp(Value *x, const std::string &p) {
  int64_t D = c_.dModel, F = c_.ffn;
  double projStd = std_ / std::sqrt(2.0 * c_.layers);
  if (c_.activation == ActivationKind::Gelu) {
    Value *h = linear(x, p + ".fc1", D, F, std_);
    Value *act = op(OpKind::Gelu, {h}, p + ".gelu");
    return linear(act, p + ".fc2", F, D, projStd);
  }
  // SwiGLU: fc1 produces [gate | up] (2F wide, as TE's LayerNormMLP does); silu(gate) * up.
  Value *h = linear(x, p + ".fc1", D, 2 * F, std_);
  Value *gate = op(OpKind::Slice, {h}, p + ".gate",
                   attrs({{"axis", int64_t(2)}, {"start", int64_t(0)}, {"size", F}}));
  Value *up = op(OpKind::Slice, {h}, p + ".up",
                 attrs({{"axis", int64_t(2)}, {"start", F}, {"size", F}}));
  Value *act = op(OpKind::Silu, {gate}, p + ".silu");
  Value *glu = op(OpKind::Mul, {act, up}, p + ".glu");
  return linear(glu, p + ".fc2", F, D, projStd);
}

llvm::Error GPTBuilder::build() {
  int64_t B = batch_, T = c_.seqLen, D = c_.dModel, V = c_.vocab;
  bool decode = output_ == GPTOutput::Decode;
  int64_t steps = decode ? 1 : T; // positions per sequence in this program
  Value *tokens = b_.input(program::kTokens.str(), TensorType(DType::I32, {B, steps}));
  Value *targets = output_ == GPTOutput::Loss ? b_.input(program::kTargets.str(), TensorType(DType::I32, {B, T}))
                                               : nullptr;
  Value *positions = decode ? b_.input(program::kPositions.str(), TensorType(DType::I32, {B, 1})) : nullptr;
  if (decode)
    pos_ = b_.input(program::kPosition.str(), TensorType(DType::I32, {}));
  bool decayEmbeddings = c_.train.decayEmbeddings;
  Value *wte = weight("wte", {V, D}, std_, decayEmbeddings);
  Value *wpe = weight("wpe", {T, D}, std_ / 2, decayEmbeddings);
  Value *tok = op(OpKind::Embedding, {wte, tokens}, "tok_emb");
  Value *posEmb = decode ? op(OpKind::Embedding, {wpe, positions}, "pos_emb") : wpe;
  Value *x = op(OpKind::Add, {tok, posEmb}, "x0");
  for (int64_t l = 0; l < c_.layers; ++l) {
    std::string p = "h" + std::to_string(l);
    Value *ln1 = norm(x, p + ".ln1");
    Value *attn = decode ? decodeAttention(ln1, p + ".attn") : attention(ln1, p + ".attn");
    x = op(OpKind::Add, {x, attn}, p + ".res1");
    Value *ln2 = norm(x, p + ".ln2");
    Value *ffn = mlp(ln2, p + ".mlp");
    x = op(OpKind::Add, {x, ffn}, p + ".res2");
  }
  Value *final = norm(x, "lnf");
  Value *head = c_.tieEmbeddings ? wte : weight("lm_head.weight", {V, D}, std_, /*decay=*/true);
  Value *logits = op(OpKind::MatMul, {final, head}, program::kLogits.str(), attrs({{"transpose_b", true}}));
  if (output_ != GPTOutput::Loss) {
    if (auto err = b_.takeError())
      return err;
    b_.graph().addOutput(logits);
    return llvm::Error::success();
  }
  Value *logp = op(OpKind::LogSoftmax, {logits}, "logp");
  Value *loss = op(OpKind::NLLLoss, {logp, targets}, program::kLoss.str());
  if (auto err = b_.takeError())
    return err;
  b_.graph().addOutput(loss);
  return llvm::Error::success();
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>> buildGPT(const ModelConfig &config, int64_t batch,
                                                GPTOutput output) {
  auto graph = std::make_unique<Graph>(config.name);
  if (auto err = GPTBuilder(config, batch, output, *graph).build())
    return std::move(err);
  return std::move(graph);
}

} // namespace tgc
