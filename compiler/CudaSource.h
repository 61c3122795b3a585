// Lowering to CUDA: every op of a program that is not a GEMM becomes a kernel generated from a
// template with its shapes and constants baked in. The kernels of one program form one
// translation unit, compiled once by NVRTC (Nvrtc.h).
#pragma once

#include "ir/Graph.h"

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
};

/// How the executor runs one op.
struct OpLowering {
  enum Kind {
    Kernels, // the launches below
    Gemm,    // cuBLASLt
    Alias,   // the result is the operand's memory (reshape)
    Leaf,    // bound by the executor
    Assign,  // a copy when the step ends
  } kind = Kernels;
  std::vector<KernelLaunch> launches;
  std::vector<int64_t> scratchFloats; // per scratch buffer, alive during the op
  // Buffers of the op's own that outlive the step, passed after the scratch: a quantize keeps
  // the scale_inv it quantized with here (what its FP8 GEMMs and read-back multiply by).
  std::vector<int64_t> persistentFloats;
  // Attributes the kernels read from memory instead of having them in their source, uploaded
  // once into a buffer of the op's own (doubles), passed last: programs that differ only in
  // them (the LR schedule's lr, min_lr, warmup and steps: tgc train --steps N, --lr X) then
  // share one compiled module, and the kernel cache serves the second.
  std::vector<double> constants;
};

struct CudaProgram {
  std::string source;               // all kernels, legible (tgc compile --emit-cuda)
  std::vector<OpLowering> lowering; // one per op, in program order
};

/// Generates the kernels of `graph`, or says which op has no lowering yet.
llvm::Expected<CudaProgram> lowerToCuda(const Graph &graph);

} // namespace tgc
