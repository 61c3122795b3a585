#include "app/Checkpoint.h"
#include "support/Error.h"

#include "ir/Infer.h"
#include "support/Files.h"
#include "support/Limits.h"
#include "support/Memory.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Support/xxhash.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <tuple>
#include <vector>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tgc {

namespace {

template <typename... Args>
llvm::Error fail(llvm::StringRef path, fmt::format_string<Args...> format, Args &&...args) {
  return stringError(escapeForMessage(path.str() + ": error: " + fmt::format(format, std::forward<Args>(args)...)));
}

// The checksums a checkpoint carries in its tgc metadata: each tensor's bytes (xxHash64, by
// name), and the metadata's own (over its JSON without this entry, the tensors' included), so
// that a flipped bit in a weight, a moment or the step is an error naming it, not a quietly
// different model. A checkpoint written before them is read without the check.
constexpr llvm::StringLiteral kTensorDigests = "tensor_xxh64", kMetaDigest = "meta_xxh64";

std::string digestOf(const void *bytes, size_t size) {
  return fmt::format("{:016x}", llvm::xxHash64(llvm::StringRef(static_cast<const char *>(bytes), size)));
}
/// `object` without the keys `dropped`, entry by entry: LLVM 16's json::Object copy brings an
/// erased key back (its map's tombstone keeps the key's string), so objects are never copied
/// whole after an erase, nor erased from.
llvm::json::Object copyExcept(const llvm::json::Object &object, llvm::ArrayRef<llvm::StringRef> dropped = {}) {
  llvm::json::Object copy;
  for (const auto &[key, value] : object)
    if (!llvm::is_contained(dropped, llvm::StringRef(key)))
      copy[key] = value;
  return copy;
}
std::string jsonText(const llvm::json::Object &object) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::json::Value(copyExcept(object));
  return text;
}

/// `checkpoint`'s metadata with the checksums of its tensors and of itself.
llvm::json::Object metaWithDigests(const Checkpoint &checkpoint) {
  llvm::json::Object meta = copyExcept(checkpoint.meta, {kMetaDigest, kTensorDigests}), digests;
  for (const auto &[name, tensor] : checkpoint.tensors)
    digests[name] = digestOf(tensor.data.data(), tensor.data.size() * 4);
  meta[kTensorDigests] = std::move(digests);
  std::string text = jsonText(meta);
  meta[kMetaDigest] = digestOf(text.data(), text.size());
  return meta;
}

/// Checks the metadata's checksum, where it has one, and takes the tensors' out of `meta`
/// (into `digests`): the checkpoint's metadata is then what its writer gave.
llvm::Error takeDigests(llvm::json::Object &meta, std::map<std::string, std::string> &digests, llvm::StringRef path) {
  std::optional<llvm::StringRef> own = meta.getString(kMetaDigest);
  if (!own)
    return meta.get(kMetaDigest) ? fail(path, "the 'tgc' metadata's checksum is not a string") : llvm::Error::success();
  std::string expected = own->str();
  std::string text = jsonText(copyExcept(meta, {kMetaDigest}));
  if (digestOf(text.data(), text.size()) != expected)
    return fail(path, "the 'tgc' metadata does not match its checksum: it was changed or damaged after the "
                      "checkpoint was written");
  if (const llvm::json::Object *tensors = meta.getObject(kTensorDigests))
    for (const auto &[name, value] : *tensors) {
      auto digest = value.getAsString();
      if (!digest)
        return fail(path, "the checksum of tensor '{}' is not a string", name.str());
      digests[name.str()] = digest->str();
    }
  meta = copyExcept(meta, {kMetaDigest, kTensorDigests});
  return llvm::Error::success();
}

// A header larger than this is not a tgc checkpoint (the safetensors reference uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100 << 20;

} // namespace

llvm::Expected<std::string> formatCheckpoint(const Checkpoint &checkpoint, llvm::StringRef path) {
  llvm::json::Object header;
  uint64_t offset = 0;
  for (const auto &[name, tensor] : checkpoint.tensors) {
    if (!isFloat(tensor.type.dtype))
      return fail(path, "tensor '{}' is not floating point", name);
    llvm::json::Array shape;
    for (int64_t d : tensor.type.shape)
      shape.push_back(d);
    uint64_t bytes = uint64_t(tensor.size()) * 4;
    header[name] = llvm::json::Object{{"dtype", "F32"},
                                      {"shape", std::move(shape)},
                                      {"data_offsets", llvm::json::Array{offset, offset + bytes}}};
    offset += bytes;
  }
  std::string metaText = jsonText(metaWithDigests(checkpoint));
  header["__metadata__"] = llvm::json::Object{{"format", "pt"}, {"tgc", metaText}};
  std::string headerText;
  llvm::raw_string_ostream(headerText) << llvm::json::Value(std::move(header));
  // Pad the header with spaces so the data starts 8-byte aligned, as the format recommends.
  while ((8 + headerText.size()) % 8)
    headerText += ' ';
  std::string file;
  file.reserve(8 + headerText.size() + offset);
  uint64_t headerSize = headerText.size();
  for (int i = 0; i < 8; ++i)
    file += char((headerSize >> (8 * i)) & 0xff); // little-endian u64
  file += headerText;
  for (const auto &[name, tensor] : checkpoint.tensors)
    file.append(reinterpret_cast<const char *>(tensor.data.data()), tensor.data.size() * 4);
  return file;
}

