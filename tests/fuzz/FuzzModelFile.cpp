// libFuzzer target: the model file reader (YAML), on any bytes. A finding is a crash, a hang, a
// sanitizer report, or an accepted description that does not read back to itself.
#include "models/ModelConfig.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  auto config = tgc::parseModelConfig(text, "fuzz.yaml");
  if (!config) {
    llvm::consumeError(config.takeError());
    return 0;
  }
  // What is accepted formats to a description that reads back to the same one.
  std::string again = tgc::formatModelConfig(*config);
  auto back = tgc::parseModelConfig(again, "again.yaml");
  if (!back || tgc::formatModelConfig(*back) != again)
    std::abort();
  return 0;
}
