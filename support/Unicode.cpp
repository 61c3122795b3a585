#include "support/Unicode.h"

#include "support/Error.h"

#include <algorithm>

namespace tgc {

namespace {

struct CodePointRange {
  uint32_t first, last;
};
#include "support/UnicodeTables.inc"

template <size_t N> bool inRanges(const CodePointRange (&ranges)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                             [](uint32_t c, const CodePointRange &r) { return c < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

} // namespace

llvm::Expected<std::vector<uint32_t>> decodeUtf8(llvm::StringRef text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto *s = reinterpret_cast<const uint8_t *>(text.data());
  size_t n = text.size();
  for (size_t i = 0; i < n;) {
    uint8_t b = s[i];
    int length = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    uint32_t cp = length == 1 ? b : length == 2 ? b & 0x1F : length == 3 ? b & 0x0F : b & 0x07;
    bool valid = length > 0 && i + size_t(length) <= n;
    for (int k = 1; valid && k < length; ++k) {
      valid = (s[i + k] & 0xC0) == 0x80;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    static const uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
    if (!valid || cp < kSmallest[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return makeError("not valid UTF-8 at byte {}", i);
    out.push_back(cp);
    i += size_t(length);
  }
  return out;
}

void appendUtf8(uint32_t cp, std::string &out) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | cp >> 6), out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | cp >> 12), out += char(0x80 | (cp >> 6 & 0x3F)), out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | cp >> 18), out += char(0x80 | (cp >> 12 & 0x3F)), out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

bool isUnicodeLetter(uint32_t cp) { return inRanges(kLetterRanges, cp); }
bool isUnicodeNumber(uint32_t cp) { return inRanges(kNumberRanges, cp); }

bool isUnicodeSpace(uint32_t cp) {
  // The White_Space property (PropList.txt), as regular expressions' \s takes it.
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

} // namespace tgc
