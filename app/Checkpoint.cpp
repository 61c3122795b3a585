#include "app/Checkpoint.h"
#include "app/SafeTensors.h"
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

/// `meta` with the checksums of the tensors (`digests`, by name) and of itself.
llvm::json::Object metaWithDigests(const llvm::json::Object &source, const std::map<std::string, std::string> &digests) {
  llvm::json::Object meta = copyExcept(source, {kMetaDigest, kTensorDigests}), tensors;
  for (const auto &[name, digest] : digests)
    tensors[name] = digest;
  meta[kTensorDigests] = std::move(tensors);
  std::string text = jsonText(meta);
  meta[kMetaDigest] = digestOf(text.data(), text.size());
  return meta;
}

/// Checks the metadata's checksum, where it has one, and takes the tensors' out of `meta`
/// (into `digests`): the checkpoint's metadata is then what its writer gave.
llvm::Error takeDigests(llvm::json::Object &meta, std::map<std::string, std::string> &digests, llvm::StringRef path) {
  std::optional<llvm::StringRef> own = meta.getString(kMetaDigest);
  if (!own)
    return meta.get(kMetaDigest) ? fileContentError(path, "the 'tgc' metadata's checksum is not a string")
                                 : llvm::Error::success();
  std::string expected = own->str();
  std::string text = jsonText(copyExcept(meta, {kMetaDigest}));
  if (digestOf(text.data(), text.size()) != expected)
    return fileContentError(path, "the 'tgc' metadata does not match its checksum: it was changed or damaged after the "
                                  "checkpoint was written");
  if (const llvm::json::Object *tensors = meta.getObject(kTensorDigests))
    for (const auto &[name, value] : *tensors) {
      auto digest = value.getAsString();
      if (!digest)
        return fileContentError(path, "the checksum of tensor '{}' is not a string", name.str());
      digests[name.str()] = digest->str();
    }
  meta = copyExcept(meta, {kMetaDigest, kTensorDigests});
  return llvm::Error::success();
}

/// The safetensors header of F32 tensors `entries` (in their order, one after another) and the
/// tgc metadata `metaText`.
std::string formatHeader(const std::vector<CheckpointEntry> &entries, const std::string &metaText) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  for (const CheckpointEntry &e : entries)
    tensors.emplace_back(e.name, std::vector<int64_t>(e.type.shape.begin(), e.type.shape.end()));
  return formatSafeTensorsHeader(tensors, {{"format", "pt"}, {"tgc", metaText}});
}

} // namespace

llvm::Expected<std::string> formatCheckpoint(const Checkpoint &checkpoint, llvm::StringRef path) {
  std::vector<CheckpointEntry> entries;
  std::map<std::string, std::string> digests;
  uint64_t bytes = 0;
  for (const auto &[name, tensor] : checkpoint.tensors) {
    if (!isFloat(tensor.type.dtype))
      return fileContentError(path, "tensor '{}' is not floating point", name);
    entries.push_back({name, TensorType(DType::F32, tensor.type.shape)});
    digests[name] = digestOf(tensor.data.data(), tensor.data.size() * 4);
    bytes += tensor.data.size() * 4;
  }
  std::string file = formatHeader(entries, jsonText(metaWithDigests(checkpoint.meta, digests)));
  file.reserve(file.size() + bytes);
  for (const auto &[name, tensor] : checkpoint.tensors)
    file.append(reinterpret_cast<const char *>(tensor.data.data()), tensor.data.size() * 4);
  return file;
}

llvm::Error writeCheckpointStreamed(llvm::StringRef path, std::vector<CheckpointEntry> entries,
                                    const llvm::json::Object &meta, const TensorProducer &produce) {
  llvm::sort(entries, [](const CheckpointEntry &a, const CheckpointEntry &b) { return a.name < b.name; });
  for (size_t i = 1; i < entries.size(); ++i)
    if (entries[i].name == entries[i - 1].name)
      return fileContentError(path, "tensor '{}' is given twice", entries[i].name);
  // The header first with each checksum's place held (they are fixed-width hex), then each
  // tensor as `produce` makes it, then the header again over the first with the checksums.
  std::map<std::string, std::string> digests;
  for (const CheckpointEntry &e : entries)
    digests[e.name] = std::string(16, '0');
  std::string placeholder = formatHeader(entries, jsonText(metaWithDigests(meta, digests)));
  return writeFileAtomicallyWith(path, [&](llvm::raw_pwrite_stream &os) -> llvm::Error {
    os << placeholder;
    for (const CheckpointEntry &e : entries) {
      auto values = produce(e);
      if (!values)
        return values.takeError();
      if (int64_t(values->size()) != e.type.numElements())
        return fileContentError(path, "tensor '{}': {} values for its shape {}", e.name, values->size(), e.type.str());
      digests[e.name] = digestOf(values->data(), values->size() * 4);
      os.write(reinterpret_cast<const char *>(values->data()), values->size() * 4);
    }
    std::string header = formatHeader(entries, jsonText(metaWithDigests(meta, digests)));
    if (header.size() != placeholder.size())
      return fileContentError(path, "the header changed length once its checksums were known");
    os.pwrite(header.data(), header.size(), 0);
    return llvm::Error::success();
  });
}

