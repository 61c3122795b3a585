// The memory plan: every intermediate value of a program gets an offset in one arena, and
// values whose lifetimes (program order, from definition to last use) do not overlap share
// memory. Parameters, gradients and state live in three contiguous buffers (ParameterLayout,
// CudaProgram.h); inputs keep buffers of their own. A value assigned to a leaf at the end of the
// step is written straight into it where that is safe (in place), which removes both its arena
// bytes and the copy.
#pragma once

#include "backends/cuda/CudaProgram.h"
#include "ir/Graph.h"

#include "llvm/ADT/DenseMap.h"

namespace tgc {

/// Bytes a value of type `t` takes on the GPU: f32 and i32 four per element, FP8 one.
int64_t deviceBytesOf(const TensorType &t);
/// What value `v` takes in `program`'s memory: half its f32 bytes when stored in BF16.
int64_t storedBytesOf(const CudaProgram &program, const Value *v);
/// What state leaf `v` spans in the state buffer outside the parameters' layout: its stored
/// bytes, aligned as the layout places it.
int64_t stateSpanOf(const CudaProgram &program, const Value *v);

struct MemoryPlan {
  llvm::DenseMap<const Value *, int64_t> offsets; // bytes into the arena
  /// The BF16 copies of CudaProgram::bf16Shadowed values (keyed by the value, not its
  /// reshapes): bytes into the arena, alive from the producer to the last BF16 GEMM reading it.
  llvm::DenseMap<const Value *, int64_t> shadowOffsets;
  /// What CudaProgram::inPlace's values, written into the leaf they are assigned to (and so
  /// are their aliases), would take in the arena.
  int64_t inPlaceBytes = 0;
  /// Per op: its scratch buffers (OpLowering::scratchFloats), then for a BF16 GEMM the BF16
  /// copies of its operands that are not BF16 already (not weights, nor values their producer
  /// writes in BF16). They live only while the op runs.
  std::vector<std::vector<int64_t>> opLocalOffsets;
  /// Each thing placed in the arena and the ops it lives over ([first, last], program order):
  /// a value, the BF16 copy of one (shadow), or an op-local buffer (value null).
  struct Span {
    const Value *value;
    bool shadow;
    int64_t bytes, first, last;
  };
  std::vector<Span> spans;
  int64_t arenaBytes = 0;
  int64_t withoutReuseBytes = 0; // what one buffer per value would take
  int64_t persistentBytes = 0;   // parameters, gradients, state, inputs, ops' persistent buffers
};

/// Whether `op` is a GEMM (matmul, matmul_bias, matmul_bias_gelu, matmul_dgelu) on BF16 operands.
bool isBf16Gemm(const Op &op);

/// Where the main stream joins each collective of `ops` (by op index; ops.size() for the other
/// ops, and for a collective nothing reads before the step's end): before its results' first
/// reader, and a reduce_scatter also before the reduce_scatter two after it (ZeRO: its operands,
/// a bucket of the rank's gradients, then go; at most two buckets in flight). The executor
/// waits there (runtime/Collectives.cpp), and the memory plan keeps the operands until then.
std::vector<size_t> collectiveJoins(const std::vector<Op *> &ops, const CudaProgram &program);

/// A slice that keeps the leading elements of an all_gather's result (ZeRO's parameter out of
/// its ranks' parts): a view of it, no copy (OpLowering::Alias).
bool prefixOfGathered(const Op &op);
/// Whether `v` is a parameter (or a reshape of one): the executor keeps a BF16 copy of the
/// parameter buffer for the BF16 GEMMs, written once a step.
bool isWeight(const CudaProgram &program, const Value *v);
/// Whether a BF16 GEMM reads operand `v` without converting it: stored in BF16, with a BF16
/// copy, or a weight.
bool bf16Ready(const CudaProgram &program, const Value *v);
/// The value whose memory `v` is: `v`, or the source of the reshapes it is.
const Value *reshapeRoot(const Value *v);
/// The quantize op whose bytes an FP8 value is (through reshapes and transposes, from a state
/// leaf to the value the step assigns to it, and from ZeRO's gathered codes to the quantize of
/// this rank's shard), if any.
const Op *quantizeOf(const Value *v);
/// Whether v is (a reshape of) `quantize`'s transpose q^T rather than its q.
bool isQuantizeTranspose(const Op &quantize, const Value *v);

/// Bytes of the op-local buffers of op `op`, the program's op number `index` (see
/// MemoryPlan::opLocalOffsets; a BF16-ready operand's copy takes none).
std::vector<int64_t> opLocalBytes(const Op &op, const CudaProgram &program, size_t index);

/// The values of `graph` that can be written into the leaf they are assigned to: Assign(L, V),
/// V a result of op D, where no op after D reads L (nor a reshape of it) and D reads L only as
/// inPlaceOperand(D, r) (the op table's InPlace column: its kernel reads each element of that
/// operand before it writes the same element of the result, and no other element after). The
/// map goes from V to L. Also ZeRO's gathered parameters: Assign(P, reshape(slice(G))), G an
/// all_gather's result (the ranks' parts of P, zeros past its end) read by that prefix slice
/// alone (prefixOfGathered: an alias), is written into P's slot, which layoutParameters makes
/// as large as G; G -> P.
llvm::DenseMap<const Value *, const Value *> inPlaceValues(const Graph &graph,
                                                           const CudaProgram &program);

/// Lays out the parameters, the gradients AdamW reads and the state of `graph` as lowered, its
/// in-place values known (see ParameterLayout). A gradient goes into the gradient buffer when
/// it is a value of its own (not a reshape, not written in place) that one AdamW op reads, its
/// parameter a Param leaf updated in place with State moments.
ParameterLayout layoutParameters(const Graph &graph, const CudaProgram &program);

/// Plans the arena for `graph` as lowered (aliases share their source's memory and extend its
/// life; graph outputs and values assigned at the end of the step live to the end). The
/// program's in-place values go into their leaves and its laid-out gradients into the gradient
/// buffer, not the arena.
MemoryPlan planMemory(const Graph &graph, const CudaProgram &program);

} // namespace tgc
