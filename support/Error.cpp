#include "support/Error.h"

namespace tgc {

std::string escapeForMessage(llvm::StringRef text) {
  // A message that would echo a whole input is cut: its start says where and what.
  constexpr size_t kMostShown = 2000;
  std::string out;
  if (text.size() > kMostShown)
    return escapeForMessage(text.take_front(kMostShown)) +
           fmt::format(" ... ({} more bytes not shown)", text.size() - kMostShown);
  for (unsigned char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += char(c);
  }
  return out;
}

} // namespace tgc
