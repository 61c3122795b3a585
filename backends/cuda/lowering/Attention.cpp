// The attention family (attention.cuh): tgc's tensor-core kernels and its thread-per-row
// fallback, or cuDNN's fused attention between tgc's layout launches.
#include "backends/cuda/lowering/Families.h"
#include "ir/Rope.h"
#include "support/Error.h"

#include <fmt/format.h>

namespace tgc {

namespace {

/// One attention's shape as its kernels take it: B, T, the query heads H, the KV heads KV, the
/// head dimension, and RoPE (the rotation table is then the op's constants).
struct AttentionLaunch {
  int64_t B, T, H, KV, Dh;
  bool rope;
  int64_t D() const { return H * Dh; }
  int64_t W() const { return (H + 2 * KV) * Dh; }
  /// The template arguments KV and ROPE after the kernels' usual ones: none for multi-head
  /// attention without RoPE (the kernels' defaults, GPT-2's programs as before).
  std::string kvArg() const { return KV != H ? fmt::format(", {}", KV) : ""; }
  std::string kvRopeArgs() const {
    return rope ? fmt::format(", {}, true", KV) : kvArg();
  }
  std::string table() const { return rope ? ", table" : ""; }
};

AttentionLaunch attentionLaunch(const Op &op) {
  bool forward = op.kind() == OpKind::Attention || op.kind() == OpKind::Fp8Attention;
  const TensorType &qkv = forward ? operandType(op, 0) : outputType(op);
  AttentionHeads h = attentionHeads(op.attrs());
  return {qkv.dim(0), qkv.dim(1), h.heads, h.kvHeads, qkv.dim(2) / (h.heads + 2 * h.kvHeads), h.ropeTheta.has_value()};
}

/// Under RoPE, the op's constants: ir/Rope.h's table of positions 0 .. T - 1 (doubles holding
/// the floats exactly), read by the kernels that rotate q and k; ", const double *table" for
/// the launches' parameters, which the constants end.
std::string ropeConstants(const Op &op, const AttentionLaunch &s, Emitter &e) {
  if (!s.rope)
    return "";
  std::vector<float> table = ropeTable(ropeOptions(op.attrs(), "rope_theta"), s.T, s.Dh);
  e.lowering.constants.assign(table.begin(), table.end());
  return ", const double *table";
}

/// The gradient's first launch: sum(dout * out) per query (attentionDelta), eight threads a row.
void emitAttentionDelta(Emitter &e, unsigned launch, const std::string &params, bool round, int64_t B, int64_t T,
                        int64_t H, int64_t Dh) {
  e.launch(launch, params, (B * T * H * 8 + kThreads - 1) / kThreads,
           fmt::format("attentionDelta<{}, {}, {}, {}, {}>(dout, out, delta)", boolText(round), B, T, H, Dh));
}

/// Launch `launch`: `from` rounded to BF16 head-major into `to` (toHeadsBf16): qkv's q, k and v
/// (parts 3; under RoPE q and k rotated) for the attention's tensor-core kernels and cuDNN's,
/// or dout (parts 1).
void emitToHeads(Emitter &e, unsigned launch, const std::string &params, const AttentionLaunch &s, int parts,
                 const std::string &from, const std::string &to) {
  int64_t count = parts == 1 ? s.B * s.T * s.D() : s.B * s.T * s.W();
  e.launch(launch, params, elementwiseBlocks(count / 4),
           fmt::format("toHeadsBf16<{}, {}, {}, {}, {}{}>({}, (unsigned short *){}{})", s.B, s.T, parts, s.H, s.Dh,
                       parts == 1 ? "" : s.kvRopeArgs(), from, to, parts == 1 ? "" : s.table()));
}

/// The tensor-core attention: the operands first rounded to BF16 in head-major order
/// (toHeadsBf16, into scratch, or with head_major into the forward's third result, which the
/// gradient then reads), then the forward; or the gradient's kernels (sum(dout * out) per query,
/// dk and dv by key tiles of each KV head, dq by query tiles; under RoPE dq and dk turned back
/// as they are written). Blocks of 64 rows, four warps of 16.
llvm::Error emitAttentionBf16(const Op &op, Emitter &e, const AttentionLaunch &s, const std::string &scale) {
  int64_t B = s.B, T = s.T, H = s.H, Dh = s.Dh, tiles = (T + 63) / 64;
  std::string shape = fmt::format("{}, {}, {}, {}", B, T, H, Dh);
  auto toHeads = [&](unsigned launch, const std::string &params, const char *from, const char *to, int parts) {
    emitToHeads(e, launch, params, s, parts, from, to);
  };
  bool headMajor = isHeadMajor(op.attrs()); // keep-attention-heads: the copy is a result, or an operand
  int64_t copyFloats = B * T * s.W() / 2;    // the BF16 q, k, v
  std::string table = ropeConstants(op, s, e);
  if (op.kind() == OpKind::Attention) {
    // heads: a result stored in BF16 (chooseBf16Heads: a Bf16Out), or scratch.
    std::string params = "const float *qkv, float *out, float *lse, float *heads" + table;
    const char *heads = headMajor ? "heads.p" : "heads";
    if (!headMajor)
      e.lowering.scratchFloats = {copyFloats};
    toHeads(0, params, "qkv", heads, 3);
    e.launch(1, params, tiles * B * H,
             fmt::format("attentionForwardBf16<{}{}>((const unsigned short *){}, out, lse, {})", shape, s.kvArg(),
                         heads, scale),
             128);
    return llvm::Error::success();
  }
  // With the head-major copy as the operand (in qkv's place), launch 0 (qkv's conversion) is not
  // emitted and the copy needs no scratch; the others keep their numbers.
  e.lowering.scratchFloats = {B * T * s.D() / 2, B * H * T};
  if (!headMajor)
    e.lowering.scratchFloats.insert(e.lowering.scratchFloats.begin(), copyFloats);
  std::string params = std::string(headMajor ? "const float *dout, const float *heads, const float *out, const float *lse, "
                                               "float *dqkv, float *doutHeads, float *delta"
                                             : "const float *dout, const float *qkv, const float *out, const float *lse, "
                                               "float *dqkv, float *heads, float *doutHeads, float *delta") +
                       table;
  std::string operands = "(const unsigned short *)doutHeads, (const unsigned short *)heads";
  if (!headMajor)
    toHeads(0, params, "qkv", "heads", 3);
  toHeads(1, params, "dout", "doutHeads", 1);
  emitAttentionDelta(e, 2, params, true, B, T, H, Dh);
  // Three blocks an SM at head dimension 64 (168 registers, from 173, with no spills).
  e.launch(3, params, tiles * B * s.KV,
           fmt::format("attentionKeyValueGradBf16<{}{}>({}, dqkv, {}, lse, delta{})", shape, s.kvRopeArgs(), operands,
                       scale, s.table()),
           128, Dh <= 64 ? 3 : 0);
  e.launch(4, params, tiles * B * H,
           fmt::format("attentionQueryGradBf16<{}{}>({}, dqkv, {}, lse, delta{})", shape, s.kvRopeArgs(), operands,
                       scale, s.table()),
           128);
  return llvm::Error::success();
}

/// Where cuDNN writes the BF16 form of the fp32 result `v` (the op's pointer `pointer`): `v`
/// itself where it is stored in BF16, its BF16 copy (whose pointer follows the fp32 one) where
/// shadowed, else scratch of `bytes` that widenCudnnResult widens.
unsigned cudnnResultBuffer(Emitter &e, const Value *v, unsigned pointer, int64_t bytes) {
  if (e.program_.bf16Stored.count(v))
    return pointer;
  return e.program_.bf16Shadowed.count(v) ? pointer + 1 : e.addScratch(bytes / 4);
}

/// Launch `launch`, after cuDNN: the fp32 form of `v` (parameter `name`, `count` elements) from
/// the BF16 cuDNN wrote at `buffer` (cudnnResultBuffer's), where `v` is not stored in BF16.
void widenCudnnResult(Emitter &e, unsigned launch, const std::string &params, const Value *v, unsigned buffer,
                      int64_t count, const std::string &name) {
  if (e.program_.bf16Stored.count(v))
    return;
  bool shadowed = e.program_.bf16Shadowed.count(v);
  e.launch(launch, params, elementwiseBlocks(count / 4),
           fmt::format("widenBf16<{}>((const unsigned short *){}, {})", count,
                       shadowed ? name + ".h" : e.scratchName(buffer), shadowed ? name + ".f" : name));
}

/// cuDNN's fused attention (CudnnAttention) between tgc's launches. The forward: q, k, v to
/// BF16 head-major (as the tensor-core kernels take them; under RoPE q and k rotated) unless
/// cuDNN reads them in place (CudaProgram::qkvRows), cuDNN, and out from BF16 where it is not
/// stored in BF16. The gradient: dout to BF16 head-major unless its GEMM wrote it in BF16
/// (doutRows), out to BF16 where it is not stored so, cuDNN writing dq, dk and dv into dqkv's
/// BF16 form, then dqkv's fp32 form from it (under RoPE, dq and dk turned back on the way).
llvm::Error emitCudnnAttention(const Op &op, Emitter &e, const AttentionLaunch &s) {
  int64_t B = s.B, T = s.T, D = s.D(), W = s.W();
  int64_t headBytes = B * T * D * 2, kvBytes = B * T * s.KV * s.Dh * 2; // q, and one of k and v, in BF16
  int64_t copyBytes = headBytes + 2 * kvBytes;
  OpLowering &l = e.lowering;
  l.cudnnAttention = true;
  bool headMajor = isHeadMajor(op.attrs());
  std::string table = ropeConstants(op, s, e);
  auto toHeads = [&](unsigned launch, const std::string &params, const std::string &from, const std::string &to,
                     int parts) { emitToHeads(e, launch, params, s, parts, from, to); };
  using Buffer = OpLowering::LibraryBuffer;
  // q, k and v: head-major, or in place in qkv's BF16 rows (CudaProgram::qkvRows), D apart.
  auto qkvBuffers = [&](unsigned pointer, bool rows) {
    for (int64_t offset : rows ? std::vector<int64_t>{0, 2 * D, 4 * D} : std::vector<int64_t>{0, headBytes, headBytes + kvBytes})
      l.libraryBuffers.push_back(Buffer{pointer, offset});
  };
  int64_t workspaceFloats = (e.program_.cudnnAttention.lookup(&op) + 3) / 4;
  if (op.kind() == OpKind::Attention) {
    // Pointers: qkv, out [, its copy], lse, heads (a result with head_major), scratch.
    std::string params = headMajor ? "const float *qkv, float *out, float *lse, float *heads"
                                   : "const float *qkv, float *out, float *lse";
    // In place: keeping heads, they are qkv's memory; without, qkv stored in BF16 is read so.
    bool rows = headMajor ? e.program_.qkvRows.count(op.result(2)) : e.program_.bf16Stored.count(op.operand(0));
    unsigned heads = rows ? 0 : headMajor ? e.resultPointer(2) : e.addScratch(copyBytes / 4);
    unsigned outBuffer = cudnnResultBuffer(e, op.result(0), e.resultPointer(0), headBytes);
    unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
    params += e.scratchParams() + table;
    unsigned launch = 0;
    if (!rows)
      toHeads(launch++, params, "qkv", headMajor ? "heads.p" : e.scratchName(heads), 3);
    l.libraryAt = launch;
    qkvBuffers(heads, rows);
    l.libraryBuffers.push_back(Buffer{outBuffer, 0});
    l.libraryBuffers.push_back(Buffer{e.resultPointer(1), 0});
    l.libraryBuffers.push_back(Buffer{workspace, 0});
    widenCudnnResult(e, launch, params, op.result(0), outBuffer, B * T * D, "out");
    return llvm::Error::success();
  }
  // Pointers: dout, qkv or heads, out, lse, dqkv [, its copy], scratch.
  std::string params = fmt::format("const float *dout, const float *{}, const float *out, const float *lse, float *dqkv",
                                   headMajor ? "heads" : "qkv");
  const Value *dqkv = op.result(0), *out = op.operand(2);
  bool outStored = e.program_.bf16Stored.count(out);
  bool rows = headMajor && e.program_.qkvRows.count(op.operand(1)), doutRows = e.program_.doutRows.count(&op);
  unsigned heads = headMajor ? 1 : e.addScratch(copyBytes / 4);
  unsigned doutHeads = doutRows ? 0 : e.addScratch(headBytes / 4), rowSums = e.addScratch(B * s.H * T);
  unsigned outBuffer = outStored ? 2 : e.addScratch(headBytes / 4);
  // Under RoPE cuDNN's dq and dk are turned back on their way to dqkv: they go through scratch.
  unsigned dqkvBuffer = s.rope ? e.addScratch(B * T * W / 2) : cudnnResultBuffer(e, dqkv, e.resultPointer(0), B * T * W * 2);
  unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
  params += e.scratchParams() + table;
  unsigned launch = 0;
  if (!headMajor)
    toHeads(launch++, params, "qkv", e.scratchName(heads), 3);
  if (!doutRows)
    toHeads(launch++, params, "dout", e.scratchName(doutHeads), 1);
  if (!outStored)
    e.launch(launch++, params, elementwiseBlocks(B * T * D),
             fmt::format("roundToBf16(out, (unsigned short *){}, {})", e.scratchName(outBuffer), B * T * D));
  l.libraryAt = launch;
  qkvBuffers(heads, rows);
  l.libraryBuffers.push_back(Buffer{outBuffer, 0});
  l.libraryBuffers.push_back(Buffer{doutHeads, 0});
  l.libraryBuffers.push_back(Buffer{3, 0}); // lse
  for (int64_t offset : {int64_t(0), 2 * D, 2 * (D + s.KV * s.Dh)}) // dq, dk, dv in dqkv's BF16 rows
    l.libraryBuffers.push_back(Buffer{dqkvBuffer, offset});
  l.libraryBuffers.push_back(Buffer{rowSums, 0});
  l.libraryBuffers.push_back(Buffer{workspace, 0});
  if (s.rope)
    e.launch(launch, params, elementwiseBlocks(B * T * W / 2),
             fmt::format("ropeRows<{}, {}, {}, {}, {}, true>((const unsigned short *){}, dqkv, table)", B, T, s.H, s.KV,
                         s.Dh, e.scratchName(dqkvBuffer)));
  else
    widenCudnnResult(e, launch, params, dqkv, dqkvBuffer, B * T * W, "dqkv");
  return llvm::Error::success();
}

/// cuDNN's FP8 attention (CudnnFp8) between tgc's launches: q, k and v read in place in the
/// quantized qkv's rows, the scales from the ops' state operands (out's, dq's, dk's and dv's 1:
/// a launch writes them), out and dqkv written in BF16 (stored so where their readers take BF16,
/// as they do in tgc's programs: StorageRules.cpp; else widened); the gradient reads dout
/// quantized in its rows and out in BF16 (rounded first where not stored so).
llvm::Error emitCudnnFp8Attention(const Op &op, Emitter &e, const AttentionLaunch &s) {
  const int64_t B = s.B, T = s.T, D = s.D(), headBytes = B * T * D * 2;
  OpLowering &l = e.lowering;
  l.cudnnAttention = true;
  e.headers.insert("elementwise.cuh"); // fill: the unit scales (cuDNN reads every scale from memory)
  using Buffer = OpLowering::LibraryBuffer;
  const int64_t workspaceFloats = (e.program_.cudnnAttention.lookup(&op) + 3) / 4;
  if (op.kind() == OpKind::Fp8Attention) {
    // Pointers: q, q_scale_inv, s_scale, s_scale_inv, out [, its copy], lse, amax_s, scratch.
    std::string params = "const float *q, const float *qScaleInv, const float *sScale, const float *sScaleInv, "
                         "float *out, float *lse, float *amaxS";
    const Value *out = op.result(0);
    unsigned outBuffer = cudnnResultBuffer(e, out, e.resultPointer(0), headBytes);
    unsigned one = e.addScratch(4), amaxO = e.addScratch(4); // (4 floats: 16-byte apart)
    unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
    params += e.scratchParams();
    e.launch(0, params, 1, fmt::format("fill<1>({}, 1.0f)", e.scratchName(one)));
    l.libraryAt = 1;
    for (int64_t offset : {int64_t(0), D, 2 * D}) // q, k, v: one byte an element
      l.libraryBuffers.push_back(Buffer{0, offset});
    l.libraryBuffers.push_back(Buffer{outBuffer, 0});
    l.libraryBuffers.push_back(Buffer{e.resultPointer(1), 0});
    for (unsigned p : {1u, 1u, 1u, 3u, 2u, one, e.resultPointer(2), amaxO}) // descales q k v S, scales S O, amaxes
      l.libraryBuffers.push_back(Buffer{p, 0});
    l.libraryBuffers.push_back(Buffer{workspace, 0});
    widenCudnnResult(e, 1, params, out, outBuffer, B * T * D, "out");
    return llvm::Error::success();
  }
  // Pointers: dout_q, q, out, lse, q_scale_inv, dout_scale_inv, s_scale, s_scale_inv, dp_scale,
  // dp_scale_inv, dqkv [, its copy], amax_dp, scratch.
  std::string params = "const float *dout, const float *q, const float *out, const float *lse, "
                       "const float *qScaleInv, const float *doutScaleInv, const float *sScale, "
                       "const float *sScaleInv, const float *dpScale, const float *dpScaleInv, float *dqkv, "
                       "float *amaxDP";
  const Value *dqkv = op.result(0), *out = op.operand(2);
  bool outStored = e.program_.bf16Stored.count(out);
  unsigned outBuffer = outStored ? 2 : e.addScratch(headBytes / 4);
  unsigned dqkvBuffer = cudnnResultBuffer(e, dqkv, e.resultPointer(0), 3 * headBytes);
  unsigned ones = e.addScratch(16), amaxes = e.addScratch(12); // four 1s and three amaxes, 16 bytes apart
  unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
  params += e.scratchParams();
  unsigned launch = 0;
  e.launch(launch++, params, 1, fmt::format("fill<16>({}, 1.0f)", e.scratchName(ones)));
  if (!outStored)
    e.launch(launch++, params, elementwiseBlocks(B * T * D),
             fmt::format("roundToBf16(out, (unsigned short *){}, {})", e.scratchName(outBuffer), B * T * D));
  l.libraryAt = launch;
  for (int64_t offset : {int64_t(0), D, 2 * D}) // q, k, v: one byte an element
    l.libraryBuffers.push_back(Buffer{1, offset});
  l.libraryBuffers.push_back(Buffer{outBuffer, 0});
  l.libraryBuffers.push_back(Buffer{0, 0}); // dout, in its rows
  l.libraryBuffers.push_back(Buffer{3, 0}); // lse
  for (int64_t offset : {int64_t(0), 2 * D, 4 * D}) // dq, dk, dv in dqkv's BF16 rows
    l.libraryBuffers.push_back(Buffer{dqkvBuffer, offset});
  // Descales q, k, v, O (1), dout, S, dP; scales S, dP, dq, dk, dv (1s); amaxes dP, dq, dk, dv.
  for (unsigned p : {4u, 4u, 4u, ones, 5u, 7u, 9u, 6u, 8u})
    l.libraryBuffers.push_back(Buffer{p, 0});
  for (int64_t k = 1; k < 4; ++k)
    l.libraryBuffers.push_back(Buffer{ones, 16 * k});
  l.libraryBuffers.push_back(Buffer{e.resultPointer(1), 0});
  for (int64_t k = 0; k < 3; ++k)
    l.libraryBuffers.push_back(Buffer{amaxes, 16 * k});
  l.libraryBuffers.push_back(Buffer{workspace, 0});
  widenCudnnResult(e, launch, params, dqkv, dqkvBuffer, 3 * B * T * D, "dqkv");
  return llvm::Error::success();
}

/// A thread per row of a 64-row tile (fp32, or head dimensions the tensor cores do not take);
/// under RoPE the kernels read a rotated copy of qkv (ropeRows into scratch), and the gradient
/// writes dqkv of the rotated q and k into scratch, turned back into dqkv last.
llvm::Error emitAttentionSimt(const Op &op, Emitter &e, const AttentionLaunch &s, const std::string &scale) {
  int64_t B = s.B, T = s.T, H = s.H, Dh = s.Dh, tiles = (T + 63) / 64;
  bool bf16 = hasBf16Gemms(op.attrs());
  std::string table = ropeConstants(op, s, e);
  std::string shape = fmt::format("{}, {}, {}, {}{}", boolText(bf16), T, H, Dh, s.kvArg());
  std::string rotate = fmt::format("ropeRows<{}, {}, {}, {}, {}, false>(qkv, rotated, table)", B, T, H, s.KV, Dh);
  const char *source = s.rope ? "rotated" : "qkv";
  if (op.kind() == OpKind::Attention) {
    std::string params = "const float *qkv, float *out, float *lse";
    unsigned launch = 0;
    if (s.rope) {
      e.lowering.scratchFloats = {B * T * s.W()};
      params += ", float *rotated" + table;
      e.launch(launch++, params, elementwiseBlocks(B * T * s.W() / 2), rotate);
    }
    e.launch(launch, params, tiles * B * H,
             fmt::format("attentionForwardSimt<{}>({}, out, lse, {})", shape, source, scale), 64);
    return llvm::Error::success();
  }
  e.lowering.scratchFloats = {B * H * T};
  std::string params =
      "const float *dout, const float *qkv, const float *out, const float *lse, float *dqkv, float *delta";
  if (s.rope) {
    e.lowering.scratchFloats.insert(e.lowering.scratchFloats.end(), {B * T * s.W(), B * T * s.W()});
    params += ", float *rotated, float *grads" + table;
  }
  const char *grads = s.rope ? "grads" : "dqkv";
  unsigned launch = 0;
  emitAttentionDelta(e, launch++, params, bf16, B, T, H, Dh);
  if (s.rope)
    e.launch(launch++, params, elementwiseBlocks(B * T * s.W() / 2), rotate);
  e.launch(launch++, params, tiles * B * s.KV,
           fmt::format("attentionKeyValueGradSimt<{}>(dout, {}, {}, {}, lse, delta)", shape, source, grads, scale), 64);
  e.launch(launch++, params, tiles * B * H,
           fmt::format("attentionQueryGradSimt<{}>(dout, {}, {}, {}, lse, delta)", shape, source, grads, scale), 64);
  if (s.rope)
    e.launch(launch, params, elementwiseBlocks(B * T * s.W() / 2),
             fmt::format("ropeRows<{}, {}, {}, {}, {}, true>((const float *)grads, dqkv, table)", B, T, H, s.KV, Dh));
  return llvm::Error::success();
}

} // namespace

/// Fused attention and its gradient (attention.cuh): BF16 tensor cores under gemm_dtype at
/// head dimensions that are multiples of 16 up to 256, else a thread per row.
llvm::Error emitAttention(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  AttentionLaunch s = attentionLaunch(op);
  std::string scale = lit(*a.getFloat("scale"));
  e.uses("attention.cuh");
  bool fp8 = op.kind() == OpKind::Fp8Attention || op.kind() == OpKind::Fp8AttentionBackward;
  if (fp8 && !e.program_.cudnnAttention.count(&op))
    return makeError("error: %{}: FP8 attention runs on cuDNN 9 alone, which this program does not use (cuDNN "
                     "absent, TGC_CUDNN=0, or a shape it refused: the program's description says which)",
                     op.result()->name().c_str());
  if (fp8)
    return emitCudnnFp8Attention(op, e, s);
  if (e.program_.cudnnAttention.count(&op))
    return emitCudnnAttention(op, e, s);
  if (attentionOnTensorCores(a, s.Dh))
    return emitAttentionBf16(op, e, s, scale);
  if (isHeadMajor(a))
    return makeError("error: %{}: head-major q, k, v need the tensor-core attention kernels",
                     op.result()->name().c_str());
  return emitAttentionSimt(op, e, s, scale);
}

} // namespace tgc
