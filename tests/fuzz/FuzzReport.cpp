// libFuzzer target: tgc report's readers and page, on any bytes: a training log, and after the
// first NUL byte (if there is one) a bench file. A finding is a crash, a hang, a sanitizer
// report, or a page in which any input got through unescaped: every '<' of the page must open
// (or close) one of the tags the page itself writes.
#include "tools/tgc/ReportPage.h"

#include "llvm/ADT/StringSwitch.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>

namespace {

bool isPageTag(llvm::StringRef name) {
  return llvm::StringSwitch<bool>(name)
      .Cases("!doctype", "html", "head", "meta", "title", "style", "body", "h1", "h2", true)
      .Cases("table", "tr", "td", "figure", "figcaption", "svg", "rect", "line", "text", true)
      .Cases("polyline", "p", true)
      .Default(false);
}

void checkTags(llvm::StringRef page) {
  for (size_t at = page.find('<'); at != llvm::StringRef::npos; at = page.find('<', at + 1)) {
    size_t start = at + 1 + (page.substr(at + 1).starts_with("/") ? 1 : 0), end = start;
    while (end < page.size() && (std::isalnum(static_cast<unsigned char>(page[end])) || page[end] == '!'))
      ++end;
    if (!isPageTag(page.slice(start, end).lower()))
      std::abort();
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef bytes(reinterpret_cast<const char *>(data), size);
  auto [logText, benchText] = bytes.split('\0');
  auto log = tgc::report::parseRunLog(logText, "fuzz.jsonl");
  std::string bench;
  if (benchText.size() || bytes.contains('\0')) {
    auto section = tgc::report::parseBenchSection(benchText, "fuzz.json");
    if (section)
      bench = std::move(*section);
    else
      llvm::consumeError(section.takeError());
  }
  if (!log) {
    llvm::consumeError(log.takeError());
    return 0;
  }
  checkTags(tgc::report::renderReportPage(*log, bench));
  return 0;
}
