#include "ir/Graph.h"
#include "ir/Infer.h"
#include "support/Error.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SetVector.h"

#include <algorithm>
#include <cassert>
#include <functional>

namespace tgc {

static const OpInfo kOpInfos[] = {
#define OP_TRAIT_yes true
#define OP_TRAIT_no false
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace)                 \
  {Name, MinOperands, MaxOperands, Results, OP_TRAIT_##Gradient, OP_TRAIT_##Bf16Out, InPlace},
#include "ir/Ops.def"
};
#undef OP_TRAIT_yes
#undef OP_TRAIT_no

const OpInfo &opInfo(OpKind kind) { return kOpInfos[static_cast<unsigned>(kind)]; }

std::optional<OpKind> parseOpKind(llvm::StringRef name) {
#define OP(Enum, Name, MinOperands, MaxOperands, Results, Gradient, Bf16Out, InPlace)                 \
  if (name == Name)                                                                                \
    return OpKind::Enum;
#include "ir/Ops.def"
  return std::nullopt;
}

bool isLeaf(OpKind kind) {
  return kind == OpKind::Input || kind == OpKind::Param || kind == OpKind::State ||
         kind == OpKind::Constant;
}

bool hasSideEffects(OpKind kind) { return kind == OpKind::Assign; }

Value *assignedValue(const Value *leaf) {
  for (Op *user : leaf->users())
    if (user->kind() == OpKind::Assign && user->operand(0) == leaf)
      return user->operand(1);
  return nullptr;
}

std::optional<TensorType> shardedParamWhole(const Op &op) {
  auto whole = op.kind() == OpKind::Param ? op.attrs().getInts("whole") : std::nullopt;
  if (!whole)
    return std::nullopt;
  return TensorType(DType::F32, Shape(whole->begin(), whole->end()));
}

int inPlaceOperand(OpKind kind, unsigned r) {
  llvm::StringRef column = opInfo(kind).inPlace;
  return r < column.size() && column[r] != '-' ? column[r] - '0' : -1;
}

void Value::removeUse(Op *user) {
  auto &users = users_;
  auto it = std::find(users.begin(), users.end(), user);
  assert(it != users.end() && "use list out of sync");
  users.erase(it);
}

void Op::setOperand(unsigned i, Value *value) {
  operands_[i]->removeUse(this);
  operands_[i] = value;
  value->users_.push_back(this);
}

std::vector<Op *> Graph::ops() const {
  std::vector<Op *> list;
  list.reserve(ops_.size());
  for (const auto &op : ops_)
    list.push_back(op.get());
  return list;
}

Value *Graph::lookup(llvm::StringRef name) const { return names_.lookup(name); }

void Graph::rename(Value *value, llvm::StringRef name) {
  assert(!names_.count(name) && "rename to a name in use");
  names_.erase(value->name_);
  value->name_ = name.str();
  names_[name] = value;
}

std::string Graph::uniqueName(llvm::StringRef base) const {
  if (!names_.count(base))
    return base.str();
  // The search for a free suffix starts where the last one for this base ended: a base asked
  // for thousands of times (a gradient name in a deep model) stays linear, not quadratic.
  unsigned &next = nextSuffix_[base];
  for (unsigned i = std::max(next, 1u);; ++i) {
    std::string candidate = base.str() + "." + std::to_string(i);
    if (!names_.count(candidate)) {
      next = i + 1;
      return candidate;
    }
  }
}

Op *Graph::createOp(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
                    llvm::ArrayRef<TensorType> resultTypes,
                    llvm::ArrayRef<std::string> resultNames, Op *before) {
  assert(resultTypes.size() == resultNames.size());
  auto op = std::make_unique<Op>();
  op->kind_ = kind;
  op->operands_.assign(operands.begin(), operands.end());
  op->attrs_ = std::move(attrs);
  for (Value *v : operands)
    v->users_.push_back(op.get());
  for (size_t i = 0; i < resultTypes.size(); ++i) {
    assert(!names_.count(resultNames[i]) && "duplicate value name");
    op->results_.push_back(
        std::make_unique<Value>(op.get(), unsigned(i), resultTypes[i], resultNames[i]));
    names_[resultNames[i]] = op->results_.back().get();
  }
  Op *raw = op.get();
  if (!before) {
    ops_.push_back(std::move(op));
    return raw;
  }
  auto pos = std::find_if(ops_.begin(), ops_.end(), [&](auto &o) { return o.get() == before; });
  ops_.insert(pos, std::move(op));
  return raw;
}

void Graph::replaceAllUsesWith(Value *from, Value *to) {
  if (from == to)
    return;
  // Each use moves at once (users_ holds one entry a use), rather than one setOperand at a
  // time, whose search of the use list made merging into a value of many users quadratic.
  for (Op *user : from->users_)
    for (Value *&operand : user->operands_)
      if (operand == from)
        operand = to;
  to->users_.insert(to->users_.end(), from->users_.begin(), from->users_.end());
  from->users_.clear();
  for (Value *&out : outputs_)
    if (out == from)
      out = to;
}

void Graph::eraseOp(Op *op) { eraseOps({op}); }

void Graph::eraseOps(llvm::ArrayRef<Op *> ops) {
  llvm::DenseSet<const Op *> gone(ops.begin(), ops.end());
  auto isGone = [&](const Op *op) { return gone.contains(op); };
  llvm::SetVector<Value *> operands;
  for (Op *op : ops) {
    for (const auto &result : op->results_) {
      assert(llvm::all_of(result->users_, isGone) && "erasing an op whose results are still used");
      names_.erase(result->name());
    }
    operands.insert(op->operands_.begin(), op->operands_.end());
  }
  // One sweep of each use list and of the op list, whatever the number of ops erased.
  for (Value *v : operands)
    llvm::erase_if(v->users_, isGone);
  llvm::erase_if(ops_, [&](const std::unique_ptr<Op> &o) { return isGone(o.get()); });
}

Op *Builder::createOp(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
                      llvm::StringRef name) {
  if (!error_.empty() || llvm::is_contained(operands, nullptr))
    return nullptr;
  auto types = inferResultTypes(kind, operands, attrs);
  if (!types) {
    error_ = "building " + name.str() + " (" + opInfo(kind).name.str() +
             "): " + llvm::toString(types.takeError());
    return nullptr;
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < types->size(); ++i)
    names.push_back(graph_.uniqueName(i == 0 ? name : (name + "." + std::to_string(i)).str()));
  return graph_.createOp(kind, operands, std::move(attrs), *types, names, before_);
}

void Graph::sortTopologically() {
  std::vector<std::unique_ptr<Op>> sorted;
  sorted.reserve(ops_.size());
  llvm::DenseMap<const Op *, size_t> position, pending;
  for (size_t i = 0; i < ops_.size(); ++i)
    position[ops_[i].get()] = i;
  // Ready ops in a min-heap of their old positions, so the order is deterministic and stable.
  std::vector<size_t> ready;
  auto pushReady = [&](size_t i) {
    ready.push_back(i);
    std::push_heap(ready.begin(), ready.end(), std::greater<>());
  };
  for (size_t i = 0; i < ops_.size(); ++i) {
    size_t count = 0;
    for (Value *v : ops_[i]->operands_)
      count += v->def() != ops_[i].get();
    pending[ops_[i].get()] = count;
    if (count == 0)
      pushReady(i);
  }
  std::vector<std::unique_ptr<Op>> old = std::move(ops_);
  while (!ready.empty()) {
    std::pop_heap(ready.begin(), ready.end(), std::greater<>());
    size_t i = ready.back();
    ready.pop_back();
    Op *op = old[i].get();
    for (const auto &result : op->results_)
      for (Op *user : result->users_)
        if (--pending[user] == 0)
          pushReady(position[user]);
    sorted.push_back(std::move(old[i]));
  }
  assert(sorted.size() == old.size() && "the graph has a cycle");
  ops_ = std::move(sorted);
}

Value *Builder::create(OpKind kind, llvm::ArrayRef<Value *> operands, AttrMap attrs,
                       llvm::StringRef name) {
  Op *op = createOp(kind, operands, std::move(attrs), name);
  return op && op->numResults() ? op->result(0) : nullptr;
}

Value *Builder::constant(llvm::StringRef name, TensorType type, double value) {
  AttrMap attrs;
  attrs.set("value", value);
  return leaf(OpKind::Constant, graph_.uniqueName(name), std::move(type), std::move(attrs));
}

Value *Builder::leaf(OpKind kind, llvm::StringRef name, TensorType type, AttrMap attrs) {
  if (!error_.empty())
    return nullptr;
  if (graph_.lookup(name)) {
    error_ = "duplicate " + opInfo(kind).name.str() + " name '" + name.str() + "'";
    return nullptr;
  }
  return graph_.createOp(kind, {}, std::move(attrs), {type}, {name.str()})->result(0);
}

Value *Builder::input(llvm::StringRef name, TensorType type) {
  return leaf(OpKind::Input, name, std::move(type), {});
}

Value *Builder::param(llvm::StringRef name, TensorType type, AttrMap init) {
  return leaf(OpKind::Param, name, std::move(type), std::move(init));
}

Value *Builder::state(llvm::StringRef name, TensorType type, AttrMap init) {
  return leaf(OpKind::State, name, std::move(type), std::move(init));
}

llvm::Error Builder::takeError() {
  if (error_.empty())
    return llvm::Error::success();
  return stringError(std::exchange(error_, ""));
}

} // namespace tgc
