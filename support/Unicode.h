// UTF-8 and the Unicode classes text tokenizers split by: letters (\p{L}), numbers (\p{N}) and
// white space (the White_Space property, regular expressions' \s).
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tgc {

/// The code points of `text`, or an error naming the byte where it is not valid UTF-8
/// (overlong forms, surrogates and values past U+10FFFF included).
llvm::Expected<std::vector<uint32_t>> decodeUtf8(llvm::StringRef text);
/// `cp` appended to `out` as UTF-8.
void appendUtf8(uint32_t cp, std::string &out);

bool isUnicodeLetter(uint32_t cp);
bool isUnicodeNumber(uint32_t cp);
bool isUnicodeSpace(uint32_t cp);

} // namespace tgc
