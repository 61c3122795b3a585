// The bytes an op of a lowered program reads and writes in the device's memory, as its values
// are stored: what TGC_GPU_PROFILE=bandwidth (runtime/OpProfile.cpp) divides by each op's time
// to say how close a kernel comes to the memory's rate.
#pragma once

#include "backends/cuda/CudaProgram.h"

namespace tgc {

/// The bytes `op` moves: each distinct memory among its operands and results once (a result
/// written in place into its leaf, or a reshape, is its source's memory), at its stored type;
/// a weight a BF16 product reads by its BF16 copy (2 bytes an element); an embedding's table by
/// the rows its indices take, a slice's operand by the part it keeps; a KV cache by rows: `cacheRows` rows read by a decode attention
/// (each sequence's positions up to its last), and the rows of the tokens written.
int64_t opTraffic(const CudaProgram &program, const Op &op, int64_t cacheRows);

} // namespace tgc
