// The tgc IR graph: values, ops with use lists, the graph in program order, and the builder.
#pragma once

#include "ir/Types.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tgc {

enum class OpKind : uint8_t {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) Enum,
#include "ir/Ops.def"
};

/// An op's row of the op table (ir/Ops.def).
struct OpInfo {
  llvm::StringRef name;
  unsigned minOperands;
  unsigned maxOperands;
  unsigned maxResults;
  bool hasGradient;     // autodiff has a rule for it
  bool bf16Outputs;     // its GPU kernels can store their fp32 results in BF16
  llvm::StringRef inPlace; // per result, the operand it may be written into ('-': none)
};

const OpInfo &opInfo(OpKind kind);
std::optional<OpKind> parseOpKind(llvm::StringRef name);
/// Leaves have no operands and a declared type: input, param, state, constant.
bool isLeaf(OpKind kind);
/// Ops that must stay even when nothing reads them (assign).
bool hasSideEffects(OpKind kind);
/// The operand result `r` of `kind` may be written into (the InPlace column), or -1.
int inPlaceOperand(OpKind kind, unsigned r);
constexpr unsigned kNumOpKinds = 0
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace) +1
#include "ir/Ops.def"
    ;

class Op;

/// An SSA value: one result of one op. `users` lists each using op once per use.
class Value {
public:
  Value(Op *def, unsigned index, TensorType type, std::string name)
      : def_(def), index_(index), type_(std::move(type)), name_(std::move(name)) {}

  Op *def() const { return def_; }
  unsigned index() const { return index_; }
  const TensorType &type() const { return type_; }
  void setType(TensorType type) { type_ = std::move(type); }
  const std::string &name() const { return name_; }
  llvm::ArrayRef<Op *> users() const { return users_; }
  bool hasUses() const { return !users_.empty(); }

private:
  friend class Graph;
  friend class Op;
  void removeUse(Op *user);
  Op *def_;
  unsigned index_;
  TensorType type_;
  std::string name_;
  std::vector<Op *> users_;
};

class Op {
public:
  OpKind kind() const { return kind_; }
  llvm::StringRef name() const { return opInfo(kind_).name; }
  llvm::ArrayRef<Value *> operands() const { return operands_; }
  Value *operand(unsigned i) const { return operands_[i]; }
  unsigned numOperands() const { return operands_.size(); }
  unsigned numResults() const { return results_.size(); }
  Value *result(unsigned i = 0) const { return results_[i].get(); }
  const AttrMap &attrs() const { return attrs_; }
  AttrMap &attrs() { return attrs_; }
  Location loc() const { return loc_; }
  void setLoc(Location loc) { loc_ = loc; }
  /// Replaces operand i, keeping the use lists right.
  void setOperand(unsigned i, Value *value);

private:
  friend class Graph;
  OpKind kind_;
  llvm::SmallVector<Value *, 4> operands_;
  llvm::SmallVector<std::unique_ptr<Value>, 1> results_;
  AttrMap attrs_;
  Location loc_;
};

/// Ops in program order (every operand defined above its user). The graph owns ops and values;
/// value names are unique within it.
class Graph {
public:
  explicit Graph(std::string name) : name_(std::move(name)) {}
  Graph(const Graph &) = delete;
  Graph &operator=(const Graph &) = delete;

  const std::string &name() const { return name_; }
  /// The ops in program order.
  std::vector<Op *> ops() const;
  size_t numOps() const { return ops_.size(); }
  llvm::ArrayRef<Value *> outputs() const { return outputs_; }
  void addOutput(Value *value) { outputs_.push_back(value); }
  void removeOutput(unsigned i) { outputs_.erase(outputs_.begin() + i); }
  void setOutput(unsigned i, Value *value) { outputs_[i] = value; }
  Value *lookup(llvm::StringRef name) const;

  /// Renames a value; `name` must not be in use.
  void rename(Value *value, llvm::StringRef name);
  /// A name not yet used in the graph: `base`, else `base.1`, `base.2`, ...
  std::string uniqueName(llvm::StringRef base) const;

  /// Appends an op (or inserts it before `before`). Types and names are taken as given: the
  /// builder infers types, the parser checks them afterwards with the verifier. Names must be
  /// unique (see uniqueName).
  Op *createOp(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
               llvm::ArrayRef<TensorType> resultTypes, llvm::ArrayRef<std::string> resultNames,
               Op *before = nullptr);
  /// Redirects every use of `from` (graph outputs too) to `to`.
  void replaceAllUsesWith(Value *from, Value *to);
  /// Removes an op whose results have no uses.
  void eraseOp(Op *op);
  /// Removes `ops`, whose results have no uses but by each other, in one sweep (erasing them
  /// one at a time costs a search of the op list each).
  void eraseOps(llvm::ArrayRef<Op *> ops);
  /// Reorders the ops so that every operand is defined above its users, moving as little as
  /// possible: among the ops that are ready, the one that came first goes first.
  void sortTopologically();

private:
  std::string name_;
  std::vector<std::unique_ptr<Op>> ops_;
  std::vector<Value *> outputs_;
  llvm::StringMap<Value *> names_;
  mutable llvm::StringMap<unsigned> nextSuffix_; // uniqueName: where the next search starts
};

/// The value a step assigns to the leaf `leaf` (assign(%leaf, %value): what it holds from the
/// step's end on), or null where none is.
Value *assignedValue(const Value *leaf);

/// Where `op` is a parameter kept as a ZeRO rank's shard of a larger tensor (param {whole, rank,
/// ranks}: transforms/precision/ShardedFp8Weights.h), the whole's type; else none.
std::optional<TensorType> shardedParamWhole(const Op &op);

/// Builds ops with inferred result types. The first type error is kept and every later call
/// returns nullptr, so a builder can be written straight through and checked once at the end.
class Builder {
public:
  explicit Builder(Graph &graph) : graph_(graph) {}

  /// Creates an op and returns its first result (nullptr for an op without results).
  Value *create(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
                llvm::StringRef name);
  /// Creates an op with several results, named `name`, `name.1`, ...
  Op *createOp(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
               llvm::StringRef name);
  Value *constant(llvm::StringRef name, TensorType type, double value);
  Value *input(llvm::StringRef name, TensorType type);
  Value *param(llvm::StringRef name, TensorType type, AttrMap init);
  Value *state(llvm::StringRef name, TensorType type, AttrMap init);
  llvm::Error takeError();
  Graph &graph() { return graph_; }
  /// Ops created from now on go before `op` (nullptr: at the end, the default).
  void setInsertionPoint(Op *op) { before_ = op; }

private:
  Value *leaf(OpKind kind, llvm::StringRef name, TensorType type, AttrMap attrs);
  Graph &graph_;
  std::string error_;
  Op *before_ = nullptr;
};

} // namespace tgc
