// The storage rules: which values the GPU stores in BF16 (CudaProgram::bf16Stored), which get a
// BF16 copy beside their fp32 form (bf16Shadowed), which products round to BF16 where the
// program keeps fp32 (bf16Rounding: the rules of kRoundingRules), and which operands cuDNN reads
// in place where their GEMMs wrote them (qkvRows, doutRows). Each rule is a legality predicate
// over the program's readers; lowerToCuda applies them in the order chooseStorage gives.
#include "backends/cuda/lowering/StorageRules.h"
#include "support/Error.h"

#include "backends/cuda/lowering/Lowering.h"

#include "backends/cuda/lowering/MemoryPlan.h"
#include "ir/Attributes.h"
#include "ir/Gemv.h"
#include "ir/Fused.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <optional>
#include <string>

namespace tgc {

namespace {

/// Who reads `v`, directly or through reshapes: BF16 GEMMs as their A or B operand, and the
/// rest (the bias of matmul_bias is added in fp32; graph outputs count as the rest).
struct Readers {
  int bf16Gemms = 0, others = 0;
};
void countReaders(const Graph &graph, const CudaProgram &program, const Value *v, Readers &readers) {
  if (llvm::is_contained(graph.outputs(), v))
    ++readers.others;
  for (const Op *user : v->users()) {
    if (user->kind() == OpKind::Reshape) {
      countReaders(graph, program, user->result(), readers);
      continue;
    }
    // cuDNN's attention gradient (BF16 or FP8) reads the forward's out in BF16, as a GEMM
    // operand; the column sums of a gradient cuDNN wrote (in BF16: the fp32 form holds the same
    // values) read it so.
    bool gradient = user->kind() == OpKind::AttentionBackward || user->kind() == OpKind::Fp8AttentionBackward;
    if (program.cudnnAttention.count(user) && gradient && user->operand(2) == v && user->operand(0) != v &&
        user->operand(1) != v && user->operand(3) != v) {
      ++readers.bf16Gemms;
      continue;
    }
    const Op *producer = reshapeRoot(v)->def();
    // The column sums of a gradient a BF16 epilogue or cuDNN writes read it in BF16.
    bool byCudnn = producer && program.cudnnAttention.count(producer);
    if (user->kind() == OpKind::ReduceTo && producer &&
        ((byCudnn && (producer->kind() == OpKind::AttentionBackward ||
                      producer->kind() == OpKind::Fp8AttentionBackward)) ||
         producer->kind() == OpKind::MatMulDGelu)) {
      ++readers.bf16Gemms;
      continue;
    }
    // A quantize reads a cuDNN result (the attention's out, its gradient's dqkv) in BF16: cuDNN
    // writes BF16, so the fp32 form holds the same values, and the FP8 bytes, amax and
    // saturations are the same bits from either (half the bytes read, no widening pass).
    if (user->kind() == OpKind::Quantize && user->operand(0) == v && byCudnn &&
        (producer->kind() == OpKind::Attention || producer->kind() == OpKind::AttentionBackward ||
         producer->kind() == OpKind::Fp8Attention || producer->kind() == OpKind::Fp8AttentionBackward)) {
      ++readers.bf16Gemms;
      continue;
    }
    bool operand = isBf16Gemm(*user);
    for (unsigned p = 2; p < user->numOperands(); ++p)
      operand &= user->operand(p) != v;
    ++(operand ? readers.bf16Gemms : readers.others);
  }
}

/// `v` and its reshapes into `set`.
void markWithReshapes(llvm::DenseSet<const Value *> &set, const Value *v) {
  set.insert(v);
  for (const Op *user : v->users())
    if (user->kind() == OpKind::Reshape)
      markWithReshapes(set, user->result());
}

/// What the rounding rules ask of the program: which values are intermediates and who reads them.
class StorageQuery {
public:
  StorageQuery(const Graph &graph, const CudaProgram &program) : graph_(graph), program_(program) {}
  const CudaProgram &program() const { return program_; }
  /// Neither returned nor written into a leaf nor a gradient of the parameter layout.
  bool intermediate(const Value *v) const {
    return !llvm::is_contained(graph_.outputs(), v) && !program_.inPlace.count(v) && !program_.layout.grads.count(v);
  }
  /// An intermediate that BF16 GEMMs read, and nothing else (countReaders).
  bool onlyGemmsRead(const Value *v) const {
    Readers readers;
    countReaders(graph_, program_, v, readers);
    return readers.others == 0 && readers.bf16Gemms > 0 && intermediate(v);
  }
  /// Whether `v`, an intermediate, is read by at least one op, and each reads it once, as the
  /// operand `operandOf` gives for it (-1: an op the rule does not take).
  bool onlyReadAs(const Value *v, llvm::function_ref<int(const Op &)> operandOf) const {
    if (v->users().empty() || !intermediate(v))
      return false;
    for (const Op *user : v->users()) {
      int operand = operandOf(*user);
      for (unsigned p = 0; p < user->numOperands(); ++p)
        if ((user->operand(p) == v) != (int(p) == operand))
          return false;
    }
    return true;
  }

private:
  const Graph &graph_;
  const CudaProgram &program_;
};

/// What a rule rounds: each op that writes a value in BF16 although the program keeps it in
/// fp32, and that value (stored in BF16 with its reshapes).
using Rounded = llvm::SmallVector<std::pair<const Op *, const Value *>, 4>;

/// What a quantize applies as it reads (fuse-gelu-quantize); None for any other op.
QuantizeActivation activationOf(const Op &op) {
  return op.kind() == OpKind::Quantize ? quantizeOptions(op.attrs()).activation : QuantizeActivation::None;
}

/// A product on tensor cores (BF16 or FP8) of many rows: it can write its output in BF16.
bool onTensorCores(const Op &op) {
  return fewRows(op) == FewRows::None && (op.kind() == OpKind::MatMul || op.kind() == OpKind::MatMulBias) &&
         (hasBf16Gemms(op.attrs()) || isFp8(op.operand(0)->type().dtype));
}

/// A BF16 matmul_bias_gelu (cuBLASLt's GELU_AUX_BIAS epilogue) whose activation only BF16 GEMMs
/// read and whose h only matmul_dgelu reads, with those matmul_dgelu (the DGELU epilogue), whose
/// results only BF16 GEMMs and column sums read: cuBLASLt's BF16 epilogues take the output, the
/// bias and h in one type. The bias must be a parameter: the executor's BF16 copy holds it.
/// Where nothing reads h (fuse-gelu-epilogue's), the GELU_BIAS epilogue writes the activation
/// alone.
Rounded geluEpilogues(const Op &op, const StorageQuery &q) {
  if (op.kind() != OpKind::MatMulBiasGelu || !hasBf16Gemms(op.attrs()) || fewRows(op) != FewRows::None ||
      !isWeight(q.program(), op.operand(2)))
    return {};
  const Value *act = op.result(0), *h = op.result(1);
  if (q.program().geluWithoutAux.count(&op))
    return q.onlyGemmsRead(act) ? Rounded{{&op, act}} : Rounded{};
  bool chosen = q.onlyGemmsRead(act) && !h->users().empty() && q.intermediate(h);
  for (const Op *user : h->users())
    chosen &= user->kind() == OpKind::MatMulDGelu && user->operand(0) != h && user->operand(1) != h &&
              q.onlyGemmsRead(user->result());
  if (!chosen)
    return {};
  Rounded rounded = {{&op, act}, {&op, h}};
  for (const Op *user : h->users())
    rounded.push_back({user, user->result()});
  return rounded;
}

/// An FP8 layer's pre-activation (its bias add, or the product adding it: fuse-fp8-bias) that
/// only the GELU (or the quantize applying it: fuse-gelu-quantize) and the GELU's gradient (or
/// the quantize making it) read, kept for the gradient: in BF16, as under BF16 the GELU epilogue
/// keeps it (the FP8 recipe's activation memory then stays below BF16's).
Rounded fp8PreActivation(const Op &op, const StorageQuery &q) {
  const Op *product = op.kind() == OpKind::Add ? op.operand(0)->def() : &op;
  if ((op.kind() != OpKind::Add && op.kind() != OpKind::MatMulBias) || !product ||
      product->kind() != (op.kind() == OpKind::Add ? OpKind::MatMul : OpKind::MatMulBias) ||
      !isFp8(product->operand(0)->type().dtype))
    return {};
  const Value *h = op.result();
  bool gradient = llvm::any_of(h->users(), [&](const Op *user) {
    return user->kind() == OpKind::GeluBackward || activationOf(*user) == QuantizeActivation::GeluBackward;
  });
  bool chosen = gradient && q.onlyReadAs(h, [&](const Op &user) {
    return user.kind() == OpKind::Gelu || activationOf(user) == QuantizeActivation::Gelu ? 0
           : user.kind() == OpKind::GeluBackward                     ? 1
           : activationOf(user) == QuantizeActivation::GeluBackward                     ? 3
                                                                     : -1;
  });
  return chosen ? Rounded{{&op, h}} : Rounded{};
}

/// A norm's output that only quantizes read (an FP8 layer's input: ln1 for qkv, ln2 for fc1),
/// written in BF16 as Transformer Engine's norms write their BF16 activations: the quantize
/// reads two bytes an element instead of four.
Rounded normIntoQuantize(const Op &op, const StorageQuery &q) {
  bool norm = op.kind() == OpKind::LayerNorm || op.kind() == OpKind::RMSNorm;
  if (!norm && op.kind() != OpKind::ResidualNorm)
    return {};
  const Value *y = op.result(norm ? 0 : 1);
  bool chosen = q.onlyReadAs(y, [&](const Op &user) {
    return user.kind() == OpKind::Quantize && activationOf(user) == QuantizeActivation::None ? 0 : -1;
  });
  return chosen ? Rounded{{&op, y}} : Rounded{};
}

/// The gradient of an FP8 layer's GELU, an FP8 product's (fc2's dgrad) that only the quantize
/// making fc1's FP8 output gradient of it reads (fuse-gelu-quantize's "gelu_backward"): the
/// product writes it in BF16, as Transformer Engine's dgrad writes the activations' type, and
/// the quantize reads two bytes an element instead of four (E5M2 keeps 3 of BF16's 8
/// significant bits).
Rounded fp8GeluGradient(const Op &op, const StorageQuery &q) {
  if (!onTensorCores(op) || op.kind() != OpKind::MatMul || !isFp8(op.operand(0)->type().dtype) ||
      op.result()->users().size() != 1)
    return {};
  bool chosen = q.onlyReadAs(op.result(), [&](const Op &user) {
    return activationOf(user) == QuantizeActivation::GeluBackward ? 0 : -1;
  });
  return chosen ? Rounded{{&op, op.result()}} : Rounded{};
}

/// A product on tensor cores (BF16 or FP8) that only a norm reads: the projection's and fc2's
/// outputs, which the residual norm after them adds to the stream, and the dgrad products of the
/// layers after a norm (qkv's, fc1's), which its gradient reads twice. They are written in BF16,
/// as PyTorch's autocast and Transformer Engine write a GEMM's output in the activations' type:
/// two bytes an element instead of four, written once and read once or twice. A bias is then
/// added from the parameter's BF16 copy (cuBLASLt's BF16 epilogue).
Rounded productIntoNorm(const Op &op, const StorageQuery &q) {
  if (!onTensorCores(op) || (op.kind() != OpKind::MatMul && !isWeight(q.program(), op.operand(2))))
    return {};
  bool chosen = q.onlyReadAs(op.result(), [](const Op &user) {
    bool gradient = user.kind() == OpKind::LayerNormBackward || user.kind() == OpKind::RMSNormBackward;
    return gradient ? 0 : user.kind() == OpKind::ResidualNorm ? 1 : -1; // dy of a gradient, y of a sum
  });
  return chosen ? Rounded{{&op, op.result()}} : Rounded{};
}

/// A product on tensor cores that only a plain quantize reads (FP8 attention's: qkv, and dout
/// from the projection's dgrad): written in BF16, as Transformer Engine's GEMMs write the
/// activations' type before its cast, and the quantize reads two bytes an element instead of
/// four. A bias is then added from the parameter's BF16 copy.
Rounded productIntoQuantize(const Op &op, const StorageQuery &q) {
  if (!onTensorCores(op) || (op.kind() != OpKind::MatMul && !isWeight(q.program(), op.operand(2))))
    return {};
  bool chosen = q.onlyReadAs(op.result(), [](const Op &user) {
    return user.kind() == OpKind::Quantize && activationOf(user) == QuantizeActivation::None ? 0 : -1;
  });
  return chosen ? Rounded{{&op, op.result()}} : Rounded{};
}

/// fc1's output h [gate | up] that only SwiGLU and its gradient read (each once), and fc2's
/// dgrad that only SwiGLU's gradient reads (as dy): written in BF16, as PyTorch's autocast
/// writes fc1's output and the gradient of SwiGLU's: half the bytes kept for the gradient and
/// read.
Rounded productIntoSwiglu(const Op &op, const StorageQuery &q) {
  if (!onTensorCores(op) || op.kind() != OpKind::MatMul)
    return {};
  // (Or the FP8 quantizes that apply them: fuse-gelu-quantize's activation="swiglu" and
  // "swiglu_backward", which read h as x and as their operand 3, dy as x.)
  bool chosen = q.onlyReadAs(op.result(), [](const Op &user) {
    return user.kind() == OpKind::Swiglu || activationOf(user) == QuantizeActivation::Swiglu ? 0
           : user.kind() == OpKind::SwigluBackward                                          ? 1
           : activationOf(user) == QuantizeActivation::SwigluBackward                       ? 3
                                                                                            : -1;
  });
  chosen |= q.onlyReadAs(op.result(), [](const Op &user) {
    return user.kind() == OpKind::SwigluBackward || activationOf(user) == QuantizeActivation::SwigluBackward ? 0 : -1;
  });
  return chosen ? Rounded{{&op, op.result()}} : Rounded{};
}

/// Logits a BF16 or FP8 GEMM writes for the loss and its gradient alone, which read them in
/// BF16 (an FP8 head's loss and gradient in the quantize that makes the gradient's bytes).
Rounded bf16Logits(const Op &op, const StorageQuery &q) {
  if (!onTensorCores(op) || op.kind() != OpKind::MatMul)
    return {};
  bool chosen = q.onlyReadAs(op.result(), [](const Op &user) {
    return user.kind() == OpKind::CrossEntropy                                    ? 0
           : user.kind() == OpKind::CrossEntropyBackward                          ? 1
           : activationOf(user) == QuantizeActivation::CrossEntropyBackward ? 0
                                                                                  : -1;
  });
  return chosen ? Rounded{{&op, op.result()}} : Rounded{};
}

/// The rounding rules (CudaProgram::bf16Rounding), one a line: each names the values an op may
/// write in BF16 beyond the program's own BF16, and the legality it checks. None reads what
/// another chooses, so their order is free. Unlike the other BF16 stores these round (within
/// BF16's rounding, as PyTorch's autocast computes these layers and Transformer Engine stores
/// them); LoweringOptions::bf16Rounding turns all of them off.
struct RoundingRule {
  const char *name;
  Rounded (*match)(const Op &op, const StorageQuery &q);
};
const RoundingRule kRoundingRules[] = {
    {"gelu-epilogues", geluEpilogues},         // fc1's GELU_AUX_BIAS output and h, fc2's DGELU result
    {"fp8-pre-activation", fp8PreActivation},  // an FP8 fc1's h, kept for the GELU's gradient
    {"norm-into-quantize", normIntoQuantize},  // ln1's and ln2's outputs under FP8
    {"fp8-gelu-gradient", fp8GeluGradient},    // fc2's FP8 dgrad, into fc1's gradient quantize
    {"product-into-norm", productIntoNorm},    // proj and fc2 into the residual norm; dgrads into norm gradients
    {"bf16-logits", bf16Logits},               // the head's logits, for the loss alone
    {"product-into-swiglu", productIntoSwiglu}, // fc1's h for SwiGLU and its gradient; fc2's dgrad for it
    {"product-into-quantize", productIntoQuantize}, // FP8 attention's qkv and dout, into their quantizes
};

} // namespace

/// The KV caches a BF16 kv_write writes in place, read by nothing but such writes, BF16
/// decode_attention and their assigns, are stored in BF16 (with the writes' results): half the
/// memory, half the bytes the attention reads, the same values (the writes round them).
void chooseBf16Caches(const Graph &graph, CudaProgram &program) {
  auto readsBf16 = [](const Value *v) {
    for (const Op *user : v->users()) {
      bool bf16 = hasBf16Gemms(user->attrs());
      if (user->kind() == OpKind::Assign || (user->kind() == OpKind::KvWrite && bf16 && user->operand(2) != v) ||
          (user->kind() == OpKind::DecodeAttention && bf16 && user->operand(0) != v))
        continue;
      return false;
    }
    return true;
  };
  for (const Op *op : graph.ops()) {
    // kv_write's caches are its operands and results 0 and 1; decode_attention {write_cache}'s
    // its operands and results 1 and 2.
    bool fused = op->kind() == OpKind::DecodeAttention && writesCache(op->attrs());
    if ((op->kind() != OpKind::KvWrite && !fused) || !hasBf16Gemms(op->attrs()))
      continue;
    for (unsigned r = 0; r < 2; ++r) {
      const Value *cache = op->operand(fused ? r + 1 : r), *written = op->result(fused ? r + 1 : r);
      if (program.inPlace.lookup(written) != cache || cache->def()->kind() != OpKind::State ||
          !readsBf16(cache) || !readsBf16(written) || llvm::is_contained(graph.outputs(), written))
        continue;
      program.bf16Stored.insert(cache);
      program.bf16Stored.insert(written);
    }
  }
}

/// The head-major q, k, v an attention keeps for its gradient (keep-attention-heads) are stored
/// in BF16, as the tensor-core kernels read them: their forward writes the BF16 values its
/// gradient would otherwise make. Each is an attention's third result (or an input: a test's
/// gradient alone), read by head-major gradients alone, or returned.
llvm::Error chooseBf16Heads(const Graph &graph, CudaProgram &program) {
  auto fail = [](const Value *v) {
    return makeError("error: %{}: head-major q, k, v come from an attention (or an input) and go "
                     "to its gradient alone on the GPU (they are stored in BF16)",
                     v->name().c_str());
  };
  for (const Op *op : graph.ops()) {
    bool forward = op->kind() == OpKind::Attention && op->numResults() > 2;
    bool gradient = op->kind() == OpKind::AttentionBackward && isHeadMajor(op->attrs());
    if (!forward && !gradient)
      continue;
    const Value *heads = forward ? op->result(2) : op->operand(1);
    OpKind producer = heads->def()->kind();
    if (producer != OpKind::Attention && producer != OpKind::Input)
      return fail(heads);
    for (const Op *user : heads->users())
      if (user->kind() != OpKind::AttentionBackward || !isHeadMajor(user->attrs()) || user->operand(1) != heads)
        return fail(heads);
    program.bf16Stored.insert(heads);
  }
  return llvm::Error::success();
}

void chooseBf16Rounding(const Graph &graph, CudaProgram &program) {
  StorageQuery query(graph, program);
  for (const Op *op : graph.ops())
    for (const RoundingRule &rule : kRoundingRules)
      for (auto [producer, value] : rule.match(*op, query)) {
        program.bf16Rounding.insert(producer);
        markWithReshapes(program.bf16Stored, value);
      }
}

namespace {

/// `v` is an intermediate that `reader` alone reads, once.
bool readOnlyBy(const Graph &graph, const Value *v, const Op &reader) {
  if (llvm::is_contained(graph.outputs(), v) || v->users().size() != 1 || v->users().front() != &reader)
    return false;
  return llvm::count(reader.operands(), v) == 1;
}

/// A BF16 or FP8 GEMM of many rows that could write its output in BF16 instead.
bool writesBf16Instead(const Op *gemm, OpKind kind) {
  return gemm && gemm->kind() == kind && (hasBf16Gemms(gemm->attrs()) || isFp8(gemm->operand(0)->type().dtype)) &&
         fewRows(*gemm) == FewRows::None;
}

/// `qkv` is read by `forward` once and otherwise only as the rows BF16 kv_writes put in the
/// caches (a prompt's keys and values: the writes round them as the attention does).
bool readByAttentionAndCacheWrites(const Graph &graph, const Value *qkv, const Op &forward) {
  if (llvm::is_contained(graph.outputs(), qkv) || llvm::count(forward.operands(), qkv) != 1)
    return false;
  return llvm::all_of(qkv->users(), [&](const Op *user) {
    return user == &forward || (user->kind() == OpKind::KvWrite && hasBf16Gemms(user->attrs()) &&
                                llvm::count(user->operands(), qkv) == 1 && user->operand(2) == qkv);
  });
}

} // namespace

bool cudnnReadsQkvRows(const Graph &graph, const Op &forward, const LoweringOptions &options) {
  AttentionHeads h = attentionHeads(forward.attrs());
  if (!options.storeBf16 || !options.bf16Rounding || forward.kind() != OpKind::Attention || h.grouped() ||
      h.ropeTheta) // (qkv's rows: 3 D wide, q and k as written)
    return false;
  // qkv from a BF16 GEMM adding a parameter's bias (the executor's BF16 copy holds it).
  const Value *qkv = forward.operand(0);
  const Op *gemm = qkv->def();
  if (!writesBf16Instead(gemm, OpKind::MatMulBias) || !reshapeRoot(gemm->operand(2))->def() ||
      reshapeRoot(gemm->operand(2))->def()->kind() != OpKind::Param)
    return false;
  // A forward without a gradient (prefill, evaluation): qkv read by it and by the cache writes.
  if (forward.numResults() == 2)
    return readByAttentionAndCacheWrites(graph, qkv, forward);
  // Training's: qkv read by this attention alone; its head-major copy read by head-major
  // gradients alone, as q, k, v.
  const Value *heads = forward.result(2);
  if (forward.numResults() != 3 || !readOnlyBy(graph, qkv, forward) || heads->users().empty() ||
      llvm::is_contained(graph.outputs(), heads))
    return false;
  return llvm::all_of(heads->users(), [&](const Op *user) {
    return user->kind() == OpKind::AttentionBackward && isHeadMajor(user->attrs()) && readOnlyBy(graph, heads, *user) &&
           user->operand(1) == heads;
  });
}

bool cudnnReadsDoutRows(const Graph &graph, const Op &backward, const LoweringOptions &options) {
  if (!options.storeBf16 || !options.bf16Rounding || backward.kind() != OpKind::AttentionBackward)
    return false;
  // dout from a BF16 GEMM, read by this gradient alone: the GEMM rounds it as the gradient would.
  const Value *dout = backward.operand(0);
  return writesBf16Instead(dout->def(), OpKind::MatMul) && readOnlyBy(graph, dout, backward) &&
         !matmulLayout(dout->def()->attrs()).transposeA;
}

std::optional<CudnnAttentionShape> cudnnAttentionShape(const Graph &graph, const Op &op,
                                                       const LoweringOptions &options) {
  bool fp8 = op.kind() == OpKind::Fp8Attention || op.kind() == OpKind::Fp8AttentionBackward;
  if (op.kind() != OpKind::Attention && op.kind() != OpKind::AttentionBackward && !fp8)
    return std::nullopt;
  const AttrMap &a = op.attrs();
  bool forward = op.kind() == OpKind::Attention || op.kind() == OpKind::Fp8Attention;
  const TensorType &qkv = forward ? op.operand(0)->type() : op.result(0)->type();
  AttentionHeads h = attentionHeads(a);
  CudnnAttentionShape shape;
  shape.B = qkv.dim(0);
  shape.T = qkv.dim(1);
  shape.H = h.heads;
  shape.KV = h.kvHeads;
  shape.DH = qkv.dim(2) / (h.heads + 2 * h.kvHeads);
  shape.scale = *a.getFloat("scale");
  shape.backward = !forward;
  if (fp8) { // q, k, v in the quantized qkv's rows, dout in its own; out and dqkv BF16
    shape.qkvRows = true;
    shape.doutRows = shape.backward;
    shape.fp8.enabled = true;
    shape.fp8.grad = shape.backward && op.operand(0)->type().dtype == DType::F8E5M2 ? CudnnType::E5M2 : CudnnType::E4M3;
    return shape;
  }
  if (!hasBf16Gemms(a) || !attentionOnTensorCores(a, shape.DH) || shape.DH % 8 || shape.DH > 128)
    return std::nullopt;
  if (!shape.backward) {
    shape.qkvRows = cudnnReadsQkvRows(graph, op, options);
  } else {
    const Op *forward = op.operand(1)->def();
    shape.qkvRows = isHeadMajor(a) && forward && cudnnReadsQkvRows(graph, *forward, options);
    shape.doutRows = cudnnReadsDoutRows(graph, op, options);
  }
  return shape;
}

/// An FP8 matmul_bias adds its bias's BF16 copy: cuBLASLt's FP8 epilogues take no other bias
/// type (CudaProgram::bf16Rounding, whatever the options).
llvm::Error chooseFp8Biases(const Graph &graph, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    if (op->kind() != OpKind::MatMulBias || !isFp8(op->operand(0)->type().dtype))
      continue;
    if (!isWeight(program, op->operand(2)))
      return makeError("error: %{}: an FP8 matmul_bias adds a parameter's BF16 copy (cuBLASLt's FP8 "
                       "epilogue); %{} is not a parameter",
                       op->result()->name().c_str(), op->operand(2)->name().c_str());
    program.bf16Rounding.insert(op);
  }
  return llvm::Error::success();
}