llvm::Error writeCheckpoint(llvm::StringRef path, const Checkpoint &checkpoint) {
  auto file = formatCheckpoint(checkpoint, path);
  if (!file)
    return file.takeError();
  return writeFileAtomically(path, *file);
}

namespace {

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

} // namespace

llvm::Error checkFinite(const Checkpoint &checkpoint, llvm::StringRef path) {
  std::vector<std::string> bad;
  int64_t tensors = 0;
  for (const auto &[name, tensor] : checkpoint.tensors) {
    int64_t count = 0;
    for (float v : tensor.data)
      count += !std::isfinite(v);
    if (count) {
      ++tensors;
      if (bad.size() < 3)
        bad.push_back(fmt::format("'{}': {} of {}", name, count, tensor.data.size()));
    }
  }
  if (bad.empty())
    return llvm::Error::success();
  return fail(path, "{} {} NaN or Inf ({}{}): the run that wrote it diverged; --allow-nonfinite reads it anyway",
              tensors, tensors == 1 ? "tensor holds" : "tensors hold", fmt::join(bad, ", "), tensors > 3 ? ", ..." : "");
}

llvm::Expected<Checkpoint> readCheckpoint(llvm::StringRef path, const std::function<bool(llvm::StringRef)> &wanted) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return fail(path, "cannot read: {}", buffer.getError().message());
  return parseCheckpoint((*buffer)->getBuffer(), path, wanted);
}

namespace {

/// A tensor's header entry: its type and the [begin, end) of its bytes in the data.
struct TensorEntry {
  TensorType type;
  uint64_t begin = 0, end = 0;
};

llvm::Expected<TensorEntry> parseTensorEntry(const std::string &name, const llvm::json::Value &value,
                                             uint64_t dataSize, llvm::StringRef path) {
  const llvm::json::Object *entry = value.getAsObject();
  if (!entry)
    return fail(path, "tensor '{}': entry is not an object", name);
  auto dtype = entry->getString("dtype");
  if (!dtype || *dtype != "F32")
    return fail(path, "tensor '{}': dtype {} (tgc checkpoints hold F32)", name, dtype ? dtype->str() : "missing");
  const llvm::json::Array *shapeArray = entry->getArray("shape");
  const llvm::json::Array *offsets = entry->getArray("data_offsets");
  if (!shapeArray || !offsets || offsets->size() != 2)
    return fail(path, "tensor '{}': missing shape or data_offsets", name);
  TensorEntry out{TensorType(DType::F32, {})};
  for (const llvm::json::Value &d : *shapeArray) {
    auto dim = d.getAsInteger();
    if (!dim || *dim <= 0 || *dim > kMaxDim || out.type.rank() == kMaxRank)
      return fail(path, "tensor '{}': bad shape", name);
    out.type.shape.push_back(*dim);
  }
  if (auto err = checkTypeLimits(out.type))
    return fail(path, "tensor '{}': {}", name, llvm::toString(std::move(err)));
  auto begin = (*offsets)[0].getAsUINT64(), end = (*offsets)[1].getAsUINT64();
  if (!begin || !end || *begin > *end || *end > dataSize || *end - *begin != uint64_t(out.type.numElements()) * 4)
    return fail(path, "tensor '{}': data_offsets do not fit its shape {} in {} bytes of data (truncated file?)", name,
                out.type.str(), dataSize);
  out.begin = *begin;
  out.end = *end;
  return out;
}

} // namespace

