#include "ir/Parser.h"
#include "support/Error.h"

#include "ir/Infer.h"
#include "ir/Verifier.h"
#include "support/Limits.h"

#include "llvm/Support/MemoryBuffer.h"

#include <charconv>
#include <fmt/format.h>

namespace tgc {
namespace {

enum class Tok {
  Eof, Newline, ValueName, GraphName, Ident, Integer, Float, String,
  LParen, RParen, LBrace, RBrace, LBracket, RBracket, Comma, Equal, Colon,
};

struct Token {
  Tok kind = Tok::Eof;
  llvm::StringRef text; // for names without the sigil; strings unescaped into `str`
  std::string str;
  unsigned line = 1, column = 1;
};

llvm::StringRef describe(Tok kind) {
  switch (kind) {
  case Tok::Eof: return "end of file";
  case Tok::Newline: return "end of line";
  case Tok::ValueName: return "value name";
  case Tok::GraphName: return "graph name";
  case Tok::Ident: return "identifier";
  case Tok::Integer: return "integer";
  case Tok::Float: return "float";
  case Tok::String: return "string";
  case Tok::LParen: return "'('";
  case Tok::RParen: return "')'";
  case Tok::LBrace: return "'{'";
  case Tok::RBrace: return "'}'";
  case Tok::LBracket: return "'['";
  case Tok::RBracket: return "']'";
  case Tok::Comma: return "','";
  case Tok::Equal: return "'='";
  case Tok::Colon: return "':'";
  }
  return "token";
}

bool isIdentChar(char c) { return llvm::isAlnum(c) || c == '_' || c == '.'; }

class Parser {
public:
  Parser(llvm::StringRef text, llvm::StringRef file) : text_(text), file_(file) {}

