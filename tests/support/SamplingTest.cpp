// Sampling's definition (support/Sampling.h), which the CPU's sample op and the GPU's kernels
// share: its exp, what top-k and top-p keep, and that its draws follow the kept tokens'
// probabilities.
#include "support/Sampling.h"
#include "tests/TestUtil.h"

#include <cmath>
#include <gtest/gtest.h>
#include <limits>
#include <map>
#include <vector>

using namespace tgc;

namespace {

TEST(Sampling, ExpIsWithinTwoUlpsOverTheWeightsDomain) {
  for (double x = -699.99; x <= 0; x += 0.0137) {
    double want = std::exp(x), got = samplingExp(x);
    EXPECT_LE(std::fabs(got - want), 2 * (std::nextafter(want, 1e300) - want)) << "x = " << x;
  }
  EXPECT_EQ(samplingExp(0.0), 1.0);
  EXPECT_EQ(samplingExp(-800.0), 0.0);
  EXPECT_EQ(samplingExp(std::nan("")), 0.0);
}

TEST(Sampling, KeysFollowTheLogitsOrder) {
  std::vector<float> ordered = {-std::numeric_limits<float>::infinity(), -3.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f,
                                std::numeric_limits<float>::infinity()};
  for (size_t i = 1; i < ordered.size(); ++i)
    EXPECT_LE(samplingKey(ordered[i - 1]), samplingKey(ordered[i])) << ordered[i];
  EXPECT_LT(samplingKey(-3.5f), samplingKey(2.0f));
  EXPECT_EQ(samplingKey(std::nanf("")), 0u);
}

/// How often each token is drawn from `logits` over `draws` counters.
std::map<int32_t, int> histogram(const std::vector<float> &logits, const SamplingParams &params, int draws) {
  std::map<int32_t, int> counts;
  for (int counter = 0; counter < draws; ++counter)
    ++counts[sampleRow(logits.data(), int64_t(logits.size()), params, 3, counter)];
  return counts;
}

TEST(Sampling, DrawsFollowTheTemperaturesProbabilities) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.0f, 2.0f, -1.0f, 3.0f};
  for (float temperature : {0.5f, 1.0f, 2.0f}) {
    SCOPED_TRACE(temperature);
    SamplingParams params;
    params.temperature = temperature;
    params.seed = 12345;
    const int draws = 40000;
    std::map<int32_t, int> counts = histogram(logits, params, draws);
    double total = 0;
    for (float l : logits)
      total += std::exp((l - 3.0) / temperature);
    for (size_t i = 0; i < logits.size(); ++i) {
      double p = std::exp((logits[i] - 3.0) / temperature) / total;
      double sigma = std::sqrt(draws * p * (1 - p));
      EXPECT_NEAR(counts[int32_t(i)], draws * p, 5 * sigma + 1) << "token " << i;
    }
  }
}

TEST(Sampling, TopKAndTopPKeepTheMostLikelyTokens) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.0f, 2.0f, -1.0f, 3.0f, 2.5f};
  SamplingParams params;
  params.temperature = 1.0f;
  params.topK = 3; // 3.0 and both 2.5s
  std::map<int32_t, int> counts = histogram(logits, params, 3000);
  EXPECT_EQ(counts.size(), 3u);
  for (int32_t token : {5, 1, 6})
    EXPECT_GT(counts[token], 500) << token;
  params.topK = 2; // the 2.5s tie at the second place: both kept
  EXPECT_EQ(histogram(logits, params, 3000).size(), 3u);
  params.topK = 1;
  EXPECT_EQ(histogram(logits, params, 500), (std::map<int32_t, int>{{5, 500}}));
  // Top-p: 3.0 alone holds 0.36 of the probability, with the 2.5s 0.79.
  params.topK = 0;
  params.topP = 0.3f;
  EXPECT_EQ(histogram(logits, params, 500), (std::map<int32_t, int>{{5, 500}}));
  params.topP = 0.7f;
  counts = histogram(logits, params, 3000);
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_TRUE(counts.count(1) && counts.count(5) && counts.count(6));
  params.topP = 1.0f;
  EXPECT_EQ(histogram(logits, params, 20000).size(), logits.size());
}

TEST(Sampling, GreedyIsTheFirstLargestAndDrawsAreTheSeeds) {
  std::vector<float> logits = {0.5f, std::nanf(""), 2.0f, 2.0f, -4.0f};
  SamplingParams params;
  EXPECT_EQ(sampleRow(logits.data(), 5, params, 0, 0), 2);
  params.temperature = 0.7f;
  params.seed = 99;
  std::vector<int32_t> first, again, other;
  for (int counter = 0; counter < 64; ++counter) {
    first.push_back(sampleRow(logits.data(), 5, params, 1, counter));
    again.push_back(sampleRow(logits.data(), 5, params, 1, counter));
    other.push_back(sampleRow(logits.data(), 5, params, 2, counter));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other); // another row draws otherwise
  for (int32_t token : first)
    EXPECT_NE(token, 1) << "NaN drawn";
  std::vector<float> none(4, std::nanf(""));
  EXPECT_EQ(sampleRow(none.data(), 4, params, 0, 0), 0);
}

} // namespace

TEST(Sampling, SettingsOutOfRangeAreDefinedTheSameOnBothSides) {
  // The sample op reads its settings as floats, whatever they hold: a top-p at or below 0 (or
  // NaN) keeps the most likely token alone, one at or above 1 every token; a top-k below 1, at
  // or above the vocabulary, or NaN cuts nothing. No float out of an integer's range is converted
  // (the host and the device would convert it differently).
  EXPECT_EQ(samplingMassTarget(1000, -0.5f), 1u);
  EXPECT_EQ(samplingMassTarget(1000, 0.0f), 1u);
  EXPECT_EQ(samplingMassTarget(1000, std::nanf("")), 1u);
  EXPECT_EQ(samplingMassTarget(1000, 0.2501f), 251u);
  EXPECT_EQ(samplingMassTarget(1000, 1.7f), 1000u);
  EXPECT_EQ(samplingMassTarget(~0ull, 1.0f), ~0ull);
  EXPECT_EQ(samplingMassTarget(~0ull, 0.5f), 1ull << 63);
  EXPECT_EQ(samplingTopK(-1.2f, 50), 0);
  EXPECT_EQ(samplingTopK(0.9f, 50), 0);
  EXPECT_EQ(samplingTopK(2.7f, 50), 2);
  EXPECT_EQ(samplingTopK(49.5f, 50), 49);
  EXPECT_EQ(samplingTopK(50.0f, 50), 0);
  EXPECT_EQ(samplingTopK(1e30f, 50), 0);
  EXPECT_EQ(samplingTopK(std::nanf(""), 50), 0);
  const std::vector<float> logits = {1.0f, 2.5f, 0.0f, 2.0f, -1.0f, 3.0f, 2.5f};
  float sampling[3] = {1.0f, -0.3f, -2.0f};
  int32_t seed[2] = {7, 0};
  SamplingParams params = unpackSampling(sampling, seed);
  EXPECT_EQ(params.topK, 0);
  EXPECT_EQ(histogram(logits, params, 200), (std::map<int32_t, int>{{5, 200}}));
  sampling[2] = 1e30f;
  EXPECT_EQ(unpackSampling(sampling, seed).topK, 0);
}
