#include "support/Limits.h"

#include "support/Error.h"

#include "llvm/Support/FileSystem.h"

#include <fmt/format.h>

namespace tgc {

std::optional<size_t> findDeepNesting(llvm::StringRef text, unsigned limit, bool yaml) {
  unsigned depth = 0, keys = 0; // keys: the run of YAML indicators ('?', "- ") this character ends
  bool inString = false, lineStart = true;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (yaml && lineStart) { // indentation (the block entries after it count below)
      size_t j = i;
      while (j < text.size() && text[j] == ' ')
        ++j;
      if (j - i > 4 * size_t(limit))
        return j;
    }
    lineStart = c == '\n';
    if (!yaml && inString) {
      if (c == '\\')
        ++i; // the escaped character
      else if (c == '"')
        inString = false;
      continue;
    }
    const bool entry = c == '-' && i + 1 < text.size() && (text[i + 1] == ' ' || text[i + 1] == '\t');
    if (yaml && (c == '?' || entry)) { // a key or a block entry nesting the next ("- - -", "? - ? -")
      if (depth + ++keys > limit)
        return i;
      continue;
    }
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
      keys = 0;
    if (!yaml && c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit)
        return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

std::pair<unsigned, unsigned> lineAndColumn(llvm::StringRef text, size_t offset) {
  llvm::StringRef before = text.take_front(offset);
  unsigned line = unsigned(before.count('\n')) + 1;
  size_t lastNewline = before.rfind('\n');
  unsigned column = unsigned(lastNewline == llvm::StringRef::npos ? offset + 1 : offset - lastNewline);
  return {line, column};
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> readFileAtMost(llvm::StringRef path, uint64_t limit,
                                                                  llvm::StringRef what) {
  llvm::sys::fs::file_t file;
  if (path == "-") {
    file = llvm::sys::fs::getStdinHandle();
  } else {
    auto opened = llvm::sys::fs::openNativeFileForRead(path);
    if (!opened)
      return fileError(path, "cannot read: {}", llvm::toString(opened.takeError()));
    file = *opened;
  }
  std::string contents;
  char chunk[1 << 16];
  while (true) {
    auto got = llvm::sys::fs::readNativeFile(file, llvm::MutableArrayRef<char>(chunk, sizeof chunk));
    if (!got) {
      if (path != "-")
        llvm::sys::fs::closeFile(file);
      return fileError(path, "cannot read: {}", llvm::toString(got.takeError()));
    }
    if (*got == 0)
      break;
    contents.append(chunk, *got);
    if (contents.size() > limit) {
      if (path != "-")
        llvm::sys::fs::closeFile(file);
      return fileError(path, "larger than the {} MiB {} may be", limit >> 20, what.str());
    }
  }
  if (path != "-")
    llvm::sys::fs::closeFile(file);
  return llvm::MemoryBuffer::getMemBufferCopy(contents, path);
}

} // namespace tgc
