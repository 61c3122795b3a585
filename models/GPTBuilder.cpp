#include "models/GPTBuilder.h"
#include "ir/Attributes.h"

#include "models/ProgramInterface.h"

#include "support/Error.h"

#include <cmath>
#include <fmt/format.h>

namespace tgc {
namespace {

class GPTBuilder {
public:
  GPTBuilder(const ModelConfig &config, int64_t batch, GPTOutput output, int64_t length, Graph &graph)
      : c_(config), batch_(batch), output_(output), length_(length), b_(graph) {}

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
    Value *y = op(OpKind::MatMul, {x, w}, name, matmulAttrs(kTransposedWeight));
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
  Value *rotatedQkv(Value *qkv, const std::string &p);
  std::pair<Value *, Value *> writeCaches(Value *qkv, const std::string &p);
  Value *mlp(Value *x, const std::string &p);

  const ModelConfig &c_;
  int64_t batch_;
  GPTOutput output_;
  int64_t length_; // positions per sequence in this program
  Builder b_;
  double std_ = 0.02;
  Value *positions_ = nullptr; // Decode, Verify: each sequence's position, the cache row it writes first
};

/// The layer's KV caches with qkv's keys and values written (at positions_ when decoding,
/// from row 0 for a prompt), assigned back when the step ends.
std::pair<Value *, Value *> GPTBuilder::writeCaches(Value *qkv, const std::string &p) {
  // A row per position of the keys (and of the values) of every KV head: kv_heads x head_dim.
  TensorType cacheType(DType::F32, {batch_, c_.seqLen, c_.kvHeadCount() * c_.headDim()});
  AttrMap zeros = attrs({{"init", std::string("zeros")}});
  Value *k = b_.state(p + "." + program::kKeyCache.str(), cacheType, zeros);
  Value *v = b_.state(p + "." + program::kValueCache.str(), cacheType, zeros);
  llvm::SmallVector<Value *, 4> operands{k, v, qkv};
  if (positions_)
    operands.push_back(positions_);
  Value *keys = op(OpKind::KvWrite, operands, k->name() + ".new");
  if (!keys)
    return {nullptr, nullptr};
  Value *values = keys->def()->result(1);
  b_.graph().rename(values, v->name() + ".new");
  b_.create(OpKind::Assign, {k, keys}, {}, "");
  b_.create(OpKind::Assign, {v, values}, {}, "");
  return {keys, values};
}

/// qkv [B, S, D + 2 KV Dh] with its queries and keys rotated (RoPE), each sequence's rows from
/// positions_[b] in a decode step, from 0 in a prompt: what the caches keep and the attention
/// over them reads (Llama's cache holds rotated keys).
Value *GPTBuilder::rotatedQkv(Value *qkv, const std::string &p) {
  int64_t B = batch_, S = length_, D = c_.dModel, Dh = c_.headDim(), KV = c_.kvHeadCount();
  auto rotated = [&](int64_t start, int64_t heads, const char *name) {
    std::string n = p + "." + name;
    Value *part = op(OpKind::Slice, {qkv}, n, attrs({{"axis", int64_t(2)}, {"start", start}, {"size", heads * Dh}}));
    Value *split = op(OpKind::Reshape, {part}, n + ".heads", attrs({{"shape", std::vector<int64_t>{B, S, heads, Dh}}}));
    Value *bhsd = op(OpKind::Transpose, {split}, n + ".bhtd", attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    llvm::SmallVector<Value *, 2> operands{bhsd};
    AttrMap a = ropeAttrs({c_.ropeTheta, false, c_.ropeScaling});
    if (positions_) {
      operands.push_back(positions_);
      a.set("length", c_.seqLen);
    }
    Value *turned = op(OpKind::Rope, operands, n + ".rope", std::move(a));
    Value *bshd = op(OpKind::Transpose, {turned}, n + ".rope.bthd", attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    return op(OpKind::Reshape, {bshd}, n + ".rope.flat", attrs({{"shape", std::vector<int64_t>{B, S, heads * Dh}}}));
  };
  Value *q = rotated(0, c_.heads, "q"), *k = rotated(D, KV, "k");
  Value *v = op(OpKind::Slice, {qkv}, p + ".v", attrs({{"axis", int64_t(2)}, {"start", D + KV * Dh}, {"size", KV * Dh}}));
  return op(OpKind::Concat, {q, k, v}, p + ".qkv.rope", attrs({{"axis", int64_t(2)}}));
}

Value *GPTBuilder::decodeAttention(Value *x, const std::string &p) {
  int64_t D = c_.dModel, H = c_.heads, Dh = c_.headDim(), KV = c_.kvHeadCount();
  Value *qkv = linear(x, p + ".qkv", D, c_.qkvWidth(), std_);
  if (c_.position == PositionKind::Rope)
    qkv = rotatedQkv(qkv, p);
  auto [keys, values] = writeCaches(qkv, p);
  AttrMap a = attrs({{"heads", H}, {"scale", 1.0 / std::sqrt(double(Dh))}});
  if (KV < H)
    a.set("kv_heads", KV);
  Value *context = op(OpKind::DecodeAttention, {qkv, keys, values, positions_}, p + ".context.flat", std::move(a));
  return linear(context, p + ".proj", D, D, std_ / std::sqrt(2.0 * c_.layers));
}

Value *GPTBuilder::attention(Value *x, const std::string &p) {
  int64_t B = batch_, T = length_, D = c_.dModel, H = c_.heads, Dh = c_.headDim();
  int64_t KV = c_.kvHeadCount(), G = H / KV;
  Value *qkv = linear(x, p + ".qkv", D, c_.qkvWidth(), std_);
  // A prompt's caches keep its rotated keys: under RoPE the heads are read from the rotated qkv.
  bool rotateHeads = c_.position == PositionKind::Rope;
  if (output_ == GPTOutput::Prefill) {
    if (rotateHeads)
      qkv = rotatedQkv(qkv, p + ".cached");
    rotateHeads = false;
    writeCaches(qkv, p);
  }
  // [B, T, D + 2 KV Dh] -> q as [B, H, T, Dh], k and v as [B, KV, T, Dh].
  auto head = [&](int64_t start, int64_t heads, const char *name) {
    Value *part = op(OpKind::Slice, {qkv}, p + "." + name,
                     attrs({{"axis", int64_t(2)}, {"start", start}, {"size", heads * Dh}}));
    Value *split = op(OpKind::Reshape, {part}, p + "." + name + ".heads",
                      attrs({{"shape", std::vector<int64_t>{B, T, heads, Dh}}}));
    Value *bhtd = op(OpKind::Transpose, {split}, p + "." + name + ".bhtd",
                     attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    if (!rotateHeads || *name == 'v')
      return bhtd;
    return op(OpKind::Rope, {bhtd}, p + "." + name + ".rope", ropeAttrs({c_.ropeTheta, false, c_.ropeScaling}));
  };
  Value *q = head(0, H, "q"), *k = head(D, KV, "k"), *v = head(D + KV * Dh, KV, "v");
  // Grouped-query attention: query head h reads key and value head h / G (Llama's
  // repeat_kv). The G query heads of a KV head are consecutive, so [B, H, T, Dh] is
  // [B, KV, G * T, Dh] and one batched product per KV head takes all G of them; the scores
  // go back to [B, H, T, T] for the causal mask and the softmax.
  auto grouped = [&](Value *t, llvm::ArrayRef<int64_t> shape, const std::string &name) {
    return G == 1 ? t : op(OpKind::Reshape, {t}, name, attrs({{"shape", std::vector<int64_t>(shape.begin(), shape.end())}}));
  };
  Value *qg = grouped(q, {B, KV, G * T, Dh}, p + ".q.groups");
  Value *scores = grouped(op(OpKind::MatMul, {qg, k}, p + ".scores", matmulAttrs(kTransposedWeight)),
                          {B, H, T, T}, p + ".scores.heads");
  Value *scaled = op(OpKind::Scale, {scores}, p + ".scores.scaled",
                     attrs({{"factor", 1.0 / std::sqrt(double(Dh))}}));
  Value *masked = op(OpKind::CausalMask, {scaled}, p + ".scores.masked");
  Value *probs = op(OpKind::Softmax, {masked}, p + ".probs");
  Value *probsG = grouped(probs, {B, KV, G * T, T}, p + ".probs.groups");
  Value *context = grouped(op(OpKind::MatMul, {probsG, v}, p + (G == 1 ? ".context" : ".context.groups")),
                           {B, H, T, Dh}, p + ".context");
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
  int64_t B = batch_, T = length_, D = c_.dModel, V = c_.vocab;
  bool verify = output_ == GPTOutput::Verify, prefill = output_ == GPTOutput::Prefill;
  bool decode = output_ == GPTOutput::Decode || verify; // over the KV cache, from positions_
  Value *tokens = b_.input(program::kTokens.str(), TensorType(DType::I32, {B, T}));
  Value *targets = output_ == GPTOutput::Loss ? b_.input(program::kTargets.str(), TensorType(DType::I32, {B, T}))
                                               : nullptr;
  if (decode)
    positions_ = b_.input(program::kPositions.str(), TensorType(DType::I32, {B, 1}));
  // Each token's position: a decode step's one token a sequence sits at positions_.
  Value *tokenPositions =
      verify ? b_.input(program::kTokenPositions.str(), TensorType(DType::I32, {B, T})) : positions_;
  Value *lastRows = prefill ? b_.input(program::kLastRows.str(), TensorType(DType::I32, {B, 1})) : nullptr;
  bool decayEmbeddings = c_.train.decayEmbeddings;
  bool learned = c_.position == PositionKind::Learned;
  Value *wte = weight("wte", {V, D}, std_, decayEmbeddings);
  Value *wpe = learned ? weight("wpe", {c_.seqLen, D}, std_ / 2, decayEmbeddings) : nullptr;
  Value *tok = op(OpKind::Embedding, {wte, tokens}, "tok_emb");
  Value *x = tok; // under RoPE the positions enter in each attention's q and k
  if (learned) {
    Value *posEmb = wpe;
    if (decode)
      posEmb = op(OpKind::Embedding, {wpe, tokenPositions}, "pos_emb");
    else if (T < c_.seqLen) // a prompt shorter than the window: its positions' rows
      posEmb = op(OpKind::Slice, {wpe}, "pos_emb", attrs({{"axis", int64_t(0)}, {"start", int64_t(0)}, {"size", T}}));
    x = op(OpKind::Add, {tok, posEmb}, "x0");
  }
  for (int64_t l = 0; l < c_.layers; ++l) {
    std::string p = "h" + std::to_string(l);
    Value *ln1 = norm(x, p + ".ln1");
    Value *attn = decode ? decodeAttention(ln1, p + ".attn") : attention(ln1, p + ".attn");
    x = op(OpKind::Add, {x, attn}, p + ".res1");
    Value *ln2 = norm(x, p + ".ln2");
    Value *ffn = mlp(ln2, p + ".mlp");
    x = op(OpKind::Add, {x, ffn}, p + ".res2");
  }
  if (prefill) { // only each sequence's last prompt position goes on to the logits
    Value *rows = op(OpKind::Reshape, {x}, "rows", attrs({{"shape", std::vector<int64_t>{B * T, D}}}));
    x = op(OpKind::Embedding, {rows, lastRows}, "last");
  }
  Value *final = norm(x, "lnf");
  Value *head = c_.tieEmbeddings ? wte : weight("lm_head.weight", {V, D}, std_, /*decay=*/true);
  Value *logits = op(OpKind::MatMul, {final, head}, program::kLogits.str(), matmulAttrs(kTransposedWeight));
  if (output_ != GPTOutput::Loss) {
    Value *next = nullptr;
    if (decode || prefill) { // each sequence's next token, drawn on the device (argmax when greedy)
      Value *sampling = b_.input(program::kSampling.str(), TensorType(DType::F32, {3}));
      Value *seed = b_.input(program::kSampleSeed.str(), TensorType(DType::I32, {2}));
      // The draw's counter: the position of each sequence's last token (a prefill's row less
      // the rows of the sequences before it).
      next = op(OpKind::Sample, {logits, decode ? tokenPositions : lastRows, sampling, seed}, program::kNext.str(),
                attrs({{"stride", decode ? int64_t(0) : T}}));
    }
    if (auto err = b_.takeError())
      return err;
    b_.graph().addOutput(logits);
    if (next)
      b_.graph().addOutput(next);
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
                                                GPTOutput output, int64_t length) {
  if (output == GPTOutput::Decode)
    length = 1;
  else if ((output != GPTOutput::Prefill && output != GPTOutput::Verify) || length == 0)
    length = config.seqLen;
  if (length < 1 || length > config.seqLen)
    return stringError(fmt::format("error: a prompt of {} positions does not fit seq_len {}", length, config.seqLen));
  auto graph = std::make_unique<Graph>(config.name);
  if (auto err = GPTBuilder(config, batch, output, length, *graph).build())
    return std::move(err);
  return std::move(graph);
}

} // namespace tgc
