// libFuzzer target: the IR text parser, on any bytes. A finding is a crash, a hang, a sanitizer
// report, or an accepted graph that does not print and parse back to the same text.
#include "ir/Parser.h"
#include "ir/Printer.h"

#include <cstdint>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  auto graph = tgc::parseGraph(text, "fuzz.ir");
  if (!graph) {
    llvm::consumeError(graph.takeError());
    return 0;
  }
  std::string printed = tgc::printGraph(**graph);
  auto back = tgc::parseGraph(printed, "printed.ir");
  if (!back || tgc::printGraph(**back) != printed)
    std::abort();
  return 0;
}
