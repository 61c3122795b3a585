// libFuzzer target: a Hugging Face config.json as `tgc convert` reads it (modelFromHfConfig), on
// any bytes. A finding is a crash, a hang, a sanitizer report, or an accepted config whose
// model does not come back the same through hfConfigOf (the config tgc writes) and back.
#include "app/HuggingFace.h"
#include "models/ModelConfig.h"

#include "llvm/Support/JSON.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef bytes(reinterpret_cast<const char *>(data), size);
  auto json = llvm::json::parse(bytes);
  if (!json) {
    llvm::consumeError(json.takeError());
    return 0;
  }
  const llvm::json::Object *object = json->getAsObject();
  if (!object)
    return 0;
  tgc::HfNotes notes;
  auto model = tgc::modelFromHfConfig(*object, "fuzz/config.json", "fuzz", 0, notes);
  if (!model) {
    llvm::consumeError(model.takeError());
    return 0;
  }
  auto written = tgc::hfConfigOf(*model);
  if (!written)
    std::abort();
  tgc::HfNotes again;
  auto back = tgc::modelFromHfConfig(*written, "again/config.json", "fuzz", 0, again);
  if (!back || tgc::formatModelConfig(*back) != tgc::formatModelConfig(*model))
    std::abort();
  return 0;
}