  llvm::Expected<std::unique_ptr<Graph>> parse();

private:
  // Lexing.
  llvm::Error lex(Token &tok);
  llvm::Error advance() { return lex(tok_); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  void bump() {
    if (text_[pos_++] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
  }
  /// The string literal at `start` (its opening quote), into `tok`.
  llvm::Error lexString(Token &tok, size_t start);
  /// The number (or -inf) at `start`, into `tok`.
  llvm::Error lexNumber(Token &tok, size_t start);
  llvm::Error error(const Token &at, const std::string &message) const {
    return makeError("{}:{}:{}: error: {}", file_.str().c_str(), at.line, at.column, escapeForMessage(message).c_str());
  }
  llvm::Error expected(llvm::StringRef what) const {
    std::string found = describe(tok_.kind).str();
    if (tok_.kind == Tok::Ident || tok_.kind == Tok::Integer || tok_.kind == Tok::Float)
      found += " '" + tok_.text.str() + "'";
    return error(tok_, fmt::format("expected {}, found {}", what.str(), found));
  }
  llvm::Error expect(Tok kind, llvm::StringRef what = "") {
    if (tok_.kind != kind)
      return expected(what.empty() ? describe(kind) : what);
    return advance();
  }
  llvm::Error skipNewlines() {
    while (tok_.kind == Tok::Newline)
      if (auto err = advance())
        return err;
    return llvm::Error::success();
  }
  llvm::Error endOfStatement() {
    if (tok_.kind != Tok::Newline && tok_.kind != Tok::Eof)
      return expected("end of line");
    return skipNewlines();
  }

  // Grammar.
  llvm::Error parseStatement(Graph &graph);
  llvm::Error parseReturn(Graph &graph);
  llvm::Error parseType(TensorType &type);
  llvm::Error parseAttrs(AttrMap &attrs);
  llvm::Error parseAttrValue(Attr &value);

  llvm::StringRef text_;
  llvm::StringRef file_;
  size_t pos_ = 0;
  unsigned line_ = 1, column_ = 1;
  Token tok_;
};

llvm::Error Parser::lex(Token &tok) {
  // Blanks and comments ('#' or '//' to the end of the line).
  while (pos_ < text_.size()) {
    char c = peek();
    if (c == ' ' || c == '\t' || c == '\r') {
      bump();
    } else if (c == '#' || (c == '/' && peek(1) == '/')) {
      while (pos_ < text_.size() && peek() != '\n')
        bump();
    } else {
      break;
    }
  }
  tok = Token();
  tok.line = line_;
  tok.column = column_;
  if (pos_ >= text_.size()) {
    tok.kind = Tok::Eof;
    return llvm::Error::success();
  }
  size_t start = pos_;
  char c = peek();
  auto single = [&](Tok kind) {
    bump();
    tok.kind = kind;
    tok.text = text_.substr(start, 1);
    return llvm::Error::success();
  };
  switch (c) {
  case '\n': return single(Tok::Newline);
  case '(': return single(Tok::LParen);
  case ')': return single(Tok::RParen);
  case '{': return single(Tok::LBrace);
  case '}': return single(Tok::RBrace);
  case '[': return single(Tok::LBracket);
  case ']': return single(Tok::RBracket);
  case ',': return single(Tok::Comma);
  case '=': return single(Tok::Equal);
  case ':': return single(Tok::Colon);
  default: break;
  }
  if (c == '%' || c == '@') {
    bump();
    size_t nameStart = pos_;
    // Graph names may also hold '-' (gpt2-124m); value names may not.
    while (pos_ < text_.size() && (isIdentChar(peek()) || (c == '@' && peek() == '-')))
      bump();
    if (pos_ == nameStart)
      return error(tok, fmt::format("expected a name after '{}'", c));
    tok.kind = c == '%' ? Tok::ValueName : Tok::GraphName;
    tok.text = text_.slice(nameStart, pos_);
    return llvm::Error::success();
  }
  if (c == '"')
    return lexString(tok, start);
  if (llvm::isDigit(c) || (c == '-' && (llvm::isDigit(peek(1)) || llvm::isAlpha(peek(1)))))
    return lexNumber(tok, start);
  if (llvm::isAlpha(c) || c == '_') {
    while (pos_ < text_.size() && (llvm::isAlnum(peek()) || peek() == '_'))
      bump();
    tok.kind = Tok::Ident;
    tok.text = text_.slice(start, pos_);
    return llvm::Error::success();
  }
  if (llvm::isPrint(c))
    return error(tok, fmt::format("unexpected character '{}'", c));
  return error(tok, fmt::format("unexpected byte 0x{:02x}", static_cast<unsigned char>(c)));
}

llvm::Error Parser::lexString(Token &tok, size_t start) {
  bump();
  while (true) {
    if (pos_ >= text_.size() || peek() == '\n')
      return error(tok, "unterminated string");
    char s = peek();
    bump();
    if (s == '"')
      break;
    if (s == '\\') {
      if (pos_ >= text_.size() || (peek() != '"' && peek() != '\\'))
        return error(tok, "unknown escape in string (only \\\" and \\\\)");
      s = peek();
      bump();
    }
    tok.str += s;
  }
  tok.kind = Tok::String;
  tok.text = text_.slice(start, pos_);
  return llvm::Error::success();
}

llvm::Error Parser::lexNumber(Token &tok, size_t start) {
  bool negative = peek() == '-';
  if (negative)
    bump();
  if (llvm::isAlpha(peek())) { // -inf
    while (pos_ < text_.size() && llvm::isAlpha(peek()))
      bump();
    tok.kind = Tok::Float;
    tok.text = text_.slice(start, pos_);
    if (tok.text != "-inf")
      return error(tok, "expected a number after '-'");
    return llvm::Error::success();
  }
  bool isFloatLit = false;
  while (pos_ < text_.size()) {
    char d = peek();
    if (llvm::isDigit(d)) {
      bump();
    } else if (d == '.' || d == 'e' || d == 'E') {
      isFloatLit = true;
      bump();
      if ((d == 'e' || d == 'E') && (peek() == '+' || peek() == '-'))
        bump();
    } else {
      break;
    }
  }
  tok.kind = isFloatLit ? Tok::Float : Tok::Integer;
  tok.text = text_.slice(start, pos_);
  return llvm::Error::success();
}

llvm::Error Parser::parseType(TensorType &type) {
  if (tok_.kind != Tok::Ident)
    return expected("a tensor type such as f32[16,64]");
  auto dtype = parseDType(tok_.text);
  if (!dtype)
    return error(tok_, fmt::format("unknown element type '{}' (expected f32, bf16, f16, "
                                   "f8e4m3, f8e5m2 or i32)", tok_.text.str()));
  type = TensorType(*dtype, {});
  Token typeTok = tok_;
  if (auto err = advance())
    return err;
  if (auto err = expect(Tok::LBracket, "'[' after the element type"))
    return err;
  while (tok_.kind != Tok::RBracket) {
    if (!type.shape.empty())
      if (auto err = expect(Tok::Comma, "',' or ']' in the shape"))
        return err;
    if (tok_.kind != Tok::Integer)
      return expected("a dimension");
    int64_t dim = 0;
    auto [ptr, ec] = std::from_chars(tok_.text.begin(), tok_.text.end(), dim);
    if (ec != std::errc() || ptr != tok_.text.end() || dim <= 0 || dim > kMaxDim)
      return error(tok_, fmt::format("dimension '{}' must be an integer in [1, {}]",
                                     tok_.text.str(), kMaxDim));
    if (type.shape.size() == kMaxRank)
      return error(tok_, fmt::format("rank exceeds the limit of {}", kMaxRank));
    type.shape.push_back(dim);
    if (auto err = advance())
      return err;
  }
  if (auto err = checkTypeLimits(type))
    return error(typeTok, llvm::toString(std::move(err)));
  return advance();
}

llvm::Error Parser::parseAttrValue(Attr &value) {
  Token at = tok_;
  switch (tok_.kind) {
  case Tok::Integer: {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(tok_.text.begin(), tok_.text.end(), v);
    if (ec != std::errc() || ptr != tok_.text.end())
      return error(at, fmt::format("integer '{}' out of range", tok_.text.str()));
    value = v;
    return advance();
  }
  case Tok::Float: {
    double v = 0;
    if (tok_.text == "-inf") {
      v = -HUGE_VAL;
    } else {
      auto [ptr, ec] = std::from_chars(tok_.text.begin(), tok_.text.end(), v);
      if (ec != std::errc() || ptr != tok_.text.end())
        return error(at, fmt::format("malformed number '{}'", tok_.text.str()));
    }
    value = v;
    return advance();
  }
  case Tok::String:
    value = tok_.str;
    return advance();
  case Tok::Ident:
    if (tok_.text == "true" || tok_.text == "false")
      value = tok_.text == "true";
    else if (tok_.text == "inf")
      value = HUGE_VAL;
    else if (tok_.text == "nan")
      value = std::nan("");
    else
      return expected("an attribute value");
    return advance();
  case Tok::LBracket: {
    std::vector<int64_t> list;
    if (auto err = advance())
      return err;
    while (tok_.kind != Tok::RBracket) {
      if (!list.empty())
        if (auto err = expect(Tok::Comma, "',' or ']' in the list"))
          return err;
      Attr element;
      Token elementTok = tok_;
      if (tok_.kind == Tok::LBracket) // refused before recursing: no depth to exhaust the stack
        return error(elementTok, "lists hold integers only");
      if (auto err = parseAttrValue(element))
        return err;
      auto *i = std::get_if<int64_t>(&element);
      if (!i)
        return error(elementTok, "lists hold integers only");
      list.push_back(*i);
    }
    value = std::move(list);
    return advance();
  }
  default:
    return expected("an attribute value");
  }
}

llvm::Error Parser::parseAttrs(AttrMap &attrs) {
  if (auto err = advance()) // '{'
    return err;
  while (tok_.kind != Tok::RBrace) {
    if (!attrs.empty())
      if (auto err = expect(Tok::Comma, "',' or '}' in the attributes"))
        return err;
    if (tok_.kind != Tok::Ident)
      return expected("an attribute name");
    Token key = tok_;
    if (attrs.has(key.text))
      return error(key, fmt::format("attribute '{}' given twice", key.text.str()));
    if (auto err = advance())
      return err;
    if (auto err = expect(Tok::Equal, "'=' after the attribute name"))
      return err;
    Attr value;
    if (auto err = parseAttrValue(value))
      return err;
    attrs.set(key.text, std::move(value));
  }
  return advance();
}

llvm::Error Parser::parseStatement(Graph &graph) {
  Token first = tok_;
  llvm::SmallVector<Token, 2> results;
  // An op without results (assign) starts with its name.
  while (tok_.kind != Tok::Ident) {
    if (tok_.kind != Tok::ValueName)
      return expected(results.empty() ? "an op ('%name = op(...) : type') or 'return'"
                                      : "a result name");
    if (graph.lookup(tok_.text) || llvm::any_of(results, [&](const Token &t) {
          return t.text == tok_.text;
        }))
      return error(tok_, fmt::format("redefinition of %{}", tok_.text.str()));
    results.push_back(tok_);
    if (auto err = advance())
      return err;
    if (tok_.kind != Tok::Comma)
      break;
    if (auto err = advance())
      return err;
  }
  if (!results.empty())
    if (auto err = expect(Tok::Equal, "'=' after the result names"))
      return err;
  if (tok_.kind != Tok::Ident)
    return expected("an op name");
  Token opTok = tok_;
  auto kind = parseOpKind(opTok.text);
  if (!kind)
    return error(opTok, fmt::format("unknown op '{}'", opTok.text.str()));
  if (auto err = advance())
    return err;
  if (auto err = expect(Tok::LParen, "'(' after the op name"))
    return err;
  llvm::SmallVector<Value *, 4> operands;
  while (tok_.kind != Tok::RParen) {
    if (!operands.empty())
      if (auto err = expect(Tok::Comma, "',' or ')' in the operands"))
        return err;
    if (tok_.kind != Tok::ValueName)
      return expected("an operand ('%name')");
    Value *v = graph.lookup(tok_.text);
    if (!v)
      return error(tok_, fmt::format("use of undefined value %{}", tok_.text.str()));
    operands.push_back(v);
    if (auto err = advance())
      return err;
  }
  if (auto err = advance())
    return err;
  AttrMap attrs;
  if (tok_.kind == Tok::LBrace)
    if (auto err = parseAttrs(attrs))
      return err;
  llvm::SmallVector<TensorType, 1> types;
  if (!results.empty())
    if (auto err = expect(Tok::Colon, "':' and the result types"))
      return err;
  while (!results.empty()) {
    TensorType type;
    if (auto err = parseType(type))
      return err;
    types.push_back(type);
    if (tok_.kind != Tok::Comma)
      break;
    if (auto err = advance())
      return err;
  }
  if (types.size() != results.size())
    return error(first, fmt::format("{} result names but {} result types", results.size(),
                                    types.size()));
  std::vector<std::string> names;
  for (const Token &t : results)
    names.push_back(t.text.str());
  Op *op = graph.createOp(*kind, operands, std::move(attrs), types, names);
  op->setLoc({first.line, first.column});
  return endOfStatement();
}

llvm::Error Parser::parseReturn(Graph &graph) {
  if (auto err = advance())
    return err;
  while (true) {
    if (tok_.kind != Tok::ValueName)
      return expected("a returned value ('%name')");
    Value *v = graph.lookup(tok_.text);
    if (!v)
      return error(tok_, fmt::format("use of undefined value %{}", tok_.text.str()));
    graph.addOutput(v);
    if (auto err = advance())
      return err;
    if (tok_.kind != Tok::Comma)
      break;
    if (auto err = advance())
      return err;
  }
  if (auto err = endOfStatement())
    return err;
  if (tok_.kind != Tok::Eof)
    return error(tok_, "nothing may follow 'return'");
  return llvm::Error::success();
}

llvm::Expected<std::unique_ptr<Graph>> Parser::parse() {
  if (auto err = advance())
    return std::move(err);
  if (auto err = skipNewlines())
    return std::move(err);
  if (tok_.kind == Tok::Eof)
    return error(tok_, "empty IR: expected 'graph @name'");
  if (tok_.kind != Tok::Ident || tok_.text != "graph")
    return expected("'graph @name' at the start of the IR");
  if (auto err = advance())
    return std::move(err);
  if (tok_.kind != Tok::GraphName)
    return expected("'@name' after 'graph'");
  auto graph = std::make_unique<Graph>(tok_.text.str());
  if (auto err = advance())
    return std::move(err);
  if (auto err = endOfStatement())
    return std::move(err);
  while (true) {
    if (tok_.kind == Tok::Eof)
      return error(tok_, "unexpected end of file: expected an op or 'return' (truncated IR?)");
    if (tok_.kind == Tok::Ident && tok_.text == "return")
      break;
    if (auto err = parseStatement(*graph))
      return std::move(err);
  }
  if (auto err = parseReturn(*graph))
    return std::move(err);
  if (auto err = verify(*graph, file_))
    return std::move(err);
  return std::move(graph);
}

} // namespace

llvm::Expected<std::unique_ptr<Graph>> parseGraph(llvm::StringRef text, llvm::StringRef file) {
  return Parser(text, file).parse();
}

llvm::Expected<std::unique_ptr<Graph>> parseGraphFile(llvm::StringRef path) {
  auto buffer = readFileAtMost(path, kMaxIrFileBytes, "an IR file");
  if (!buffer)
    return buffer.takeError();
  return parseGraph((*buffer)->getBuffer(), path == "-" ? "<stdin>" : path);
}

} // namespace tgc
