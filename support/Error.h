// How tgc makes an error. Library code returns llvm::Error / llvm::Expected (no exceptions); the
// CLI prints the message as one line. Messages read "file:line:col: error: what" or "error: what".
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <fmt/format.h>
#include <string>
#include <utility>

namespace tgc {

/// An error whose message is fmt's `format` of `args`.
template <typename... Args>
llvm::Error makeError(fmt::format_string<Args...> format, Args &&...args) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), fmt::format(format, std::forward<Args>(args)...));
}

/// An error with a message made elsewhere (taken as it is: no format directives).
inline llvm::Error stringError(std::string message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// An error about the file `path`: "<path>: error: <message>".
template <typename... Args>
llvm::Error fileError(llvm::StringRef path, fmt::format_string<Args...> format, Args &&...args) {
  return stringError(path.str() + ": error: " + fmt::format(format, std::forward<Args>(args)...));
}

} // namespace tgc
