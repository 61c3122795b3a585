// The safetensors format, as tgc's checkpoints and Hugging Face's model files use it: an 8-byte
// little-endian header size, a JSON header naming each tensor's dtype, shape and byte range,
// then the tensors' bytes one after another. This reads any such file's header, checked, and a
// tensor at a time as fp32 from the file's mapped bytes (F32, and F16 and BF16 widened exactly).
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tgc {

struct SafeTensorsEntry {
  std::string name;
  std::string dtype;           // F32, F16 or BF16
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; // its bytes, from the first byte after the header
  int64_t numElements() const;
};

struct SafeTensorsHeader {
  std::vector<SafeTensorsEntry> entries; // in the order of their bytes
  std::map<std::string, std::string> metadata; // __metadata__, whose values are strings
  bool hasMetadata = false;
  uint64_t dataOffset = 0; // where the first tensor's bytes start in the file
};

/// The header of a safetensors file of `bytes` (`path` names it in errors), checked: its size,
/// its JSON (not nested too deep, no tensor named twice), each entry's dtype, shape and byte
/// range, and the format's layout (the tensors' bytes one after another with no gap, overlap or
/// trailing byte).
llvm::Expected<SafeTensorsHeader> parseSafeTensorsHeader(llvm::StringRef bytes, llvm::StringRef path);

/// The values of `entry`, whose bytes are `bytes` (its range of the file), as fp32.
std::vector<float> safeTensorsFloats(const SafeTensorsEntry &entry, llvm::StringRef bytes);

/// The header of F32 `tensors` (each a name and a shape, their bytes one after another in this
/// order) with `metadata` as __metadata__, its 8-byte size before it, padded with spaces so
/// that the data starts 8-byte aligned, as the format recommends.
std::string formatSafeTensorsHeader(const std::vector<std::pair<std::string, std::vector<int64_t>>> &tensors,
                                    const std::map<std::string, std::string> &metadata);

/// The size in bytes of an element of `dtype` (F32, F16, BF16), 0 for another.
int64_t safeTensorsElementBytes(llvm::StringRef dtype);

} // namespace tgc
