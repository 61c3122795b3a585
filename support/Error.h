// How tgc makes an error. Library code returns llvm::Error / llvm::Expected (no exceptions); the
// CLI prints the message as one line. Messages read "file:line:col: error: what" or "error: what".
#pragma once

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <fmt/format.h>
#include <string>
#include <utility>

namespace tgc {

/// `text` with control characters and non-ASCII bytes escaped (\n, \x7f), so that error
/// messages quoting user input stay on one line (and a terminal shows escape sequences rather
/// than obeying them); past 2000 bytes, the start and how much was left out. Text it made is
/// left as it is (all it writes is printable ASCII), so a message may pass through it twice.
std::string escapeForMessage(llvm::StringRef text);

/// An error whose message is fmt's `format` of `args`.
template <typename... Args>
llvm::Error makeError(fmt::format_string<Args...> format, Args &&...args) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), fmt::format(format, std::forward<Args>(args)...));
}

/// An error with a message made elsewhere (taken as it is: no format directives).
inline llvm::Error stringError(std::string message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// An error about the file `path`: "<path>: error: <message>", the path escaped.
template <typename... Args>
llvm::Error fileError(llvm::StringRef path, fmt::format_string<Args...> format, Args &&...args) {
  return stringError(escapeForMessage(path) + ": error: " + fmt::format(format, std::forward<Args>(args)...));
}

/// fileError for a message that quotes what the file holds: the whole message escaped.
template <typename... Args>
llvm::Error fileContentError(llvm::StringRef path, fmt::format_string<Args...> format, Args &&...args) {
  return stringError(escapeForMessage(path.str() + ": error: " + fmt::format(format, std::forward<Args>(args)...)));
}

} // namespace tgc
