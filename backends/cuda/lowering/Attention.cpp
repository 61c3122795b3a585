// The attention family (attention.cuh): tgc's tensor-core kernels and its thread-per-row
// fallback, or cuDNN's fused attention between tgc's layout launches.
#include "backends/cuda/lowering/Families.h"
#include "support/Error.h"

#include <fmt/format.h>

namespace tgc {

namespace {

/// The gradient's first launch: sum(dout * out) per query (attentionDelta), eight threads a row.
void emitAttentionDelta(Emitter &e, unsigned launch, const std::string &params, bool round, int64_t B, int64_t T,
                        int64_t H, int64_t Dh) {
  e.launch(launch, params, (B * T * H * 8 + kThreads - 1) / kThreads,
           fmt::format("attentionDelta<{}, {}, {}, {}, {}>(dout, out, delta)", boolText(round), B, T, H, Dh));
}

/// Launch `launch`: `from` ([B, T, parts * H * Dh] floats) rounded to BF16 head-major into `to`
/// (toHeadsBf16): q, k and v for the attention's tensor-core kernels and cuDNN's, or dout.
void emitToHeads(Emitter &e, unsigned launch, const std::string &params, int64_t B, int64_t T, int64_t H,
                 int64_t Dh, int parts, const std::string &from, const std::string &to) {
  e.launch(launch, params, elementwiseBlocks(B * T * parts * H * Dh / 4),
           fmt::format("toHeadsBf16<{}, {}, {}, {}, {}>({}, (unsigned short *){})", B, T, parts, H, Dh, from, to));
}

/// The tensor-core attention: the operands first rounded to BF16 in head-major order
/// (toHeadsBf16, into scratch, or with head_major into the forward's third result, which the
/// gradient then reads), then the forward; or the gradient's kernels (sum(dout * out) per query,
/// dk and dv by key tiles, dq by query tiles). Blocks of 64 rows, four warps of 16.
llvm::Error emitAttentionBf16(const Op &op, Emitter &e, int64_t B, int64_t T, int64_t H, int64_t Dh,
                              const std::string &scale) {
  int64_t D = H * Dh, blocks = (T + 63) / 64 * B * H;
  std::string shape = fmt::format("{}, {}, {}, {}", B, T, H, Dh);
  auto toHeads = [&](unsigned launch, const std::string &params, const char *from, const char *to, int parts) {
    emitToHeads(e, launch, params, B, T, H, Dh, parts, from, to);
  };
  bool headMajor = isHeadMajor(op.attrs()); // keep-attention-heads: the copy is a result, or an operand
  int64_t copyFloats = 3 * B * T * D / 2;     // the BF16 q, k, v
  if (op.kind() == OpKind::Attention) {
    // heads: a result stored in BF16 (chooseBf16Heads: a Bf16Out), or scratch.
    const char *params = "const float *qkv, float *out, float *lse, float *heads";
    const char *heads = headMajor ? "heads.p" : "heads";
    if (!headMajor)
      e.lowering.scratchFloats = {copyFloats};
    toHeads(0, params, "qkv", heads, 3);
    e.launch(1, params, blocks,
             fmt::format("attentionForwardBf16<{}>((const unsigned short *){}, out, lse, {})", shape, heads, scale),
             128);
    return llvm::Error::success();
  }
  // With the head-major copy as the operand (in qkv's place), launch 0 (qkv's conversion) is not
  // emitted and the copy needs no scratch; the others keep their numbers.
  e.lowering.scratchFloats = {B * T * D / 2, B * H * T};
  if (!headMajor)
    e.lowering.scratchFloats.insert(e.lowering.scratchFloats.begin(), copyFloats);
  const char *params = headMajor ? "const float *dout, const float *heads, const float *out, const float *lse, "
                                   "float *dqkv, float *doutHeads, float *delta"
                                 : "const float *dout, const float *qkv, const float *out, const float *lse, "
                                   "float *dqkv, float *heads, float *doutHeads, float *delta";
  std::string operands = "(const unsigned short *)doutHeads, (const unsigned short *)heads";
  if (!headMajor)
    toHeads(0, params, "qkv", "heads", 3);
  toHeads(1, params, "dout", "doutHeads", 1);
  emitAttentionDelta(e, 2, params, true, B, T, H, Dh);
  // Three blocks an SM at head dimension 64 (168 registers, from 173, with no spills).
  e.launch(3, params, blocks,
           fmt::format("attentionKeyValueGradBf16<{}>({}, dqkv, {}, lse, delta)", shape, operands, scale), 128,
           Dh <= 64 ? 3 : 0);
  e.launch(4, params, blocks,
           fmt::format("attentionQueryGradBf16<{}>({}, dqkv, {}, lse, delta)", shape, operands, scale), 128);
  return llvm::Error::success();
}

/// cuDNN's fused attention (CudnnAttention) between tgc's launches. The forward: q, k, v to
/// BF16 head-major (as the tensor-core kernels take them) unless cuDNN reads them in place
/// (CudaProgram::qkvRows), cuDNN, and out from BF16 where it is not stored in BF16. The
/// gradient: dout to BF16 head-major unless its GEMM wrote it in BF16 (doutRows), out to BF16
/// where it is not stored so, cuDNN writing dq, dk and dv into dqkv's BF16 form, then dqkv's
/// fp32 form from it.
llvm::Error emitCudnnAttention(const Op &op, Emitter &e, int64_t B, int64_t T, int64_t H, int64_t Dh) {
  int64_t D = H * Dh, headBytes = B * T * D * 2; // one of q, k, v head-major in BF16
  OpLowering &l = e.lowering;
  l.cudnnAttention = true;
  bool headMajor = isHeadMajor(op.attrs());
  auto toHeads = [&](unsigned launch, const std::string &params, const std::string &from, const std::string &to,
                     int parts) { emitToHeads(e, launch, params, B, T, H, Dh, parts, from, to); };
  auto widen = [&](unsigned launch, const std::string &params, int64_t count, const std::string &from,
                   const char *to) {
    e.launch(launch, params, elementwiseBlocks(count / 4),
             fmt::format("widenBf16<{}>((const unsigned short *){}, {})", count, from, to));
  };
  using Buffer = OpLowering::LibraryBuffer;
  // q, k and v: head-major, or in place in qkv's BF16 rows (CudaProgram::qkvRows), D apart.
  auto qkvBuffers = [&](unsigned pointer, bool rows) {
    for (int part = 0; part < 3; ++part)
      l.libraryBuffers.push_back(Buffer{pointer, part * (rows ? D * 2 : headBytes)});
  };
  int64_t workspaceFloats = (e.program_.cudnnAttention.lookup(&op) + 3) / 4;
  if (op.kind() == OpKind::Attention) {
    // Pointers: qkv, out [, its copy], lse, heads (a result with head_major), scratch.
    std::string params = headMajor ? "const float *qkv, float *out, float *lse, float *heads"
                                   : "const float *qkv, float *out, float *lse";
    bool rows = headMajor && e.program_.qkvRows.count(op.result(2)); // heads is qkv's memory
    unsigned heads = rows ? 0 : headMajor ? e.resultPointer(2) : e.addScratch(3 * headBytes / 4);
    bool outStored = e.program_.bf16Stored.count(op.result(0)), outCopy = e.program_.bf16Shadowed.count(op.result(0));
    unsigned outBuffer = outStored ? e.resultPointer(0)
                         : outCopy ? e.resultPointer(0) + 1 // the BF16 copy's pointer follows the fp32 one
                                   : e.addScratch(headBytes / 4);
    unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
    params += e.scratchParams();
    unsigned launch = 0;
    if (!rows)
      toHeads(launch++, params, "qkv", headMajor ? "heads.p" : e.scratchName(heads), 3);
    l.libraryAt = launch;
    qkvBuffers(heads, rows);
    l.libraryBuffers.push_back(Buffer{outBuffer, 0});
    l.libraryBuffers.push_back(Buffer{e.resultPointer(1), 0});
    l.libraryBuffers.push_back(Buffer{workspace, 0});
    if (outCopy)
      widen(launch, params, B * T * D, "out.h", "out.f");
    else if (!outStored)
      widen(launch, params, B * T * D, e.scratchName(outBuffer), "out");
    return llvm::Error::success();
  }
  // Pointers: dout, qkv or heads, out, lse, dqkv [, its copy], scratch.
  std::string params = fmt::format("const float *dout, const float *{}, const float *out, const float *lse, float *dqkv",
                                   headMajor ? "heads" : "qkv");
  const Value *dqkv = op.result(0), *out = op.operand(2);
  bool dqkvStored = e.program_.bf16Stored.count(dqkv), dqkvCopy = e.program_.bf16Shadowed.count(dqkv);
  bool outStored = e.program_.bf16Stored.count(out);
  bool rows = headMajor && e.program_.qkvRows.count(op.operand(1)), doutRows = e.program_.doutRows.count(&op);
  unsigned heads = headMajor ? 1 : e.addScratch(3 * headBytes / 4);
  unsigned doutHeads = doutRows ? 0 : e.addScratch(headBytes / 4), rowSums = e.addScratch(B * H * T);
  unsigned outBuffer = outStored ? 2 : e.addScratch(headBytes / 4);
  unsigned dqkvBuffer = dqkvStored ? e.resultPointer(0)
                        : dqkvCopy ? e.resultPointer(0) + 1 // the BF16 copy's pointer follows the fp32 one
                                   : e.addScratch(3 * headBytes / 4);
  unsigned workspace = e.addScratch(std::max<int64_t>(workspaceFloats, 1));
  params += e.scratchParams();
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
  for (int part = 0; part < 3; ++part)
    l.libraryBuffers.push_back(Buffer{dqkvBuffer, part * D * 2});
  l.libraryBuffers.push_back(Buffer{rowSums, 0});
  l.libraryBuffers.push_back(Buffer{workspace, 0});
  if (dqkvCopy) // the fp32 form from the BF16 copy cuDNN wrote
    widen(launch, params, 3 * B * T * D, "dqkv.h", "dqkv.f");
  else if (!dqkvStored)
    widen(launch, params, 3 * B * T * D, e.scratchName(dqkvBuffer), "dqkv");
  return llvm::Error::success();
}

} // namespace

/// Fused attention and its gradient (attention.cuh): BF16 tensor cores under gemm_dtype at
/// head dimensions that are multiples of 16 up to 256, else a thread per row.
llvm::Error emitAttention(const Op &op, Emitter &e) {
  const AttrMap &a = op.attrs();
  // The packed qkv's shape: the forward's operand, the gradient's result.
  const TensorType &qkv = op.kind() == OpKind::Attention ? operandType(op, 0) : outputType(op);
  int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / 3, H = *a.getInt("heads"), Dh = D / H;
  bool bf16 = hasBf16Gemms(a);
  std::string scale = lit(*a.getFloat("scale"));
  int64_t blocks = (T + 63) / 64 * B * H;
  e.uses("attention.cuh");
  if (e.program_.cudnnAttention.count(&op))
    return emitCudnnAttention(op, e, B, T, H, Dh);
  if (attentionOnTensorCores(a, Dh))
    return emitAttentionBf16(op, e, B, T, H, Dh, scale);
  if (isHeadMajor(a))
    return makeError("error: %{}: head-major q, k, v need the tensor-core attention kernels",
                     op.result()->name().c_str());
  // A thread per row of a 64-row tile.
  std::string shape = fmt::format("{}, {}, {}, {}", boolText(bf16), T, H, Dh);
  if (op.kind() == OpKind::Attention) {
    e.launch(0, "const float *qkv, float *out, float *lse", blocks,
             fmt::format("attentionForwardSimt<{}>(qkv, out, lse, {})", shape, scale), 64);
    return llvm::Error::success();
  }
  e.lowering.scratchFloats = {B * H * T};
  const char *params =
      "const float *dout, const float *qkv, const float *out, const float *lse, float *dqkv, float *delta";
  emitAttentionDelta(e, 0, params, bf16, B, T, H, Dh);
  e.launch(1, params, blocks, fmt::format("attentionKeyValueGradSimt<{}>(dout, qkv, dqkv, {}, lse, delta)", shape, scale),
           64);
  e.launch(2, params, blocks, fmt::format("attentionQueryGradSimt<{}>(dout, qkv, dqkv, {}, lse, delta)", shape, scale),
           64);
  return llvm::Error::success();
}

} // namespace tgc
