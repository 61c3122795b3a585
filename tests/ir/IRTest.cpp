// The IR: text round trips, the builder's type inference, the verifier and parser errors.
#include "ir/Infer.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "models/GPTBuilder.h"
#include "tests/TestUtil.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

using namespace tgc;
using namespace tgc::test;

namespace {

std::vector<std::string> goldenFiles() {
  std::vector<std::string> files;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(sourcePath("tests/golden"), ec), end; it != end && !ec;
       it.increment(ec))
    if (llvm::sys::path::extension(it->path()) == ".ir")
      files.push_back(it->path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(IRText, GoldenFilesRoundTripExactly) {
  std::vector<std::string> files = goldenFiles();
  ASSERT_GE(files.size(), 3u);
  for (const std::string &file : files) {
    SCOPED_TRACE(file);
    auto buffer = llvm::MemoryBuffer::getFile(file);
    ASSERT_TRUE(bool(buffer));
    std::string text = (*buffer)->getBuffer().str();
    auto graph = unwrap(parseGraph(text, file));
    ASSERT_TRUE(graph);
    EXPECT_EQ(printGraph(*graph), text);
  }
}

TEST(IRText, EveryStandardModelRoundTrips) {
  for (const char *name : {"tiny", "seed", "gpt2-124m", "gpt2-350m", "gpt-1.3b"}) {
    SCOPED_TRACE(name);
    auto config = unwrap(loadModelConfig(sourcePath(std::string("models/") + name + ".yaml")));
    auto graph = unwrap(buildGPT(config, config.train.batch));
    ASSERT_TRUE(graph);
    ASSERT_FALSE(bool(verify(*graph))) << "builder output must verify";
    std::string text = printGraph(*graph);
    auto reparsed = unwrap(parseGraph(text, name));
    ASSERT_TRUE(reparsed);
    EXPECT_EQ(printGraph(*reparsed), text);
  }
}

TEST(IRText, FloatAttributesRoundTripBitExactly) {
  for (double v : {0.1, 1e-5, 1.0 / 3.0, 0.125, 1e300, 5e-324, -2.5, 1.0, 0.0, 123456789.0}) {
    std::string text = formatDouble(v);
    EXPECT_NE(text.find_first_of(".e"), std::string::npos) << text;
    double back = std::strtod(text.c_str(), nullptr);
    EXPECT_EQ(back, v) << text;
  }
}

TEST(Builder, InfersTypesAndKeepsUseLists) {
  Graph g("g");
  Builder b(g);
  Value *x = b.input("x", TensorType(DType::F32, {2, 3, 4}));
  Value *w = b.param("w", TensorType(DType::F32, {5, 4}), {});
  AttrMap t;
  t.set("transpose_b", true);
  Value *y = b.create(OpKind::MatMul, {x, w}, t, "y");
  Value *z = b.create(OpKind::Add, {y, y}, {}, "z");
  ASSERT_FALSE(bool(b.takeError()));
  EXPECT_EQ(y->type(), TensorType(DType::F32, {2, 3, 5}));
  EXPECT_EQ(z->type(), y->type());
  EXPECT_EQ(y->users().size(), 2u); // used twice by the same add
  EXPECT_EQ(x->users().size(), 1u);
}

TEST(Builder, ReportsTheFirstTypeErrorAndStops) {
  Graph g("g");
  Builder b(g);
  Value *x = b.input("x", TensorType(DType::F32, {2, 4}));
  Value *w = b.input("w", TensorType(DType::F32, {5, 3}));
  Value *y = b.create(OpKind::MatMul, {x, w}, {}, "y");
  EXPECT_EQ(y, nullptr);
  EXPECT_EQ(b.create(OpKind::Gelu, {y}, {}, "z"), nullptr);
  std::string message = errorOf(b.takeError());
  EXPECT_NE(message.find("contraction dimensions differ: 4 vs 5"), std::string::npos) << message;
}

TEST(Graph, ReplaceAndEraseKeepUsesConsistent) {
  auto g = unwrap(parseGraph("graph @g\n"
                             "%x = input() : f32[4]\n"
                             "%a = gelu(%x) : f32[4]\n"
                             "%b = gelu(%x) : f32[4]\n"
                             "%c = add(%a, %b) : f32[4]\n"
                             "return %c\n",
                             "t"));
  ASSERT_TRUE(g);
  Value *a = g->lookup("a"), *b = g->lookup("b"), *x = g->lookup("x");
  g->replaceAllUsesWith(b, a);
  EXPECT_FALSE(b->hasUses());
  EXPECT_EQ(a->users().size(), 2u);
  g->eraseOp(b->def());
  EXPECT_EQ(g->lookup("b"), nullptr);
  EXPECT_EQ(x->users().size(), 1u);
  EXPECT_FALSE(bool(verify(*g)));
  EXPECT_EQ(g->uniqueName("a"), "a.1");
  EXPECT_EQ(g->uniqueName("fresh"), "fresh");
}

struct BadIR {
  const char *what;
  const char *text;
  const char *message; // expected in the error, after "file:line:col: error: "
  const char *where;
};

class ParserErrors : public testing::TestWithParam<BadIR> {};

TEST_P(ParserErrors, NameThePlaceAndTheProblem) {
  const BadIR &c = GetParam();
  std::string message = errorOf(parseGraph(c.text, "bad.ir"));
  EXPECT_EQ(message.find(std::string("bad.ir:") + c.where + ": error: "), 0u) << message;
  EXPECT_NE(message.find(c.message), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
}

INSTANTIATE_TEST_SUITE_P(
    IR, ParserErrors,
    testing::Values(
        BadIR{"empty", "", "empty IR", "1:1"},
        BadIR{"blank", "\n\n  \n", "empty IR", "4:1"},
        BadIR{"no header", "%x = input() : f32[2]\n", "expected 'graph @name'", "1:1"},
        BadIR{"unknown op", "graph @g\n%x = input() : f32[2]\n%y = frobnicate(%x) : f32[2]\nreturn %y\n",
              "unknown op 'frobnicate'", "3:6"},
        BadIR{"operand count", "graph @g\n%x = input() : f32[2]\n%y = add(%x) : f32[2]\nreturn %y\n",
              "add: expects 2 operands, got 1", "3:1"},
        BadIR{"shape mismatch",
              "graph @g\n%x = input() : f32[2,4]\n%w = input() : f32[3,5]\n"
              "%y = matmul(%x, %w) : f32[2,5]\nreturn %y\n",
              "contraction dimensions differ: 4 vs 3", "4:1"},
        BadIR{"wrong declared type", "graph @g\n%x = input() : f32[2]\n%y = gelu(%x) : f32[3]\nreturn %y\n",
              "result type f32[3] does not match the inferred type f32[2]", "3:1"},
        BadIR{"undefined value", "graph @g\n%y = gelu(%x) : f32[2]\nreturn %y\n",
              "use of undefined value %x", "2:11"},
        BadIR{"redefinition", "graph @g\n%x = input() : f32[2]\n%x = gelu(%x) : f32[2]\nreturn %x\n",
              "redefinition of %x", "3:1"},
        BadIR{"truncated", "graph @g\n%x = input() : f32[2]\n%y = gelu(%x) : f3",
              "unknown element type 'f3'", "3:17"},
        BadIR{"truncated before return", "graph @g\n%x = input() : f32[2]\n%y = gelu(%x) : f32[2]\n",
              "unexpected end of file", "4:1"},
        BadIR{"binary garbage", "graph @g\n\x7f\x45\x4c\x46\x02\x01\x01\x00", "unexpected byte 0x7f",
              "2:1"},
        BadIR{"negative dimension", "graph @g\n%x = input() : f32[2,-4]\nreturn %x\n",
              "dimension '-4' must be an integer in [1, 2147483647]", "2:22"},
        BadIR{"absurd dimension", "graph @g\n%x = input() : f32[99999999999]\nreturn %x\n",
              "dimension '99999999999' must be an integer", "2:20"},
        BadIR{"too many elements",
              "graph @g\n%x = input() : f32[2000000,2000000]\nreturn %x\n",
              "has more than 1099511627776 elements", "2:16"},
        BadIR{"missing attribute", "graph @g\n%x = input() : f32[2]\n%y = scale(%x) : f32[2]\nreturn %y\n",
              "missing float attribute 'factor'", "3:1"},
        BadIR{"bad perm",
              "graph @g\n%x = input() : f32[2,3]\n%y = transpose(%x) {perm=[0,0]} : f32[2,2]\nreturn %y\n",
              "perm [0,0] is not a permutation", "3:1"},
        BadIR{"unterminated string", "graph @g\n%w = param() {init=\"normal} : f32[2]\nreturn %w\n",
              "unterminated string", "2:20"},
        BadIR{"junk after return", "graph @g\n%x = input() : f32[2]\nreturn %x\n%y = gelu(%x) : f32[2]\n",
              "nothing may follow 'return'", "4:1"},
        BadIR{"missing colon", "graph @g\n%x = input() f32[2]\nreturn %x\n",
              "expected ':' and the result types, found identifier 'f32'", "2:14"},
        BadIR{"quantize of a GELU's gradient without h",
              "graph @g\n%x = input() : f32[2,4]\n%s = input() : f32[]\n"
              "%q, %a, %n = quantize(%x, %s, %s) {activation=\"gelu_backward\", format=\"e5m2\"} : "
              "f8e5m2[2,4], f32[], f32[]\nreturn %q\n",
              "activation=\"gelu_backward\" takes four operands (x, scale, scale_inv, h), got 3", "4:1"},
        BadIR{"quantize of the loss's gradient without its targets",
              "graph @g\n%x = input() : f32[2,4]\n%s = input() : f32[]\n"
              "%q, %a, %n, %l = quantize(%x, %s, %s) {activation=\"cross_entropy_backward\", format=\"e5m2\"} : "
              "f8e5m2[2,4], f32[], f32[], f32[]\nreturn %q\n",
              "activation=\"cross_entropy_backward\" takes five operands (logits, scale, scale_inv, targets, "
              "dloss), got 3", "4:1"},
        BadIR{"quantize of the loss's gradient with targets of another shape",
              "graph @g\n%x = input() : f32[2,4]\n%t = input() : i32[4]\n%s = input() : f32[]\n"
              "%q, %a, %n, %l = quantize(%x, %s, %s, %t, %s) {activation=\"cross_entropy_backward\", "
              "format=\"e5m2\"} : f8e5m2[2,4], f32[], f32[], f32[]\nreturn %q\n",
              "targets must be i32[2], got i32[4]", "5:1"},
        BadIR{"quantize of a SwiGLU whose h has an odd last dimension",
              "graph @g\n%h = input() : f32[4,7]\n%s = input() : f32[]\n"
              "%q, %a, %n = quantize(%h, %s, %s) {activation=\"swiglu\", format=\"e4m3\"} : "
              "f8e4m3[4,3], f32[], f32[]\nreturn %q\n",
              "swiglu's h needs an even last dimension, got f32[4,7]", "4:1"},
        BadIR{"quantize of SwiGLU's gradient whose dy is not h's half",
              "graph @g\n%dy = input() : f32[4,4]\n%h = input() : f32[4,6]\n%s = input() : f32[]\n"
              "%q, %a, %n = quantize(%dy, %s, %s, %h) {activation=\"swiglu_backward\", format=\"e5m2\"} : "
              "f8e5m2[4,6], f32[], f32[]\nreturn %q\n",
              "dy must be h's half (f32[4,3]), got f32[4,4]", "5:1"},
        BadIR{"quantize's h of another shape",
              "graph @g\n%x = input() : f32[2,4]\n%h = input() : f32[4,2]\n%s = input() : f32[]\n"
              "%q, %a, %n = quantize(%x, %s, %s, %h) {activation=\"gelu_backward\", format=\"e5m2\"} : "
              "f8e5m2[2,4], f32[], f32[]\nreturn %q\n",
              "h must have the type of x (f32[2,4]), got f32[4,2]", "5:1"},
        BadIR{"quantize's bias gradient of a GELU",
              "graph @g\n%x = input() : f32[2,4]\n%s = input() : f32[]\n"
              "%q, %a, %n, %d = quantize(%x, %s, %s) {activation=\"gelu\", bias_grad=true, format=\"e5m2\"} : "
              "f8e5m2[2,4], f32[], f32[], f32[4]\nreturn %q\n",
              "bias_grad=true sums x or gelu_backward(x, h), not gelu(x), SwiGLU or its gradient, or the loss's "
              "gradient: drop "
              "activation=\"gelu\"", "4:1"},
        BadIR{"a shard of another size than its whole's part",
              "graph @g\n%w = param() {init=\"zeros\", rank=1, ranks=4, whole=[10,3]} : f32[7]\nreturn %w\n",
              "a shard of 30 elements over 4 ranks is f32[8], got f32[7]", "2:1"},
        BadIR{"a shard of a rank past the ranks",
              "graph @g\n%w = param() {init=\"zeros\", rank=4, ranks=4, whole=[10,3]} : f32[8]\nreturn %w\n",
              "needs attribute rank in [0, ranks = 4)", "2:1"}));

TEST(Verifier, CatchesUseBeforeDefinitionAfterABadRewrite) {
  auto g = unwrap(parseGraph("graph @g\n%x = input() : f32[4]\n%a = gelu(%x) : f32[4]\n"
                             "%b = gelu(%a) : f32[4]\nreturn %b\n",
                             "t"));
  ASSERT_TRUE(g);
  // Make %a read %b, which is defined below it.
  g->lookup("a")->def()->setOperand(0, g->lookup("b"));
  std::string message = errorOf(verify(*g, "t"));
  EXPECT_NE(message.find("operand %b is used before it is defined"), std::string::npos) << message;
}

} // namespace

TEST(IRText, MessagesQuotingInputStayOneShortLine) {
  EXPECT_EQ(escapeForMessage("a\x1b[31mb\nc"), "a\\x1b[31mb\\nc");
  std::string huge(10 << 20, 'x');
  std::string shown = escapeForMessage(huge);
  EXPECT_LT(shown.size(), 2100u);
  EXPECT_NE(shown.find("(10483760 more bytes not shown)"), std::string::npos) << shown.substr(1990);
}
