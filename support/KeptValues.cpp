#include "support/KeptValues.h"

#include "support/Files.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

#include <mutex>

namespace tgc {
namespace {

/// The values kept in this process, by file and key.
std::map<std::string, std::string> &processValues() {
  static std::map<std::string, std::string> values;
  return values;
}
std::mutex processValuesMutex;

std::string processKey(const std::string &file, const std::string &key) { return file + "\n" + key; }

} // namespace

KeptValues::KeptValues(std::string file) : file_(std::move(file)) {
  auto buffer = llvm::MemoryBuffer::getFile(file_);
  if (!buffer)
    return;
  llvm::SmallVector<llvm::StringRef, 64> lines;
  (*buffer)->getBuffer().split(lines, '\n', -1, false);
  for (llvm::StringRef line : lines) {
    auto [key, value] = line.rsplit('\t');
    if (!key.empty() && !value.empty() && key.size() < line.size())
      values_[key.str()] = value.str();
  }
}

std::optional<std::string> KeptValues::find(const std::string &key) const {
  {
    std::lock_guard<std::mutex> lock(processValuesMutex);
    if (auto it = processValues().find(processKey(file_, key)); it != processValues().end())
      return it->second;
  }
  if (auto it = values_.find(key); it != values_.end())
    return it->second;
  return std::nullopt;
}

void KeptValues::keep(const std::string &key, std::string value) {
  {
    std::lock_guard<std::mutex> lock(processValuesMutex);
    processValues()[processKey(file_, key)] = value;
  }
  values_[key] = std::move(value);
  changed_ = true;
}

void KeptValues::save() const {
  if (!changed_)
    return;
  // With what the process kept for this file elsewhere (another reader of it, saved or not).
  std::map<std::string, std::string> all = values_;
  {
    std::lock_guard<std::mutex> lock(processValuesMutex);
    std::string prefix = processKey(file_, "");
    for (auto it = processValues().lower_bound(prefix);
         it != processValues().end() && llvm::StringRef(it->first).starts_with(prefix); ++it)
      all[it->first.substr(prefix.size())] = it->second;
  }
  std::string text;
  for (const auto &[key, value] : all)
    text += key + "\t" + value + "\n";
  if (llvm::sys::fs::create_directories(llvm::sys::path::parent_path(file_)))
    return;
  llvm::consumeError(writeFileAtomically(file_, text));
}

} // namespace tgc
