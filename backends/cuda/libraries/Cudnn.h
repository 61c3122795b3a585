// cuDNN, loaded at run time (dlopen): its fused flash attention, forward and backward, built
// through the backend API as the operation graph Transformer Engine and PyTorch give it
// (cudnn_frontend's SDPA nodes: scores, scale, causal mask, softmax with its statistics, the
// product with V; and the gradient's chain). tgc builds and runs without cuDNN: its own
// attention kernels (attention.cuh) run wherever cuDNN is absent, refuses a shape, or
// TGC_CUDNN=0, and they and the CPU interpreter are what cuDNN's results are tested against.
#pragma once

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tgc {

/// cuDNN's C API (cudnn_graph.h, ABI of 9.x), declared here so that no cuDNN header is needed
/// to build: the calls tgc makes. Results are cudnnStatus_t (0: success); handles and
/// descriptors are opaque pointers.
struct CudnnApi {
  std::string path;   // the file loaded
  size_t version = 0; // cudnnGetVersion: 91900 is 9.19.0
  size_t (*getVersion)() = nullptr;
  int (*create)(void **handle) = nullptr;
  int (*destroy)(void *handle) = nullptr;
  int (*setStream)(void *handle, void *stream) = nullptr;
  const char *(*errorString)(int status) = nullptr;
  void (*lastErrorString)(char *message, size_t size) = nullptr;
  int (*createDescriptor)(int type, void **descriptor) = nullptr;
  int (*destroyDescriptor)(void *descriptor) = nullptr;
  int (*finalize)(void *descriptor) = nullptr;
  int (*setAttribute)(void *descriptor, int name, int type, int64_t count, const void *elements) = nullptr;
  int (*getAttribute)(void *descriptor, int name, int type, int64_t requested, int64_t *count,
                      void *elements) = nullptr;
  int (*execute)(void *handle, void *plan, void *variantPack) = nullptr;

  /// "9.19.0".
  std::string versionText() const;
  /// A failed call's status: its name and number, and cuDNN's last error message.
  std::string describe(int status) const;
};

/// Where cuDNN (libcudnn.so.9) is looked for: Libraries.h's order, $TGC_CUDNN_LIBRARY first.
std::vector<std::string> cudnnCandidates();

/// Loads the first of `candidates` that opens, has cuDNN's symbols and is cuDNN 9; the error
/// names each one tried and why it failed.
llvm::Expected<CudnnApi> loadCudnnFrom(const std::vector<std::string> &candidates);

/// loadCudnnFrom(cudnnCandidates()), once a process.
llvm::Expected<const CudnnApi *> loadCudnn();
/// TGC_CUDNN=0: the attention runs on tgc's kernels even where cuDNN is found.
bool cudnnTurnedOff();

/// The element types of cuDNN's attention buffers.
enum class CudnnType { Bf16, E4M3, E5M2 };

/// FP8 attention (cuDNN's FP8 SDPA, what Transformer Engine's fp8_dpa runs): q, k and v in
/// E4M3 with one scale each; the probabilities quantized to E4M3 inside the kernel at the scale
/// S's state gives; the output in `out`'s type (at O's scale where FP8). The gradient reads dout
/// in `grad`'s type, quantizes dS (dP's state) to it, and writes dq, dk and dv in `dqkv`'s.
/// Each scale, descale and amax is one fp32 in GPU memory, 16-byte aligned; the amaxes cuDNN
/// writes are of the values before their scale (S: the normalised probabilities; O, dq, dk,
/// dv: the dequantized products; dP: dS).
struct CudnnFp8 {
  bool enabled = false;
  CudnnType out = CudnnType::Bf16;
  CudnnType grad = CudnnType::E4M3;
  CudnnType dqkv = CudnnType::Bf16;
};

/// A causal attention as tgc lays it out: B sequences of T positions, H heads of DH, scores
/// scaled by `scale` before the softmax. BF16 operands: q, k and v head-major ([3][B][H][T][DH],
/// keep-attention-heads' copy or the lowering's) or, with qkvRows, in place in the rows of the
/// packed [B][T][3 * H * DH] qkv; the output as rows [B][T][H * DH]; its gradient dout
/// head-major, or rows with doutRows; the statistics (log-sum-exp of each query's scaled scores,
/// natural log) fp32 [B][H][T]; the gradients of q, k and v in the rows of the packed
/// [B][T][3 * H * DH] BF16 dqkv.
struct CudnnAttentionShape {
  int64_t B = 0, T = 0, H = 0, DH = 0;
  /// Key and value heads: H, or fewer (grouped-query attention: query head h reads KV head
  /// h / (H / KV); k and v of KV heads, dk and dv summed over each KV head's query heads; the
  /// rows of dqkv (H + 2 KV) DH wide).
  int64_t KV = 0;
  double scale = 1;
  bool backward = false;
  /// q, k and v read where the qkv GEMM wrote them (BF16 rows), not from a head-major copy.
  bool qkvRows = false;
  /// The gradient's dout read where its GEMM wrote it (BF16 rows), not from a head-major copy.
  bool doutRows = false;
  /// FP8 operands (one layout: q, k, v head-major or qkvRows, out and dout as above).
  CudnnFp8 fp8;
  /// What a plan depends on (layers of one model share their plans).
  std::string key() const;
};

/// One finalized cuDNN plan for a CudnnAttentionShape. The backward is cuDNN's deterministic
/// one (dq from its own product through a workspace, no atomic accumulation): the same inputs
/// give the same bits, as tgc's own kernels do; cudnn_frontend's default, dq accumulated by
/// atomic adds, ran no faster on the H200 (BENCHMARKS.md, session 14).
class CudnnAttention {
public:
  /// Builds the operation graph and plans for up to kMaxCandidates of cuDNN's heuristic choices
  /// (engine configurations) that finalize on `handle`'s GPU, the first chosen; with `config`,
  /// that configuration alone where it finalizes. Or says why cuDNN does not take the shape.
  static llvm::Expected<std::unique_ptr<CudnnAttention>> create(const CudnnApi &api, void *handle,
                                                                const CudnnAttentionShape &shape, int config = -1);
  static constexpr int kMaxCandidates = 4;
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention &) = delete;
  CudnnAttention &operator=(const CudnnAttention &) = delete;

  const CudnnAttentionShape &shape() const { return shape_; }
  /// The plans made, and the one run() runs (choose: the fastest, timed by the executor).
  size_t candidates() const { return candidates_.size(); }
  void choose(size_t candidate) { chosen_ = candidate; }
  /// The chosen plan's workspace; the largest of them all.
  int64_t workspaceBytes() const { return candidates_[chosen_].workspaceBytes; }
  int64_t largestWorkspaceBytes() const;
  /// A plan's place among cuDNN's heuristic choices (the chosen one's, or `candidate`'s), and
  /// how many there were.
  int engineConfig() const { return candidates_[chosen_].config; }
  int engineConfig(size_t candidate) const { return candidates_[candidate].config; }
  int engineConfigs() const { return engineConfigs_; }
  /// Chooses the plan of heuristic choice `config`; false where there is none.
  bool chooseConfig(int config);
  /// The buffers of a call (cuDNN's variant pack), made once where they do not move. Forward: q,
  /// k, v, out, stats. Backward: q, k, v, out, dout, stats, dq, dk, dv, and an fp32 [B][H][T]
  /// buffer of sum(dout * out) per query.
  class Buffers {
  public:
    ~Buffers();
    /// Whether these are `pointers` and `workspace`.
    bool same(llvm::ArrayRef<void *> pointers, void *workspace) const {
      return workspace == workspace_ && pointers.equals(llvm::ArrayRef<void *>(pointers_));
    }

  private:
    friend class CudnnAttention;
    explicit Buffers(const CudnnApi &api) : api_(api) {}
    const CudnnApi &api_;
    std::vector<void *> pointers_;
    void *workspace_ = nullptr, *pack_ = nullptr;
  };
  llvm::Expected<std::unique_ptr<Buffers>> buffers(llvm::ArrayRef<void *> pointers, void *workspace) const;
  /// Enqueues the attention on the handle's stream (by the chosen plan, or `candidate`'s).
  llvm::Error run(void *handle, const Buffers &buffers, int candidate = -1) const;

  /// How many pointers run() takes: BF16 as above; FP8's forward q, k, v, out, stats, then
  /// descale q, k, v, S, scale S, O, amax S, O; FP8's gradient q, k, v, out, dout, stats, dq,
  /// dk, dv, then descale q, k, v, O, dout, S, dP, scale S, dP, dq, dk, dv, amax dP, dq, dk,
  /// dv.
  static size_t operandCount(const CudnnAttentionShape &shape) {
    if (shape.fp8.enabled)
      return shape.backward ? 25 : 13;
    return shape.backward ? 10 : 5;
  }

private:
  CudnnAttention(const CudnnApi &api, CudnnAttentionShape shape) : api_(api), shape_(shape) {}
  const CudnnApi &api_;
  CudnnAttentionShape shape_;
  std::vector<void *> descriptors_; // every descriptor of the graph and the plan, destroyed last
  struct Candidate {
    void *plan = nullptr;
    int64_t workspaceBytes = 0;
    int config = 0; // its place among cuDNN's heuristic choices
  };
  std::vector<Candidate> candidates_;
  size_t chosen_ = 0;
  int engineConfigs_ = 0;
  std::vector<int64_t> uids_; // of run()'s pointers, in order
  // The scalars passed by value (scale, -inf, 1), as the variant pack points at them.
  struct Scalars {
    float scale = 1, negativeInfinity = 0, one = 1;
  } scalars_;
};

} // namespace tgc
