#include "ir/Types.h"

#include "llvm/ADT/StringSwitch.h"

#include <charconv>
#include <cmath>
#include <fmt/format.h>

namespace tgc {

llvm::StringRef dtypeName(DType dtype) {
  switch (dtype) {
#define DTYPE(Enum, Name, Bytes, IsFloat)                                                          \
  case DType::Enum:                                                                                \
    return Name;
#include "ir/DTypes.def"
  }
  return "?";
}

unsigned dtypeBytes(DType dtype) {
  switch (dtype) {
#define DTYPE(Enum, Name, Bytes, IsFloat)                                                          \
  case DType::Enum:                                                                                \
    return Bytes;
#include "ir/DTypes.def"
  }
  return 0;
}

bool isFloat(DType dtype) {
  switch (dtype) {
#define DTYPE(Enum, Name, Bytes, IsFloat)                                                          \
  case DType::Enum:                                                                                \
    return IsFloat;
#include "ir/DTypes.def"
  }
  return false;
}

std::optional<DType> parseDType(llvm::StringRef name) {
#define DTYPE(Enum, Name, Bytes, IsFloat)                                                          \
  if (name == Name)                                                                                \
    return DType::Enum;
#include "ir/DTypes.def"
  return std::nullopt;
}

int64_t TensorType::numElements() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

std::string TensorType::str() const {
  std::string s = dtypeName(dtype).str() + "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string formatDouble(double value) {
  if (std::isnan(value))
    return "nan";
  if (std::isinf(value))
    return value > 0 ? "inf" : "-inf";
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value);
  std::string s(buf, result.ptr);
  if (s.find_first_of(".e") == std::string::npos)
    s += ".0";
  return s;
}

static std::string quote(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string formatAttr(const Attr &attr) {
  if (auto *i = std::get_if<int64_t>(&attr))
    return std::to_string(*i);
  if (auto *d = std::get_if<double>(&attr))
    return formatDouble(*d);
  if (auto *b = std::get_if<bool>(&attr))
    return *b ? "true" : "false";
  if (auto *s = std::get_if<std::string>(&attr))
    return quote(*s);
  const auto &list = std::get<std::vector<int64_t>>(attr);
  std::string s = "[";
  for (size_t i = 0; i < list.size(); ++i)
    s += (i ? "," : "") + std::to_string(list[i]);
  return s + "]";
}

const Attr *AttrMap::get(llvm::StringRef key) const {
  auto it = attrs_.find(key.str());
  return it == attrs_.end() ? nullptr : &it->second;
}

template <typename T> static std::optional<T> getAs(const AttrMap &map, llvm::StringRef key) {
  if (const Attr *a = map.get(key))
    if (auto *v = std::get_if<T>(a))
      return *v;
  return std::nullopt;
}

std::optional<int64_t> AttrMap::getInt(llvm::StringRef key) const {
  return getAs<int64_t>(*this, key);
}
std::optional<double> AttrMap::getFloat(llvm::StringRef key) const {
  // An integer literal is accepted where a float is expected ("factor=1").
  if (auto i = getAs<int64_t>(*this, key))
    return double(*i);
  return getAs<double>(*this, key);
}
std::optional<bool> AttrMap::getBool(llvm::StringRef key) const { return getAs<bool>(*this, key); }
std::optional<std::string> AttrMap::getString(llvm::StringRef key) const {
  return getAs<std::string>(*this, key);
}
std::optional<std::vector<int64_t>> AttrMap::getInts(llvm::StringRef key) const {
  return getAs<std::vector<int64_t>>(*this, key);
}

AttrMap attrs(std::initializer_list<std::pair<const char *, Attr>> list) {
  AttrMap map;
  for (auto &[k, v] : list)
    map.set(k, v);
  return map;
}

} // namespace tgc