bool addsBf16Bias(const CudaProgram &program, const Op &op) {
  return (op.kind() == OpKind::MatMulBias || op.kind() == OpKind::MatMulBiasGelu) && program.bf16Rounding.count(&op);
}

/// cuDNN's attentions that read their operands where the GEMMs wrote them (CudaProgram::qkvRows,
/// doutRows), into the program: those GEMMs write BF16 (bf16Rounding: qkv's bias is added from
/// its BF16 copy), and the head-major copy the forward would make is qkv's memory.
llvm::Error chooseCudnnRows(const Graph &graph, const LoweringOptions &options, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    if (!program.cudnnAttention.count(op))
      continue;
    if (op->kind() == OpKind::Attention && cudnnReadsQkvRows(graph, *op, options)) {
      const Value *qkv = op->operand(0), *heads = op->numResults() > 2 ? op->result(2) : nullptr;
      for (const Op *user : heads ? heads->users() : llvm::ArrayRef<Op *>())
        if (!program.cudnnAttention.count(user))
          return makeError("error: %{}: cuDNN runs the attention that reads q, k and v in place "
                           "but not its gradient %{}",
                           op->result()->name().c_str(), user->result()->name().c_str());
      program.bf16Rounding.insert(qkv->def());
      program.bf16Stored.insert(qkv);
      if (heads)
        program.qkvRows[heads] = qkv;
    }
    if (op->kind() == OpKind::AttentionBackward && cudnnReadsDoutRows(graph, *op, options)) {
      program.bf16Rounding.insert(op->operand(0)->def());
      program.bf16Stored.insert(op->operand(0));
      program.doutRows.insert(op);
    }
  }
  return llvm::Error::success();
}

