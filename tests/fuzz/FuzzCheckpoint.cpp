// libFuzzer target: the checkpoint reader (safetensors with tgc's metadata), on any bytes. A
// finding is a crash, a hang, a sanitizer report, or an accepted checkpoint that does not
// write back to bytes that read back to the same tensors and metadata.
#include "app/Checkpoint.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef bytes(reinterpret_cast<const char *>(data), size);
  auto checkpoint = tgc::parseCheckpoint(bytes, "fuzz.safetensors");
  if (!checkpoint) {
    llvm::consumeError(checkpoint.takeError());
    return 0;
  }
  auto again = tgc::formatCheckpoint(*checkpoint, "again.safetensors");
  if (!again)
    std::abort();
  auto back = tgc::parseCheckpoint(*again, "again.safetensors");
  if (!back || back->tensors.size() != checkpoint->tensors.size() ||
      llvm::json::Value(llvm::json::Object(back->meta)) != llvm::json::Value(llvm::json::Object(checkpoint->meta)))
    std::abort();
  for (const auto &[name, tensor] : checkpoint->tensors) {
    auto it = back->tensors.find(name);
    if (it == back->tensors.end() || it->second.type != tensor.type ||
        std::memcmp(it->second.data.data(), tensor.data.data(), tensor.data.size() * 4) != 0)
      std::abort(); // (bytes, not floats: NaN payloads must survive too)
  }
  return 0;
}
