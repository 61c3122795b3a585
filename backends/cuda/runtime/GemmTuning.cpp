#include "backends/cuda/runtime/GemmTuning.h"

#include "support/Files.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace tgc {
namespace {

/// The choices made in this process: later executors take them even where the cache folder
/// cannot be written.
llvm::StringMap<int> &processChoices() {
  static llvm::StringMap<int> choices;
  return choices;
}
std::mutex processChoicesMutex;

} // namespace

GemmTuner::GemmTuner(std::string file) : file_(std::move(file)) {
  if (const char *env = std::getenv("TGC_GEMM_AUTOTUNE"))
    enabled_ = std::string(env) != "0";
  auto buffer = llvm::MemoryBuffer::getFile(file_);
  if (!buffer)
    return;
  llvm::SmallVector<llvm::StringRef, 64> lines;
  (*buffer)->getBuffer().split(lines, '\n', -1, false);
  for (llvm::StringRef line : lines) {
    auto [key, index] = line.rsplit('\t');
    int value = 0;
    if (!key.empty() && !index.getAsInteger(10, value) && value >= 0 && value < 64)
      chosen_[key] = value;
  }
}

llvm::StringMap<int>::const_iterator GemmTuner::find(const std::string &key) {
  {
    std::lock_guard<std::mutex> lock(processChoicesMutex);
    if (auto it = processChoices().find(key); it != processChoices().end())
      chosen_[key] = it->second;
  }
  return chosen_.find(key);
}

llvm::Expected<int> GemmTuner::choose(const std::string &key, int candidates,
                                      llvm::function_ref<llvm::Expected<float>(int)> milliseconds) {
  if (!enabled_ || candidates <= 1)
    return 0;
  if (auto it = find(key); it != chosen_.end() && it->second < candidates)
    return it->second;
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
  chosen_[key] = best;
  changed_ = true;
  std::lock_guard<std::mutex> lock(processChoicesMutex);
  processChoices()[key] = best;
  return best;
}

void GemmTuner::save() const {
  if (!changed_)
    return;
  std::map<std::string, int> sorted; // a stable file: keys in order
  for (const auto &entry : chosen_)
    sorted[entry.getKey().str()] = entry.getValue();
  std::string text;
  for (const auto &[key, index] : sorted)
    text += key + "\t" + std::to_string(index) + "\n";
  if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(file_)))
    return;
  llvm::consumeError(writeFileAtomically(file_, text));
}

} // namespace tgc