/// The values whose producers write them in BF16 for the BF16 GEMMs that read them: f32 results
/// of the ops whose kernels store through an output type (the op table's Bf16Out column: their
/// templates write `out[i] = ...` only, which Bf16Out and F32Bf16Out turn into the right
/// stores), with their reshapes. Into program.bf16Stored when only BF16 GEMMs read them, into
/// bf16Shadowed when others do too.
void chooseBf16Values(const Graph &graph, CudaProgram &program) {
  for (const Op *op : graph.ops()) {
    // The op table's Bf16Out column; gemv.cuh's products write through an output type too.
    // cuDNN's attention writes its results in BF16 (the gradient's dqkv too).
    if ((!opInfo(op->kind()).bf16Outputs && fewRows(*op) == FewRows::None && !program.cudnnAttention.count(op)) ||
        prefixOfGathered(*op)) // (a view of fp32 memory)
      continue;
    for (unsigned r = 0; r < op->numResults(); ++r) {
      const Value *v = op->result(r);
      Readers readers;
      countReaders(graph, program, v, readers);
      if (v->type().dtype != DType::F32 || readers.bf16Gemms == 0 || program.inPlace.count(v) ||
          program.layout.grads.count(v))
        continue;
      if (op->kind() == OpKind::ResidualNorm && r == 0) // its template writes the sum as a float *
        continue;
      markWithReshapes(readers.others == 0 ? program.bf16Stored : program.bf16Shadowed, v);
    }
  }
}
} // namespace tgc
