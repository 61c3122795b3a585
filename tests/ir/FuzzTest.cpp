// Mutation fuzzing of the two parsers (IR text, model YAML): every mutant either parses (and
// then round-trips) or gives one error line. Never a crash or a hang.
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "models/GPTBuilder.h"
#include "models/ModelConfig.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

using namespace tgc;
using namespace tgc::test;

namespace {

std::string mutate(const std::string &text, Rng &rng) {
  std::string s = text;
  int edits = 1 + int(rng.below(4));
  for (int e = 0; e < edits && !s.empty(); ++e) {
    size_t pos = rng.below(s.size());
    switch (rng.below(6)) {
    case 0: s[pos] = char(rng.below(256)); break;                     // random byte
    case 1: s.erase(pos, 1 + rng.below(16)); break;                   // delete a run
    case 2: s.resize(pos); break;                                     // truncate
    case 3: s.insert(pos, 1, "%@[]{}(),=:\"-.0123456789e\n#"[rng.below(26)]); break;
    case 4: s.insert(pos, s.substr(rng.below(s.size()), 1 + rng.below(40))); break; // duplicate
    case 5: s[pos] = char('0' + rng.below(10)); break;                // digit change
    }
  }
  return s;
}

TEST(Fuzz, IRParserSurvivesMutants) {
  auto config = unwrap(loadModelConfig(sourcePath("models/tiny.yaml")));
  auto graph = unwrap(buildGPT(config, 2));
  ASSERT_TRUE(graph);
  std::string text = printGraph(*graph);
  Rng rng(freshSeed());
  int parsed = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string mutant = mutate(text, rng);
    auto result = parseGraph(mutant, "mutant.ir");
    if (!result) {
      std::string m = llvm::toString(result.takeError());
      ASSERT_EQ(m.find("mutant.ir:"), 0u) << m;
      ASSERT_EQ(m.find('\n'), std::string::npos) << m;
      continue;
    }
    ++parsed;
    std::string printed = printGraph(**result);
    auto again = parseGraph(printed, "printed.ir");
    ASSERT_TRUE(bool(again)) << llvm::toString(again.takeError());
    ASSERT_EQ(printGraph(**again), printed);
  }
  std::cout << parsed << " of 1500 mutants still parsed\n";
}

TEST(Fuzz, ModelParserSurvivesMutants) {
  std::string text = readSource("models/seed.yaml");
  ASSERT_FALSE(text.empty());
  Rng rng(freshSeed());
  for (int i = 0; i < 1500; ++i) {
    std::string mutant = mutate(text, rng);
    auto result = parseModelConfig(mutant, "mutant.yaml");
    if (!result) {
      std::string m = llvm::toString(result.takeError());
      ASSERT_EQ(m.find("mutant.yaml"), 0u) << m;
      ASSERT_EQ(m.find('\n'), std::string::npos) << m;
    }
  }
}

} // namespace
