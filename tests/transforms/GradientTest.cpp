// Every gradient rule against central finite differences on fresh random inputs, op by op and
// for whole models. The interpreter computes in fp32, so the bounds fit fp32 differences.
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "transforms/Pass.h"
#include "app/Init.h"
#include "backends/cpu/Interpreter.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <cmath>

using namespace tgc;
using namespace tgc::test;

namespace {

struct GradCase {
  const char *name;
  const char *body; // ops reading params (%p*, %q*) and int inputs (%ids, %t); defines %y
  const char *yType;
  double eps = 1e-2;
};

/// Values for every leaf of the differentiated graph: params ~ N(0, 1) (or the init's), ids and
/// targets uniform below the smallest table/logit width they index.
std::map<std::string, Tensor> randomLeaves(const Graph &g, Rng &rng) {
  std::map<std::string, Tensor> leaves = initParams(g, rng.next());
  for (const Op *op : g.ops()) {
    if (op->kind() != OpKind::Input)
      continue;
    Tensor t = Tensor::zeros(op->result()->type());
    for (float &v : t.data)
      v = float(rng.normal());
    for (int32_t &v : t.ints)
      v = int32_t(rng.below(5)); // every table and vocab in the cases has at least 5 rows
    leaves[op->result()->name()] = std::move(t);
  }
  return leaves;
}

double lossOf(const Graph &g, const std::map<std::string, Tensor> &leaves) {
  Interpreter interp(g);
  EXPECT_FALSE(bool(interp.bindAll(leaves)));
  auto outputs = unwrap(interp.run());
  return outputs.empty() ? NAN : outputs[0].data[0];
}

/// Differentiates `graph` (first output: scalar loss) and compares every parameter's
/// gradient with central differences at `samples` random coordinates.
void checkGradients(Graph &graph, Rng &rng, double eps, double rel, double abs, int samples,
                    std::map<std::string, Tensor> leaves, bool extrapolate = false) {
  auto pipeline = unwrap(PassPipeline::create({"autodiff"}, {}));
  ASSERT_FALSE(bool(pipeline.run(graph))) << printGraph(graph);
  Interpreter interp(graph);
  ASSERT_FALSE(bool(interp.bindAll(leaves)));
  auto outputs = unwrap(interp.run());
  ASSERT_EQ(outputs.size(), graph.outputs().size());
  int checked = 0;
  for (size_t o = 1; o < graph.outputs().size(); ++o) {
    std::string gradName = graph.outputs()[o]->name();
    std::string param = gradName.substr(0, gradName.size() - 5); // strip ".grad"
    const Tensor &analytic = outputs[o];
    for (int s = 0; s < samples; ++s) {
      size_t i = rng.below(analytic.data.size());
      auto central = [&](double e) {
        auto plus = leaves, minus = leaves;
        plus[param].data[i] += float(e);
        minus[param].data[i] -= float(e);
        return (lossOf(graph, plus) - lossOf(graph, minus)) / (2 * e);
      };
      // EXTRAPOLATE (the models): Richardson's, the central difference's eps^2 term cancelled,
      // so a strongly curved loss (a saturated softmax: the central difference off by 14% at eps
      // 3e-3, 1.6% at 1e-3) needs no smaller eps, whose fp32 rounding would grow instead. Not
      // for the single ops, whose larger eps and values leave fp32 rounding the larger error
      // (which the extrapolation would amplify).
      double numeric = extrapolate ? (4 * central(eps / 2) - central(eps)) / 3 : central(eps);
      double a = analytic.data[i];
      EXPECT_NEAR(a, numeric, rel * std::max(std::abs(a), std::abs(numeric)) + abs)
          << param << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

class OpGradients : public testing::TestWithParam<GradCase> {};

TEST_P(OpGradients, MatchFiniteDifferences) {
  const GradCase &c = GetParam();
  // loss = sum(y * r) with a random r, so every element of y gets its own weight.
  std::string text = std::string("graph @grad\n") + c.body + "%r = input() : " + c.yType +
                     "\n%yr = mul(%y, %r) : " + c.yType +
                     "\n%loss = reduce_to(%yr) {shape=[]} : f32[]\nreturn %loss\n";
  auto graph = unwrap(parseGraph(text, c.name));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  auto leaves = randomLeaves(*graph, rng);
  checkGradients(*graph, rng, c.eps, 2e-2, 2e-3, 6, leaves);
}

#define P(name, type) "%" name " = param() {init=\"normal\", std=1.0} : " type "\n"
// A parameter of a smaller spread: the two-product ops' outputs (and so the loss) stay small
// enough that the fp32 loss's rounding, over a central difference of eps 3e-3, stays below
// the bound (with std 1 it came to 0.006 in 1% of the seeds).
#define PS(name, type, std) "%" name " = param() {init=\"normal\", std=" std "} : " type "\n"

INSTANTIATE_TEST_SUITE_P(
    Ops, OpGradients,
    testing::Values(
        GradCase{"embedding", P("p", "f32[7,5]") "%ids = input() : i32[2,3]\n"
                 "%y = embedding(%p, %ids) : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul", P("p", "f32[2,3,4]") P("q", "f32[4,5]")
                 "%y = matmul(%p, %q) : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_tb", P("p", "f32[2,3,4]") P("q", "f32[5,4]")
                 "%y = matmul(%p, %q) {transpose_b=true} : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_ta", P("p", "f32[2,4,3]") P("q", "f32[4,5]")
                 "%y = matmul(%p, %q) {transpose_a=true} : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_ta_tb", P("p", "f32[2,4,3]") P("q", "f32[5,4]")
                 "%y = matmul(%p, %q) {transpose_a=true, transpose_b=true} : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_batched", P("p", "f32[2,3,4]") P("q", "f32[2,4,5]")
                 "%y = matmul(%p, %q) : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_batched_tb", P("p", "f32[2,3,4]") P("q", "f32[2,5,4]")
                 "%y = matmul(%p, %q) {transpose_b=true} : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_bias", P("p", "f32[2,3,4]") P("q", "f32[5,4]") P("b", "f32[5]")
                 "%y = matmul_bias(%p, %q, %b) : f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"matmul_bias_gelu", P("p", "f32[2,3,4]") P("q", "f32[5,4]") P("b", "f32[5]")
                 "%y, %pre = matmul_bias_gelu(%p, %q, %b) : f32[2,3,5], f32[2,3,5]\n", "f32[2,3,5]"},
        GradCase{"add_broadcast", P("p", "f32[2,3,4]") P("q", "f32[3,4]")
                 "%y = add(%p, %q) : f32[2,3,4]\n", "f32[2,3,4]"},
        GradCase{"mul_broadcast", P("p", "f32[2,3,4]") P("q", "f32[4]")
                 "%y = mul(%p, %q) : f32[2,3,4]\n", "f32[2,3,4]"},
        GradCase{"mul_same_value", P("p", "f32[6]") "%y = mul(%p, %p) : f32[6]\n", "f32[6]"},
        GradCase{"scale", P("p", "f32[6]") "%y = scale(%p) {factor=-1.5} : f32[6]\n", "f32[6]"},
        GradCase{"gelu", P("p", "f32[3,5]") "%y = gelu(%p) : f32[3,5]\n", "f32[3,5]"},
        GradCase{"silu", P("p", "f32[3,5]") "%y = silu(%p) : f32[3,5]\n", "f32[3,5]"},
        GradCase{"rope", P("p", "f32[2,3,5,6]") "%y = rope(%p) {theta=100.0} : f32[2,3,5,6]\n", "f32[2,3,5,6]"},
        GradCase{"rope_inverse", P("p", "f32[7,4]") "%y = rope(%p) {inverse=true, theta=10000.0} : f32[7,4]\n",
                 "f32[7,4]"},
        GradCase{"layer_norm", P("p", "f32[3,6]") P("q", "f32[6]") P("b", "f32[6]")
                 "%y = layer_norm(%p, %q, %b) {eps=1e-05} : f32[3,6]\n", "f32[3,6]", 3e-3},
        GradCase{"rms_norm", P("p", "f32[3,6]") P("q", "f32[6]")
                 "%y = rms_norm(%p, %q) {eps=1e-05} : f32[3,6]\n", "f32[3,6]", 3e-3},
        GradCase{"reshape", P("p", "f32[2,6]") "%y = reshape(%p) {shape=[3,4]} : f32[3,4]\n", "f32[3,4]"},
        GradCase{"transpose", P("p", "f32[2,3,4]")
                 "%y = transpose(%p) {perm=[2,0,1]} : f32[4,2,3]\n", "f32[4,2,3]"},
        GradCase{"slice", P("p", "f32[2,9]") "%y = slice(%p) {axis=1, size=4, start=3} : f32[2,4]\n",
                 "f32[2,4]"},
        GradCase{"concat", P("p", "f32[2,3]") P("q", "f32[2,4]")
                 "%y = concat(%p, %q, %p) {axis=1} : f32[2,10]\n", "f32[2,10]"},
        GradCase{"causal_softmax", P("p", "f32[2,4,4]")
                 "%m = causal_mask(%p) : f32[2,4,4]\n%y = softmax(%m) : f32[2,4,4]\n", "f32[2,4,4]"},
        GradCase{"masked_softmax", P("p", "f32[2,4,4]")
                 "%y = masked_softmax(%p) {scale=0.7} : f32[2,4,4]\n", "f32[2,4,4]"},
        GradCase{"softmax", P("p", "f32[3,5]") "%y = softmax(%p) : f32[3,5]\n", "f32[3,5]"},
        GradCase{"log_softmax", P("p", "f32[3,5]") "%y = log_softmax(%p) : f32[3,5]\n", "f32[3,5]"},
        GradCase{"nll_loss", P("p", "f32[2,3,5]") "%t = input() : i32[2,3]\n"
                 "%lp = log_softmax(%p) : f32[2,3,5]\n%y = nll_loss(%lp, %t) : f32[]\n", "f32[]"},
        GradCase{"reduce_to", P("p", "f32[2,3,4]") "%y = reduce_to(%p) {shape=[3,4]} : f32[3,4]\n",
                 "f32[3,4]"},
        // The fused ops' rules (their gradient ops) against finite differences too.
        GradCase{"layer_norm_linear", P("p", "f32[2,3,6]") P("q", "f32[6]") P("b", "f32[6]")
                 P("w", "f32[5,6]") P("c", "f32[5]")
                 "%y = layer_norm_linear(%p, %q, %b, %w, %c) {bias=true, eps=1e-05, norm=\"layer_norm\"} : f32[2,3,5]\n",
                 "f32[2,3,5]", 3e-3},
        GradCase{"layer_norm_mlp_gelu", P("p", "f32[2,3,6]") P("q", "f32[6]") P("b", "f32[6]")
                 PS("w1", "f32[8,6]", "0.4") P("b1", "f32[8]") PS("w2", "f32[6,8]", "0.4") P("b2", "f32[6]")
                 "%y, %h = layer_norm_mlp(%p, %q, %b, %w1, %b1, %w2, %b2) {activation=\"gelu\", bias=true, eps=1e-05, norm=\"layer_norm\"} : f32[2,3,6], f32[2,3,8]\n",
                 "f32[2,3,6]", 3e-3},
        GradCase{"layer_norm_mlp_swiglu", P("p", "f32[2,3,6]") P("q", "f32[6]") PS("w1", "f32[8,6]", "0.4")
                 PS("w2", "f32[6,4]", "0.4")
                 "%y, %h = layer_norm_mlp(%p, %q, %w1, %w2) {activation=\"swiglu\", bias=false, eps=1e-05, norm=\"rms_norm\"} : f32[2,3,6], f32[2,3,8]\n",
                 "f32[2,3,6]", 3e-3}),
    [](const testing::TestParamInfo<GradCase> &info) { return std::string(info.param.name); });

TEST(FusedGradients, LayerNormMLPWhoseFc1OutputIsReadElsewhereIsAnError) {
  // The h a layer_norm_mlp returns is for its gradient; a loss through it has no rule (the
  // fusion never builds one), and autodiff says so rather than dropping that gradient.
  auto graph = unwrap(parseGraph(R"(graph @g
%x = param() {init="normal", std=1.0} : f32[2,3,6]
%q = param() {init="ones"} : f32[6]
%w1 = param() {init="normal", std=1.0} : f32[8,6]
%w2 = param() {init="normal", std=1.0} : f32[6,8]
%y, %h = layer_norm_mlp(%x, %q, %w1, %w2) {activation="gelu", bias=false, eps=1e-05, norm="rms_norm"} : f32[2,3,6], f32[2,3,8]
%loss = reduce_to(%h) {shape=[]} : f32[]
return %loss
)", "g"));
  ASSERT_TRUE(graph);
  auto pipeline = unwrap(PassPipeline::create({"autodiff"}, {}));
  std::string message = llvm::toString(pipeline.run(*graph));
  EXPECT_NE(message.find("no gradient rule for layer_norm_mlp when another op reads its fc1 output %h"),
            std::string::npos)
      << message;
}

/// A small model of each shape option, all parameters randomised, checked end to end.
void checkModel(NormKind norm, ActivationKind act, bool tie, bool bias,
                PositionKind position = PositionKind::Learned, int64_t kvHeads = 0) {
  ModelConfig c;
  c.name = "grad";
  c.vocab = 11;
  c.seqLen = 6;
  c.dModel = 8;
  c.heads = 2;
  c.layers = 2;
  c.ffn = 12;
  c.norm = norm;
  c.activation = act;
  c.tieEmbeddings = tie;
  c.bias = bias;
  c.position = position;
  c.ropeTheta = 50.0; // (angles that turn far within six positions)
  c.kvHeads = kvHeads;
  auto graph = unwrap(buildGPT(c, 2));
  ASSERT_TRUE(graph);
  Rng rng(freshSeed());
  std::map<std::string, Tensor> leaves = initParams(**&graph, rng.next());
  for (auto &[name, t] : leaves)
    for (float &v : t.data)
      v += float(rng.normal() * 0.3);
  for (const char *input : {"tokens", "targets"}) {
    Tensor t = Tensor::zeros(TensorType(DType::I32, {2, 6}));
    for (int32_t &v : t.ints)
      v = int32_t(rng.below(11));
    leaves[input] = t;
  }
  checkGradients(*graph, rng, 3e-3, 3e-2, 3e-4, 3, leaves, /*extrapolate=*/true);
}

TEST(ModelGradients, LayerNormGeluUntiedWithBias) {
  checkModel(NormKind::LayerNorm, ActivationKind::Gelu, false, true);
}
TEST(ModelGradients, RMSNormSwiGLUTiedWithoutBias) {
  checkModel(NormKind::RMSNorm, ActivationKind::SwiGLU, true, false);
}
TEST(ModelGradients, LlamaBlockWithRopeAndOneKeyValueHead) {
  // RoPE on q and k, and both query heads reading one KV head (multi-query attention).
  checkModel(NormKind::RMSNorm, ActivationKind::SwiGLU, false, false, PositionKind::Rope, 1);
}
TEST(ModelGradients, GroupedQueryAttentionWithLearnedPositions) {
  checkModel(NormKind::LayerNorm, ActivationKind::Gelu, false, true, PositionKind::Learned, 1);
}

} // namespace
