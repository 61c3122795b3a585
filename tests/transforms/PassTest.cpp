// The pass pipeline: verification after every pass, dumps, disabling, and the cse/dce passes.
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "transforms/Pass.h"
#include "transforms/Rewrite.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

const char *kRedundant = "graph @g\n"
                         "%x = input() : f32[4]\n"
                         "%a = gelu(%x) : f32[4]\n"
                         "%b = gelu(%x) : f32[4]\n"
                         "%dead = scale(%a) {factor=2.0} : f32[4]\n"
                         "%c = add(%a, %b) : f32[4]\n"
                         "return %c\n";

TEST(Pipeline, CseThenDceRemovesTheDuplicateAndTheDeadOp) {
  auto g = unwrap(parseGraph(kRedundant, "t"));
  ASSERT_TRUE(g);
  auto pipeline = unwrap(PassPipeline::create({"cse", "dce"}, {}));
  ASSERT_FALSE(bool(pipeline.run(*g)));
  EXPECT_EQ(printGraph(*g), "graph @g\n"
                            "%x = input() : f32[4]\n"
                            "%a = gelu(%x) : f32[4]\n"
                            "%c = add(%a, %a) : f32[4]\n"
                            "return %c\n");
}

TEST(Pipeline, DumpAfterPrintsTheNamedPassOnly) {
  auto g = unwrap(parseGraph(kRedundant, "t"));
  ASSERT_TRUE(g);
  std::string dump;
  llvm::raw_string_ostream os(dump);
  PipelineOptions options;
  options.dumpAfter = {"dce"};
  options.dumpStream = &os;
  auto pipeline = unwrap(PassPipeline::create({"cse", "dce"}, options));
  ASSERT_FALSE(bool(pipeline.run(*g)));
  os.flush();
  EXPECT_EQ(dump.find("IR after cse"), std::string::npos);
  EXPECT_EQ(dump.find("// ----- IR after dce -----\ngraph @g\n"), 0u) << dump;
}

TEST(Pipeline, DisabledPassesDoNotRun) {
  auto g = unwrap(parseGraph(kRedundant, "t"));
  ASSERT_TRUE(g);
  PipelineOptions options;
  options.disabled = {"cse"};
  auto pipeline = unwrap(PassPipeline::create({"cse", "dce"}, options));
  EXPECT_EQ(pipeline.passNames(), std::vector<std::string>{"dce"});
  ASSERT_FALSE(bool(pipeline.run(*g)));
  EXPECT_NE(g->lookup("b"), nullptr);
  EXPECT_EQ(g->lookup("dead"), nullptr);
}

TEST(Pipeline, UnknownPassNamesAreErrors) {
  std::string m = errorOf(PassPipeline::create({"cse", "fuse-everything"}, {}));
  EXPECT_NE(m.find("unknown pass 'fuse-everything' (passes: cse, dce"), std::string::npos) << m;
  PipelineOptions options;
  options.disabled = {"nope"};
  EXPECT_NE(errorOf(PassPipeline::create({}, options)).find("unknown pass 'nope'"),
            std::string::npos);
  options = {};
  options.dumpAfter = {"nope"};
  EXPECT_NE(errorOf(PassPipeline::create({}, options)).find("unknown pass 'nope'"),
            std::string::npos);
}

/// A deliberately wrong pass: it rewires an operand to a value of another shape.
class BreakShapes : public Pass {
public:
  llvm::StringRef name() const override { return "break-shapes"; }
  llvm::StringRef description() const override { return "test only"; }
  llvm::Expected<bool> run(Graph &g) override {
    g.lookup("c")->def()->setOperand(1, g.lookup("y"));
    return true;
  }
};

TEST(Pipeline, VerifiesAfterEveryPassAndNamesTheCulprit) {
  auto g = unwrap(parseGraph("graph @g\n%x = input() : f32[4]\n%y = input() : f32[3]\n"
                             "%c = add(%x, %x) : f32[4]\nreturn %c\n",
                             "t"));
  ASSERT_TRUE(g);
  auto pipeline = unwrap(PassPipeline::create({}, {}));
  pipeline.addPass(std::make_unique<BreakShapes>());
  std::string m = errorOf(pipeline.run(*g));
  EXPECT_NE(m.find("pass break-shapes produced an invalid graph"), std::string::npos) << m;
  EXPECT_NE(m.find("shape mismatch"), std::string::npos) << m;
}

