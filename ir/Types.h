// Element types, tensor types and op attributes of the tgc IR.
#pragma once

#include "support/Error.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace tgc {

enum class DType : uint8_t {
#define DTYPE(Enum, Name, Bytes, IsFloat) Enum,
#include "ir/DTypes.def"
};

llvm::StringRef dtypeName(DType dtype);
unsigned dtypeBytes(DType dtype);
bool isFloat(DType dtype);
inline bool isFp8(DType d) { return d == DType::F8E4M3 || d == DType::F8E5M2; }
std::optional<DType> parseDType(llvm::StringRef name);

/// Largest rank and element count the IR accepts; larger shapes are input errors, not overflows.
constexpr unsigned kMaxRank = 8;
constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;
constexpr int64_t kMaxElements = int64_t(1) << 40;

using Shape = llvm::SmallVector<int64_t, 4>;

/// A statically shaped tensor type, printed as `f32[16,32,64]` (`f32[]` for a scalar).
struct TensorType {
  DType dtype = DType::F32;
  Shape shape;

  TensorType() = default;
  TensorType(DType dtype, llvm::ArrayRef<int64_t> dims) : dtype(dtype), shape(dims) {}

  unsigned rank() const { return shape.size(); }
  int64_t dim(int i) const { return i < 0 ? shape[shape.size() + i] : shape[i]; }
  int64_t numElements() const;
  bool operator==(const TensorType &other) const {
    return dtype == other.dtype && shape == other.shape;
  }
  bool operator!=(const TensorType &other) const { return !(*this == other); }
  std::string str() const;
};

/// An attribute value: integer, float, bool, string or integer list.
using Attr = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

std::string formatAttr(const Attr &attr);
/// Shortest text that parses back to exactly the same double; always has '.', 'e', "inf" or "nan".
std::string formatDouble(double value);

/// Attributes are kept sorted by name, so printing is deterministic.
class AttrMap {
public:
  void set(llvm::StringRef key, Attr value) { attrs_[key.str()] = std::move(value); }
  bool has(llvm::StringRef key) const { return attrs_.count(key.str()) != 0; }
  void erase(llvm::StringRef key) { attrs_.erase(key.str()); }
  const Attr *get(llvm::StringRef key) const;
  std::optional<int64_t> getInt(llvm::StringRef key) const;
  std::optional<double> getFloat(llvm::StringRef key) const;
  std::optional<bool> getBool(llvm::StringRef key) const;
  std::optional<std::string> getString(llvm::StringRef key) const;
  std::optional<std::vector<int64_t>> getInts(llvm::StringRef key) const;
  const std::map<std::string, Attr> &entries() const { return attrs_; }
  bool empty() const { return attrs_.empty(); }
  bool operator==(const AttrMap &other) const { return attrs_ == other.attrs_; }

private:
  std::map<std::string, Attr> attrs_;
};

/// An attribute map written inline, as passes and kernels build them: attrs({{"axis", 2}}).
AttrMap attrs(std::initializer_list<std::pair<const char *, Attr>> list);

/// Where an op came from in IR text (line 0 means built in memory).
struct Location {
  unsigned line = 0;
  unsigned column = 0;
};

} // namespace tgc
