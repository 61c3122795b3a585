#include "app/SafeTensors.h"

#include "ir/Infer.h"
#include "ir/Types.h"
#include "support/Error.h"
#include "support/Limits.h"
#include "support/Numerics.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/JSON.h"

#include <algorithm>
#include <cstring>
#include <fmt/format.h>
#include <optional>
#include <tuple>

namespace tgc {

namespace {

// A header larger than this is not a checkpoint (the safetensors reference uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

/// The first key that appears twice at the top level of a JSON object's text (LLVM's parser
/// keeps the last silently; the format wants each tensor once), if any.
std::optional<std::string> duplicateTopLevelKey(llvm::StringRef json) {
  llvm::StringSet<> seen;
  int depth = 0;
  for (size_t i = 0; i < json.size(); ++i) {
    char c = json[i];
    if (c == '"') {
      size_t start = ++i;
      while (i < json.size() && json[i] != '"')
        i += json[i] == '\\' ? 2 : 1;
      llvm::StringRef key = json.slice(start, std::min(i, json.size()));
      size_t next = json.find_first_not_of(" \t\r\n", i + 1);
      if (depth == 1 && next != llvm::StringRef::npos && json[next] == ':' && !seen.insert(key).second)
        return key.str();
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return std::nullopt;
}

llvm::Expected<SafeTensorsEntry> parseEntry(const std::string &name, const llvm::json::Value &value,
                                            uint64_t dataSize, llvm::StringRef path) {
  const llvm::json::Object *entry = value.getAsObject();
  if (!entry)
    return fileContentError(path, "tensor '{}': entry is not an object", name);
  auto dtype = entry->getString("dtype");
  if (!dtype || !safeTensorsElementBytes(*dtype))
    return fileContentError(path, "tensor '{}': dtype {} (tgc reads F32, F16 and BF16)", name,
                            dtype ? dtype->str() : "missing");
  const llvm::json::Array *shapeArray = entry->getArray("shape");
  const llvm::json::Array *offsets = entry->getArray("data_offsets");
  if (!shapeArray || !offsets || offsets->size() != 2)
    return fileContentError(path, "tensor '{}': missing shape or data_offsets", name);
  SafeTensorsEntry out{name, dtype->str(), {}, 0, 0};
  TensorType type(DType::F32, {});
  for (const llvm::json::Value &d : *shapeArray) {
    auto dim = d.getAsInteger();
    if (!dim || *dim <= 0 || *dim > kMaxDim || type.rank() == kMaxRank)
      return fileContentError(path, "tensor '{}': bad shape", name);
    type.shape.push_back(*dim);
  }
  if (auto err = checkTypeLimits(type))
    return fileContentError(path, "tensor '{}': {}", name, llvm::toString(std::move(err)));
  out.shape.assign(type.shape.begin(), type.shape.end());
  auto begin = (*offsets)[0].getAsUINT64(), end = (*offsets)[1].getAsUINT64();
  uint64_t bytes = uint64_t(type.numElements()) * uint64_t(safeTensorsElementBytes(out.dtype));
  if (!begin || !end || *begin > *end || *end > dataSize || *end - *begin != bytes)
    return fileContentError(path,
                            "tensor '{}': data_offsets do not fit its shape {} in {} bytes of data (truncated file?)",
                            name, TensorType(DType::F32, type.shape).str(), dataSize);
  out.begin = *begin;
  out.end = *end;
  return out;
}

} // namespace

int64_t SafeTensorsEntry::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string formatSafeTensorsHeader(const std::vector<std::pair<std::string, std::vector<int64_t>>> &tensors,
                                    const std::map<std::string, std::string> &metadata) {
  llvm::json::Object header;
  uint64_t offset = 0;
  for (const auto &[name, dims] : tensors) {
    llvm::json::Array shape;
    uint64_t bytes = 4;
    for (int64_t d : dims) {
      shape.push_back(d);
      bytes *= uint64_t(d);
    }
    header[name] = llvm::json::Object{{"dtype", "F32"},
                                      {"shape", std::move(shape)},
                                      {"data_offsets", llvm::json::Array{offset, offset + bytes}}};
    offset += bytes;
  }
  llvm::json::Object meta;
  for (const auto &[key, value] : metadata)
    meta[key] = value;
  header["__metadata__"] = std::move(meta);
  std::string text;
  llvm::raw_string_ostream(text) << llvm::json::Value(std::move(header));
  while ((8 + text.size()) % 8)
    text += ' ';
  std::string out;
  uint64_t size = text.size();
  for (int i = 0; i < 8; ++i)
    out += char((size >> (8 * i)) & 0xff); // little-endian u64
  return out + text;
}

int64_t safeTensorsElementBytes(llvm::StringRef dtype) {
  return dtype == "F32" ? 4 : dtype == "F16" || dtype == "BF16" ? 2 : 0;
}

llvm::Expected<SafeTensorsHeader> parseSafeTensorsHeader(llvm::StringRef bytes, llvm::StringRef path) {
  if (bytes.size() < 8)
    return fileContentError(path, "not a safetensors checkpoint: {} bytes, shorter than the 8-byte header size",
                            bytes.size());
  uint64_t headerSize = 0;
  for (int i = 0; i < 8; ++i)
    headerSize |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  if (headerSize > kMaxHeaderBytes || headerSize > bytes.size() - 8)
    return fileContentError(path, "not a safetensors checkpoint or truncated: header of {} bytes in a file of {}",
                            headerSize, bytes.size());
  llvm::StringRef headerText = bytes.substr(8, headerSize);
  if (auto deep = findDeepNesting(headerText, kMaxJsonDepth))
    return fileContentError(path, "malformed safetensors header: nested deeper than {} levels at byte {}",
                            kMaxJsonDepth, 8 + *deep);
  // Malformed JSON first: a flipped brace would otherwise shift the depths the duplicate scan
  // counts and name a duplicate that is not there.
  auto parsed = llvm::json::parse(headerText);
  if (!parsed)
    return fileContentError(path, "malformed safetensors header: {}", llvm::toString(parsed.takeError()));
  if (auto key = duplicateTopLevelKey(headerText))
    return fileContentError(path, "tensor '{}' appears twice in the header", *key);
  llvm::json::Object *object = parsed->getAsObject();
  if (!object)
    return fileContentError(path, "malformed safetensors header: not a JSON object");
  SafeTensorsHeader header;
  header.dataOffset = 8 + headerSize;
  uint64_t dataSize = bytes.size() - header.dataOffset;
  for (auto &[key, value] : *object) {
    std::string name = key.str();
    if (name == "__metadata__") {
      header.hasMetadata = true;
      if (const llvm::json::Object *meta = value.getAsObject())
        for (const auto &[k, v] : *meta)
          if (auto text = v.getAsString())
            header.metadata[k.str()] = text->str();
      continue;
    }
    auto entry = parseEntry(name, value, dataSize, path);
    if (!entry)
      return entry.takeError();
    header.entries.push_back(std::move(*entry));
  }
  // The format's layout: the tensors' bytes one after another, from the first byte after the
  // header to the last of the file, with no gap, overlap or trailing bytes (a header length a
  // byte off shifts every tensor, and is caught here).
  std::sort(header.entries.begin(), header.entries.end(), [](const SafeTensorsEntry &a, const SafeTensorsEntry &b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t next = 0;
  for (const SafeTensorsEntry &e : header.entries) {
    if (e.begin != next)
      return fileContentError(path, "tensor '{}': its data starts at byte {} of the data, where {} was expected ({})",
                              e.name, e.begin, next,
                              e.begin < next ? "it overlaps the tensor before it" : "a gap before it");
    next = e.end;
  }
  if (next != dataSize)
    return fileContentError(
        path, "{} bytes after the last tensor's data: not the safetensors layout (a wrong header length?)",
        dataSize - next);
  return header;
}

std::vector<float> safeTensorsFloats(const SafeTensorsEntry &entry, llvm::StringRef bytes) {
  std::vector<float> out(size_t(entry.numElements()));
  if (entry.dtype == "F32") {
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    out[i] = entry.dtype == "BF16" ? bf16ToFloat(bits) : halfToFloat(bits);
  }
  return out;
}

} // namespace tgc
