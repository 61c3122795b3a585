// Which of cuBLASLt's candidate algorithms a GEMM runs. cuBLASLt's heuristic ranks candidates
// without running them; its first is up to 1.3x slower than the fastest of its first eight at
// some of GPT's shapes (BENCHMARKS.md). So each distinct GEMM (device, library version, shape,
// types, epilogue) is timed once, and the choice kept in the kernel cache folder: every later
// run takes the same algorithm, so the same seed keeps giving the same bits. A candidate
// replaces the heuristic's first only when it is at least 5% faster, so that timing noise
// does not decide. TGC_GEMM_AUTOTUNE=0 keeps the heuristic's first.
#pragma once

#include "support/KeptValues.h"

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace tgc {

class GemmTuner {
public:
  /// Reads the choices kept in `file` (none if it does not exist or is unreadable).
  explicit GemmTuner(std::string file);

  /// Whether timing is on (TGC_GEMM_AUTOTUNE is not 0).
  bool enabled() const { return enabled_; }

  /// The choice kept for `key` (this process's, else the file's), if any.
  std::optional<int> kept(const std::string &key) const;

  /// The candidate (0 .. candidates - 1) the GEMM named by `key` runs: the kept choice, else the
  /// fastest by `milliseconds(i)`, kept for next time.
  llvm::Expected<int> choose(const std::string &key, int candidates,
                             llvm::function_ref<llvm::Expected<float>(int)> milliseconds);

  /// Writes the choices back if any is new (atomically; a failure to write is not an error for
  /// the run: the choice is made again next time).
  void save() const { choices_.save(); }

private:
  KeptValues choices_;
  bool enabled_ = true;
};

} // namespace tgc
