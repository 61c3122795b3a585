// What lowering makes of a program for the GPU and what the runtime runs: each op's launches (or
// its GEMM, alias, leaf, assign or collective), the kernels' source, the parameter layout and the
// storage choices (which values are stored in BF16, which cuDNN reads in place). Types only: the
// lowering (lowering/Lowering.h) fills them, the runtime (runtime/) reads them.
#pragma once

#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <string>
#include <vector>

namespace tgc {


/// One launch of a generated kernel. Its parameters are, in order, the op's operands, its
/// results, its scratch buffers, its persistent buffers and its constants, each a device
/// pointer.
struct KernelLaunch {
  std::string name;
  int64_t blocks = 1;
  int threads = 256;
  bool cooperative = false; // its blocks wait for each other: launched all resident at once
};

/// How the executor runs one op.
struct OpLowering {
  enum Kind {
    Kernels, // the launches below
    Gemm,    // cuBLASLt
    Alias,   // the result is the operand's memory (reshape)
    Leaf,    // bound by the executor
    Assign,  // a copy when the step ends
    Grouped, // run by another op's launches (the grouped optimizer, OptimizerGroups.cpp)
    Collective, // all_reduce: NCCL on the executor's communication stream, joined before its
                // results' first reader; a gradient reduced in place in the gradient buffer
  } kind = Kernels;
  /// Whether the op runs work of its own on the device in its place: its kernels or its GEMM.
  bool launchesWork() const { return kind == Kernels || kind == Gemm; }
  std::vector<KernelLaunch> launches;
  // When not empty, the launches take these values' buffers instead of the op's operands and
  // results (a grouped launch: the first tensor of each contiguous buffer it covers).
  std::vector<const Value *> arguments;
  std::string label; // what a profile calls a grouped launch; empty: the op's name
  // With `arguments`: the one (its index) whose parameters' BF16 copy the launches write too,
  // passed after it (an F32Bf16Out: the grouped AdamW). -1: none.
  int weightCopyArgument = -1;
  // AdamW in an FP8 weight's cast (AdamWCast.cpp): its clip scale, which the prologue sets to 0
  // before it launches the cast (AdamW's skip), so that the launch casts the master unchanged.
  const Value *zeroInPrologue = nullptr;
  std::string header; // the kernel header (backends/cuda/kernels) its launches instantiate
  std::vector<int64_t> scratchFloats; // per scratch buffer, alive during the op
  // Buffers of the op's own that outlive the step, passed after the scratch: a quantize keeps
  // the scale_inv it quantized with here (what its FP8 GEMMs and read-back multiply by), and the
  // count of its blocks that finished.
  std::vector<int64_t> persistentFloats;
  // Attributes the kernels read from memory instead of having them in their source, uploaded
  // once into a buffer of the op's own (doubles), passed last: programs that differ only in
  // them (the LR schedule's lr, min_lr, warmup and steps: tgc train --steps N, --lr X) then
  // share one compiled module, and the kernel cache serves the second.
  std::vector<double> constants;
  // Values whose device addresses the executor writes, once every op is placed, into a buffer
  // of the op's own (64-bit), passed after the constants: a grouped launch over tensors that
  // lie apart (ZeRO's shards in the arena) finds each there.
  std::vector<const Value *> addresses;
  // Operands that are parameters whose BF16 copy (the executor's, made from the parameter
  // buffer) the launches take instead of their fp32 values: a GEMV's weight.
  std::vector<unsigned> bf16Weights;
  /// cuDNN's fused attention (Cudnn.h) runs in this op, before launch `libraryAt` (after all of
  /// them when it equals their number): its buffers (CudnnAttention::run's, then the workspace)
  /// are these entries of the pointer list the launches take (operands, each result and its
  /// BF16 copy's, scratch), each at an offset in bytes.
  bool cudnnAttention = false;
  size_t libraryAt = 0;
  struct LibraryBuffer {
    unsigned pointer = 0;
    int64_t offset = 0;
  };
  std::vector<LibraryBuffer> libraryBuffers;
};

/// Where parameters, gradients and state live on the GPU: three contiguous buffers, as llm.c
/// lays them out. The parameters AdamW updates come first (those whose FP8 cast runs their
/// update, then those with weight decay, then those without), then the others; their gradients
/// sit in the gradient buffer and their two moments in the state buffer at the same offsets
/// (the second moments after all the first), then the rest of the state. Every tensor starts
/// at a multiple of 256 bytes (512 in the parameter, gradient and moment regions); the padding
/// is zero.
struct ParameterLayout {
  llvm::DenseMap<const Value *, int64_t> params;   // Param leaf -> bytes into the parameter buffer
  llvm::DenseMap<const Value *, int64_t> grads;    // gradient -> bytes into the gradient buffer
  llvm::DenseMap<const Value *, int64_t> state;    // State leaf -> bytes into the state buffer
  std::vector<const Op *> updates;                 // the AdamW ops laid out, in program order
  int64_t paramBytes = 0, gradBytes = 0, stateBytes = 0;
  int64_t updatedBytes = 0; // the leading bytes AdamW updates (of params, grads, each moment)
  int64_t decayedBytes = 0; // of those, the leading bytes with weight decay
  int64_t castBytes = 0;    // of those, the leading bytes whose FP8 cast runs their AdamW
};

struct CudaProgram {
  std::string source;               // all kernels, legible (tgc compile --emit-cuda)
  std::vector<OpLowering> lowering; // one per op, in program order
  /// Values written straight into the leaf they are assigned to (MemoryPlan.h inPlaceValues).
  llvm::DenseMap<const Value *, const Value *> inPlace;
  /// No op writes a parameter nor runs on NCCL (a decode step, a prompt): the executor launches
  /// each generated kernel that follows another with programmatic dependent launch (common.cuh's
  /// awaitPreviousKernel), and kernels may load what no kernel of the step writes before they
  /// await the one before them.
  bool programmatic = false;
  /// The GPU's multiprocessors (LoweringOptions::multiprocessors): the launches whose blocks
  /// each take a share of the work (the cast-transposes) have a few blocks for each.
  int multiprocessors = 0;
  /// The compute capability (LoweringOptions::computeCapability): thread-block clusters from 90.
  int computeCapability = 90;
  ParameterLayout layout;
  /// Values stored in BF16 (two bytes an element), with their reshapes: only BF16 GEMMs read
  /// them, as operands they would round to BF16 anyway, so their producer rounds instead and
  /// no GEMM converts them. No result changes.
  llvm::DenseSet<const Value *> bf16Stored;
  /// Values kept in fp32 whose producer also writes a BF16 copy (with their reshapes): BF16
  /// GEMMs read the copy, the other readers the fp32 value (a gradient whose bias sum needs
  /// fp32, the probabilities the softmax gradient reads). No result changes.
  llvm::DenseSet<const Value *> bf16Shadowed;
  /// The ops whose results the GPU stores in BF16 although the program keeps them in fp32
  /// (chooseBf16Rounding), all in bf16Stored: a BF16 matmul_bias_gelu (cuBLASLt's GELU_AUX_BIAS
  /// epilogue) whose activation only BF16 GEMMs read and whose h only matmul_dgelu reads, and
  /// those matmul_dgelu (the DGELU epilogue), whose result only BF16 GEMMs and column sums read;
  /// a BF16 matmul whose logits only the loss and its gradient read; an FP8 layer's bias add (or
  /// FP8 matmul_bias) whose h only the GELU and its gradient read; an FP8 matmul whose result
  /// only a quantize {activation="gelu_backward"} reads, as its GELU's gradient; a norm whose
  /// output only quantizes read (an FP8 layer's input); a BF16 or FP8 product only a norm reads
  /// (the residual norm's y, the norm gradient's dy); the qkv and dout products
  /// cuDNN reads in place (chooseCudnnRows). cuBLASLt's BF16 epilogues take the output, the bias
  /// and h in one type. Unlike bf16Stored's other values these are rounded (the biases added,
  /// h, the GELU's gradient and its column sums, the logits): within BF16's rounding, as PyTorch's
  /// autocast computes these layers and Transformer Engine's LayerNormMLP stores them. Also, with
  /// any options and whatever their output type, every FP8 matmul_bias (fuse-fp8-bias): cuBLASLt's
  /// FP8 epilogues add a BF16 bias only.
  llvm::DenseSet<const Op *> bf16Rounding;
  /// The matmul_bias_gelu ops whose pre-activation nothing reads (no op, no output:
  /// fuse-gelu-epilogue's): cuBLASLt's GELU_BIAS epilogue, without the aux output.
  llvm::DenseSet<const Op *> geluWithoutAux;
  /// The attention ops cuDNN runs (LoweringOptions::cudnnAttention), with their workspaces.
  llvm::DenseMap<const Op *, int64_t> cudnnAttention;
  /// The grouped AdamW writes the BF16 copy of the parameters it updates (the one BF16 GEMMs and
  /// epilogues read) as it writes them: the executor converts them only once they are bound, and
  /// at each step only the parameters no AdamW updates.
  bool optimizerWritesWeightCopy = false;
  /// FP8 weights kept between steps whose cast after AdamW makes the update it casts
  /// (AdamWCast.cpp): AdamW op -> the quantize of its new weight. Their parameters lead the
  /// layout (ParameterLayout::castBytes), and the grouped AdamW leaves them to the cast.
  llvm::DenseMap<const Op *, const Op *> adamwInCast;
  /// The bytes of the parameter region the executor's BF16 copy holds, [begin, end): the
  /// parameters a step reads in BF16 (weightsReadInBf16), or the whole region where AdamW writes
  /// the copy. Empty: no copy.
  int64_t weightCopyBegin = 0, weightCopyEnd = 0;
  /// The head-major q, k, v of an attention cuDNN runs (its third result) that are its qkv
  /// operand's memory instead: the qkv GEMM writes BF16 rows, which cuDNN's forward and gradient
  /// read in place (cudnnReadsQkvRows; the memory plan makes the result an alias of qkv). The
  /// copy's layout is then qkv's, not the program's [3][B][H][T][DH]: it is no output.
  llvm::DenseMap<const Value *, const Value *> qkvRows;
  /// The attention gradients cuDNN runs that read dout where its GEMM wrote it in BF16 rows
  /// (cudnnReadsDoutRows).
  llvm::DenseSet<const Op *> doutRows;
  /// The cast-transposes whose q nothing reads (no op, no output): the backward's copies that
  /// make q_t again (requantize-transposes, fp8-weights under recompute). Their kernel writes
  /// q_t alone.
  llvm::DenseSet<const Op *> transposeOnly;
};

struct LoweringOptions {
  /// The per-parameter AdamW ops as one launch over the contiguous layout, and the gradient
  /// norm's sum_squares and adds as one pair of launches (the same bits).
  bool groupOptimizer = true;
  /// The step's fp8_update ops as launches of up to 48 updates, a block each (the same bits).
  bool groupFp8Updates = true;
  /// The producers of BF16 GEMM operands write them in BF16: values only BF16 GEMMs read are
  /// stored in BF16 (CudaProgram::bf16Stored), the others get a BF16 copy (bf16Shadowed); the
  /// same bits as converting them at each GEMM.
  bool storeBf16 = true;
  /// With storeBf16: the values rounded to BF16 beyond the program's (CudaProgram::bf16Rounding).
  bool bf16Rounding = true;
  /// The attention ops (cudnnAttentionShape's) that cuDNN runs, each with the bytes of
  /// workspace its plan needs: the executor builds the plans before it lowers the program.
  llvm::DenseMap<const Op *, int64_t> cudnnAttention;
  /// The GPU's multiprocessors; 0 (no GPU: tgc compile --arch) takes an H100's and H200's 132,
  /// and plans FP8 attention as cuDNN's (no workspace).
  int multiprocessors = 0;
  /// The compute capability the kernels are compiled for, major * 10 + minor (90: sm_90); 0 (no
  /// GPU, no --arch) takes 90.
  int computeCapability = 0;
};

} // namespace tgc
