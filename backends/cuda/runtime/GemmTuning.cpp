#include "backends/cuda/runtime/GemmTuning.h"

#include "support/Environment.h"

#include "llvm/ADT/StringRef.h"

namespace tgc {

GemmTuner::GemmTuner(std::string file) : choices_(std::move(file)) {
  enabled_ = environmentSwitch("TGC_GEMM_AUTOTUNE", enabled_);
}

std::optional<int> GemmTuner::kept(const std::string &key) const {
  auto text = choices_.find(key);
  int value = 0;
  if (!text || llvm::StringRef(*text).getAsInteger(10, value) || value < 0 || value >= 64)
    return std::nullopt;
  return value;
}

llvm::Expected<int> GemmTuner::choose(const std::string &key, int candidates,
                                      llvm::function_ref<llvm::Expected<float>(int)> milliseconds) {
  if (!enabled_ || candidates <= 1)
    return 0;
  if (std::optional<int> choice = kept(key); choice && *choice < candidates)
    return *choice;
  auto first = milliseconds(0);
  if (!first)
    return first.takeError();
  int best = 0;
  float bestMs = *first * 0.95f; // the first unless another is clearly faster
  for (int i = 1; i < candidates; ++i) {
    auto ms = milliseconds(i);
    if (!ms)
      return ms.takeError();
    if (*ms < bestMs) {
      best = i;
      bestMs = *ms;
    }
  }
  choices_.keep(key, std::to_string(best));
  return best;
}

} // namespace tgc
