// A text file of "key\tvalue" lines that measurements are kept in between runs (the kernel cache
// folder's gemm-algorithms.txt and fp8-choices.txt), with the values found in this process kept
// beside it: later readers in the process take them even where the folder cannot be written.
#pragma once

#include "llvm/ADT/StringRef.h"

#include <map>
#include <optional>
#include <string>

namespace tgc {

class KeptValues {
public:
  /// Reads `file`'s lines (none if it does not exist or is unreadable).
  explicit KeptValues(std::string file);

  /// The value kept for `key`: this process's, else the file's.
  std::optional<std::string> find(const std::string &key) const;
  /// Keeps `value` for `key`, here and for the rest of the process.
  void keep(const std::string &key, std::string value);
  /// Writes the values back, keys in order, atomically, if any was kept since the file was read
  /// (a failure to write costs the measurement again next time, not the run).
  void save() const;

private:
  std::string file_;
  std::map<std::string, std::string> values_;
  bool changed_ = false;
};

} // namespace tgc