llvm::Error writeCheckpoint(llvm::StringRef path, const Checkpoint &checkpoint) {
  auto file = formatCheckpoint(checkpoint, path);
  if (!file)
    return file.takeError();
  return writeFileAtomically(path, *file);
}

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
  return fileContentError(
      path, "{} {} NaN or Inf ({}{}): the run that wrote it diverged; --allow-nonfinite reads it anyway", tensors,
      tensors == 1 ? "tensor holds" : "tensors hold", fmt::join(bad, ", "), tensors > 3 ? ", ..." : "");
}

llvm::Expected<Checkpoint> readCheckpoint(llvm::StringRef path, const std::function<bool(llvm::StringRef)> &wanted) {
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return fileContentError(path, "cannot read: {}", buffer.getError().message());
  return parseCheckpoint((*buffer)->getBuffer(), path, wanted);
}

llvm::Expected<Checkpoint> parseCheckpoint(llvm::StringRef bytes, llvm::StringRef path,
                                           const std::function<bool(llvm::StringRef)> &wanted) {
  auto header = parseSafeTensorsHeader(bytes, path);
  if (!header)
    return header.takeError();
  Checkpoint checkpoint;
  std::map<std::string, std::string> digests; // the tensors' checksums, where the file has them
  if (header->hasMetadata) {
    auto text = header->metadata.find("tgc");
    if (text == header->metadata.end())
      return fileContentError(path, "the safetensors metadata has no 'tgc' entry: not written by tgc");
    if (findDeepNesting(text->second, kMaxJsonDepth))
      return fileContentError(path, "the 'tgc' metadata is nested deeper than {} levels", kMaxJsonDepth);
    auto metaJson = llvm::json::parse(text->second);
    if (!metaJson || !metaJson->getAsObject()) {
      if (!metaJson)
        llvm::consumeError(metaJson.takeError());
      return fileContentError(path, "the 'tgc' metadata is not a JSON object");
    }
    checkpoint.meta = std::move(*metaJson->getAsObject());
    if (auto err = takeDigests(checkpoint.meta, digests, path))
      return err;
  }
  for (const SafeTensorsEntry &e : header->entries)
    if (e.dtype != "F32")
      return fileContentError(path, "tensor '{}': dtype {} (tgc checkpoints hold F32)", e.name, e.dtype);
  if (checkpoint.meta.empty())
    return fileContentError(path, "no tgc metadata: not a tgc checkpoint");
  // A checkpoint with checksums lists every tensor it was written with: one without a checksum
  // was added later, and is refused before any tensor is read (it may be gigabytes).
  if (!digests.empty())
    for (const SafeTensorsEntry &e : header->entries)
      if (!digests.count(e.name))
        return fileContentError(path, "tensor '{}' has no checksum: it is not one the checkpoint was written with",
                                e.name);
  // The tensors are copied out of the mapped file: a file that declares more than the memory
  // holds (a sparse file costs the disk nothing) is an error, not an out-of-memory kill.
  uint64_t copied = 0;
  for (const SafeTensorsEntry &e : header->entries)
    copied += !wanted || wanted(e.name) ? e.end - e.begin : 0;
  std::optional<int64_t> available = availableHostMemory();
  if (available && int64_t(copied) > *available)
    return fileContentError(path, "its tensors take {:.1f} GiB and this machine has {:.1f} GiB available",
                            copied / 1073741824.0, *available / 1073741824.0);
  const char *data = bytes.data() + header->dataOffset;
  for (const SafeTensorsEntry &e : header->entries) {
    if (wanted && !wanted(e.name))
      continue;
    Tensor tensor = Tensor::zeros(TensorType(DType::F32, Shape(e.shape.begin(), e.shape.end())));
    std::memcpy(tensor.data.data(), data + e.begin, e.end - e.begin);
    if (auto it = digests.find(e.name); it != digests.end() && digestOf(data + e.begin, e.end - e.begin) != it->second)
      return fileContentError(path,
                              "tensor '{}' does not match its checksum: its bytes were changed or damaged after the "
                              "checkpoint was written",
                              e.name);
    checkpoint.tensors.emplace(e.name, std::move(tensor));
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