llvm::Expected<Checkpoint> parseCheckpoint(llvm::StringRef bytes, llvm::StringRef path,
                                           const std::function<bool(llvm::StringRef)> &wanted) {
  if (bytes.size() < 8)
    return fail(path, "not a safetensors checkpoint: {} bytes, shorter than the 8-byte header size",
                bytes.size());
  uint64_t headerSize = 0;
  for (int i = 0; i < 8; ++i)
    headerSize |= uint64_t(uint8_t(bytes[i])) << (8 * i);
  if (headerSize > kMaxHeaderBytes || headerSize > bytes.size() - 8)
    return fail(path, "not a safetensors checkpoint or truncated: header of {} bytes in a file of {}",
                headerSize, bytes.size());
  llvm::StringRef headerText = bytes.substr(8, headerSize);
  if (auto deep = findDeepNesting(headerText, kMaxJsonDepth))
    return fail(path, "malformed safetensors header: nested deeper than {} levels at byte {}", kMaxJsonDepth,
                8 + *deep);
  // Malformed JSON first: a flipped brace would otherwise shift the depths the duplicate scan
  // counts and name a duplicate that is not there.
  auto parsed = llvm::json::parse(headerText);
  if (!parsed)
    return fail(path, "malformed safetensors header: {}", llvm::toString(parsed.takeError()));
  if (auto key = duplicateTopLevelKey(headerText))
    return fail(path, "tensor '{}' appears twice in the header", *key);
  llvm::json::Object *header = parsed->getAsObject();
  if (!header)
    return fail(path, "malformed safetensors header: not a JSON object");
  uint64_t dataSize = bytes.size() - 8 - headerSize;
  const char *data = bytes.data() + 8 + headerSize;
  Checkpoint checkpoint;
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> extents; // [begin, end) of each tensor
  std::map<std::string, TensorType> types;
  std::map<std::string, std::string> digests; // the tensors' checksums, where the file has them
  for (auto &[key, value] : *header) {
    std::string name = key.str();
    if (name == "__metadata__") {
      const llvm::json::Object *meta = value.getAsObject();
      auto text = meta ? meta->getString("tgc") : std::nullopt;
      if (!text)
        return fail(path, "the safetensors metadata has no 'tgc' entry: not written by tgc");
      if (findDeepNesting(*text, kMaxJsonDepth))
        return fail(path, "the 'tgc' metadata is nested deeper than {} levels", kMaxJsonDepth);
      auto metaJson = llvm::json::parse(*text);
      if (!metaJson || !metaJson->getAsObject()) {
        if (!metaJson)
          llvm::consumeError(metaJson.takeError());
        return fail(path, "the 'tgc' metadata is not a JSON object");
      }
      checkpoint.meta = std::move(*metaJson->getAsObject());
      if (auto err = takeDigests(checkpoint.meta, digests, path))
        return err;
      continue;
    }
    auto entry = parseTensorEntry(name, value, dataSize, path);
    if (!entry)
      return entry.takeError();
    extents.emplace_back(entry->begin, entry->end, name);
    types.emplace(name, entry->type);
  }
  if (checkpoint.meta.empty())
    return fail(path, "no tgc metadata: not a tgc checkpoint");
  // A checkpoint with checksums lists every tensor it was written with: one without a checksum
  // was added later, and is refused before any tensor is read (it may be gigabytes).
  if (!digests.empty())
    for (const auto &[name, type] : types)
      if (!digests.count(name))
        return fail(path, "tensor '{}' has no checksum: it is not one the checkpoint was written with", name);
  // The format's layout: the tensors' bytes one after another, from the first byte after the
  // header to the last of the file, with no gap, overlap or trailing bytes (a header length a
  // byte off shifts every tensor, and is caught here).
  std::sort(extents.begin(), extents.end());
  uint64_t next = 0;
  for (const auto &[begin, end, name] : extents) {
    if (begin != next)
      return fail(path, "tensor '{}': its data starts at byte {} of the data, where {} was expected ({})", name,
                  begin, next, begin < next ? "it overlaps the tensor before it" : "a gap before it");
    next = end;
  }
  if (next != dataSize)
    return fail(path, "{} bytes after the last tensor's data: not the safetensors layout (a wrong header length?)",
                dataSize - next);
  // The tensors are copied out of the mapped file: a file that declares more than the memory
  // holds (a sparse file costs the disk nothing) is an error, not an out-of-memory kill.
  uint64_t copied = 0;
  for (const auto &[begin, end, name] : extents)
    copied += !wanted || wanted(name) ? end - begin : 0;
  std::optional<int64_t> available = availableHostMemory();
  if (available && int64_t(copied) > *available)
    return fail(path, "its tensors take {:.1f} GiB and this machine has {:.1f} GiB available", copied / 1073741824.0,
                *available / 1073741824.0);
  for (const auto &[begin, end, name] : extents) {
    if (wanted && !wanted(name))
      continue;
    Tensor tensor = Tensor::zeros(types.at(name));
    std::memcpy(tensor.data.data(), data + begin, end - begin);
    if (auto it = digests.find(name); it != digests.end() && digestOf(data + begin, end - begin) != it->second)
      return fail(path, "tensor '{}' does not match its checksum: its bytes were changed or damaged after the "
                        "checkpoint was written",
                  name);
    checkpoint.tensors.emplace(name, std::move(tensor));
  }
  return checkpoint;
}

int64_t checkpointsAtOnce(int64_t start, int64_t total, int64_t saveEvery, int64_t keep) {
  int64_t saves = 1; // the last step's
  if (saveEvery > 0 && total > start + 1)
    saves += (total - 1) / saveEvery - start / saveEvery;
  // Before each save after the first, the earlier ones still on disk: the last, or the kept.
  return 1 + std::min(saves - 1, std::max<int64_t>(keep, 1));
}

} // namespace tgc
