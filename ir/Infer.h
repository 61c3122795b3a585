// Type rules of the ops: the verifier hook of each op in Ops.def. The builder uses them to infer
// result types; the verifier checks parsed or rewritten ops against them.
#pragma once

#include "ir/Graph.h"

namespace tgc {

using TypeList = llvm::SmallVector<TensorType, 1>;

/// The result types of `kind` applied to operands of these types, or why it is ill-formed.
/// Leaves (input, param) have no operands: their declared type is checked and returned.
llvm::Expected<TypeList> inferResultTypes(OpKind kind, llvm::ArrayRef<TensorType> operands,
                                          const AttrMap &attrs,
                                          llvm::ArrayRef<TensorType> declared = {});
llvm::Expected<TypeList> inferResultTypes(OpKind kind, llvm::ArrayRef<Value *> operands,
                                          const AttrMap &attrs);

/// Rank, dimensions and element count within the IR's limits.
llvm::Error checkTypeLimits(const TensorType &type);

} // namespace tgc