TEST(Pipeline, OpCountsByKind) {
  auto g = unwrap(parseGraph(kRedundant, "t"));
  ASSERT_TRUE(g);
  OpCounts counts = countOps(*g);
  EXPECT_EQ(counts["gelu"], 2);
  EXPECT_EQ(counts["input"], 1);
  EXPECT_EQ(counts["add"], 1);
  std::string table;
  llvm::raw_string_ostream os(table);
  printOpCountTable(counts, {{"gelu", 1}}, os);
  os.flush();
  EXPECT_NE(table.find("gelu"), std::string::npos);
  EXPECT_NE(table.find("total                            5         1"), std::string::npos)
      << table;
}

} // namespace

namespace {

/// A pattern that matches its own output forever: gelu(x) -> gelu(x).
class EndlessRewrite : public FusionPass {
public:
  llvm::StringRef name() const override { return "endless"; }
  llvm::StringRef description() const override { return "test only"; }
  std::optional<FusionMatch> match(const Graph &, Op *root) const override {
    if (root->kind() != OpKind::Gelu)
      return std::nullopt;
    FusionMatch m;
    m.pattern = {root};
    m.replacement.kind = OpKind::Gelu;
    m.replacement.operands = {root->operand(0)};
    m.replacement.replaces = {root->result()};
    return m;
  }
};

TEST(RewriteDriver, StopsALoopingPatternWithAnError) {
  auto g = unwrap(parseGraph("graph @g\n%x = input() : f32[4]\n%y = gelu(%x) : f32[4]\nreturn %y\n", "t"));
  ASSERT_TRUE(g);
  EndlessRewrite pass;
  std::string m = errorOf(pass.run(*g));
  EXPECT_NE(m.find("endless did not reach a fixed point after"), std::string::npos) << m;
}

TEST(RewriteDriver, ReplacementKeepsNamesAndOrder) {
  // The fused op takes the replaced value's name and lands where its operands are defined.
  auto g = unwrap(parseGraph("graph @g\n%logits = input() : f32[2,5]\n%t = input() : i32[2]\n"
                             "%logp = log_softmax(%logits) : f32[2,5]\n"
                             "%loss = nll_loss(%logp, %t) : f32[]\nreturn %loss\n",
                             "t"));
  ASSERT_TRUE(g);
  auto pipeline = unwrap(PassPipeline::create({"fuse-cross-entropy"}, {}));
  ASSERT_FALSE(bool(pipeline.run(*g)));
  EXPECT_EQ(printGraph(*g), "graph @g\n%logits = input() : f32[2,5]\n%t = input() : i32[2]\n"
                            "%loss = cross_entropy(%logits, %t) : f32[]\nreturn %loss\n");
}

TEST(ConcatPads, GivesTheValuesOfThePadsAndAdds) {
  // Three pads tiling the last axis in shuffled order, summed: concat gives the same numbers.
  const char *text = "graph @g\n"
                     "%a = input() : f32[2,3,2]\n"
                     "%b = input() : f32[2,3,1]\n"
                     "%c = input() : f32[2,3,3]\n"
                     "%pa = pad(%a) {axis=2, size=6, start=1} : f32[2,3,6]\n"
                     "%pc = pad(%c) {axis=2, size=6, start=3} : f32[2,3,6]\n"
                     "%pb = pad(%b) {axis=2, size=6, start=0} : f32[2,3,6]\n"
                     "%ac = add(%pa, %pc) : f32[2,3,6]\n"
                     "%sum = add(%ac, %pb) : f32[2,3,6]\n"
                     "return %sum\n";
  auto padded = unwrap(parseGraph(text, "t")), joined = unwrap(parseGraph(text, "t"));
  ASSERT_TRUE(padded && joined);
  auto pipeline = unwrap(PassPipeline::create({"concat-pads", "dce"}, {}));
  ASSERT_FALSE(bool(pipeline.run(*joined)));
  ASSERT_EQ(countOps(*joined)["concat"], 1);
  EXPECT_EQ(countOps(*joined)["pad"], 0);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> inputs;
  for (const char *name : {"a", "b", "c"}) {
    Tensor t = Tensor::zeros(padded->lookup(name)->type());
    for (float &v : t.data)
      v = float(rng.normal());
    inputs[name] = std::move(t);
  }
  Interpreter before(*padded), after(*joined);
  ASSERT_FALSE(bool(before.bindAll(inputs)));
  ASSERT_FALSE(bool(after.bindAll(inputs)));
  std::vector<float> want = unwrap(before.run()).at(0).data, got = unwrap(after.run()).at(0).data;
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[1], inputs["a"].data[0]); // row 0: b, a a, c c c
  EXPECT_EQ(got[0], inputs["b"].data[0]);
}

} // namespace
