#include "ir/Verifier.h"
#include "support/Error.h"

#include "ir/Infer.h"

#include "llvm/ADT/DenseSet.h"

#include <fmt/format.h>

namespace tgc {

static llvm::Error opError(const Op &op, llvm::StringRef file, const std::string &message) {
  std::string where;
  if (op.loc().line)
    where = fmt::format("{}:{}:{}: ", file.empty() ? "<ir>" : file.str(), op.loc().line,
                        op.loc().column);
  std::string subject = op.numResults() ? "%" + op.result(0)->name() + " = " : "";
  return makeError("{}error: {}{}: {}", where.c_str(), subject.c_str(), op.name().str().c_str(),
                   escapeForMessage(message).c_str());
}

llvm::Error verify(const Graph &graph, llvm::StringRef file) {
  llvm::DenseSet<const Value *> defined;
  llvm::DenseSet<const Op *> assigned;
  for (const Op *op : graph.ops()) {
    llvm::SmallVector<TensorType, 4> operandTypes;
    for (const Value *v : op->operands()) {
      if (!defined.count(v))
        return opError(*op, file, "operand %" + v->name() + " is used before it is defined");
      operandTypes.push_back(v->type());
    }
    llvm::SmallVector<TensorType, 1> declared;
    for (unsigned i = 0; i < op->numResults(); ++i)
      declared.push_back(op->result(i)->type());
    auto inferred = inferResultTypes(op->kind(), operandTypes, op->attrs(), declared);
    if (!inferred)
      return opError(*op, file, llvm::toString(inferred.takeError()));
    if (declared.size() != inferred->size())
      return opError(*op, file,
                     fmt::format("has {} results, expected {}", declared.size(), inferred->size()));
    for (unsigned i = 0; i < declared.size(); ++i)
      if ((*inferred)[i] != declared[i])
        return opError(*op, file,
                       fmt::format("result type {} does not match the inferred type {}",
                                   declared[i].str(), (*inferred)[i].str()));
    for (unsigned i = 0; i < op->numResults(); ++i)
      defined.insert(op->result(i));
    if (op->kind() == OpKind::Assign) {
      const Op *target = op->operand(0)->def();
      if (target->kind() != OpKind::Param && target->kind() != OpKind::State)
        return opError(*op, file, "can only assign to a param or state, not to %" +
                                      op->operand(0)->name());
      if (!assigned.insert(target).second)
        return opError(*op, file, "%" + op->operand(0)->name() + " is assigned twice");
    }
  }
  if (graph.outputs().empty())
    return makeError("{}: error: graph @{} returns nothing", file.empty() ? "<ir>" : file.str().c_str(),
                     graph.name().c_str());
  for (const Value *out : graph.outputs())
    if (!defined.count(out))
      return makeError("error: graph @{} returns %{}, which no op defines", graph.name().c_str(), out->name().c_str());
  return llvm::Error::success();
}

} // namespace tgc
