#include "ir/Printer.h"

namespace tgc {

std::string printOp(const Op &op) {
  std::string line;
  for (unsigned i = 0; i < op.numResults(); ++i)
    line += (i ? ", %" : "%") + op.result(i)->name();
  line += (op.numResults() ? " = " : "") + op.name().str() + "(";
  for (unsigned i = 0; i < op.numOperands(); ++i)
    line += (i ? ", %" : "%") + op.operand(i)->name();
  line += ")";
  if (!op.attrs().empty()) {
    line += " {";
    bool first = true;
    for (const auto &[key, value] : op.attrs().entries()) {
      line += (first ? "" : ", ") + key + "=" + formatAttr(value);
      first = false;
    }
    line += "}";
  }
  if (op.numResults())
    line += " : ";
  for (unsigned i = 0; i < op.numResults(); ++i)
    line += (i ? ", " : "") + op.result(i)->type().str();
  return line;
}

void printGraph(const Graph &graph, llvm::raw_ostream &os) {
  os << "graph @" << graph.name() << "\n";
  for (const Op *op : graph.ops())
    os << printOp(*op) << "\n";
  os << "return ";
  for (size_t i = 0; i < graph.outputs().size(); ++i)
    os << (i ? ", %" : "%") << graph.outputs()[i]->name();
  os << "\n";
}

std::string printGraph(const Graph &graph) {
  std::string text;
  llvm::raw_string_ostream os(text);
  printGraph(graph, os);
  return os.str();
}

} // namespace tgc
