// The normal draw that host and device share (support/BoxMuller.h): its log and cos against the
// C library's long double ones, and the draws against long double Box-Muller and against the
// double libm formula they replaced (whose cos of a rounded 2 pi u is itself off by up to 3e-15).
#include "support/Random.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace tgc;

namespace {

TEST(BoxMuller, LogIsWithinThreeUlpsOverItsWholeDomain) {
  // Every binade of (0, 1], the reduction's edges around sqrt(1/2), and random points.
  std::vector<double> points = {1.0, 0.5, 0x1.0p-53, 0x1.6a09e667f3bcdp-1, 0x1.6a09e667f3bccp-1,
                                0x1.fffffffffffffp-1, 0x1.0000000000001p-1};
  for (int e = 1; e <= 53; ++e)
    points.push_back(std::ldexp(1.0, -e) * 1.37);
  Rng rng(7);
  for (int i = 0; i < 200000; ++i)
    points.push_back(1.0 - rng.uniform());
  for (double u : points) {
    long double exact = std::log((long double)u);
    double got = boxMullerLog(u);
    long double ulp = std::nextafter(std::fabs(double(exact)), INFINITY) - std::fabs(double(exact));
    if (u == 1.0) {
      EXPECT_EQ(got, 0.0);
      continue;
    }
    ASSERT_LE(std::fabs((long double)got - exact), 3 * ulp) << std::hexfloat << u;
  }
}

TEST(BoxMuller, CosOfTwoPiUIsWithinTwoUlpsOfOne) {
  std::vector<double> points = {0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 0x1.fffffffffffffp-1};
  Rng rng(8);
  for (int i = 0; i < 200000; ++i)
    points.push_back(rng.uniform());
  const long double twoPi = 6.283185307179586476925286766559L;
  for (double u : points) {
    long double exact = std::cos(twoPi * (long double)u);
    double got = boxMullerCos2Pi(u);
    // Absolute: near the zeros of cos the argument's own rounding dominates any relative bound.
    ASSERT_LE(std::fabs((long double)got - exact), 0x1.0p-52L) << std::hexfloat << u;
  }
  EXPECT_EQ(boxMullerCos2Pi(0.0), 1.0);
  EXPECT_EQ(boxMullerCos2Pi(0.5), -1.0);
}

TEST(BoxMuller, DrawsAreBoxMullersToRoundingAndStandardNormal) {
  Rng ours(12345);
  Rng theirs(12345);
  const int n = 1000000;
  double sum = 0, sumSq = 0;
  int floatsDiffering = 0;
  for (int i = 0; i < n; ++i) {
    double x = ours.normal();
    double u1 = 1.0 - theirs.uniform(), u2 = theirs.uniform();
    long double exact = std::sqrt(-2.0L * std::log((long double)u1)) *
                        std::cos(6.283185307179586476925286766559L * (long double)u2);
    double libm = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    ASSERT_LE(std::fabs((long double)x - exact), 1e-15L * std::max(1.0, std::fabs(x))) << "draw " << i;
    ASSERT_LE(std::fabs(x - libm), 5e-15 * std::max(1.0, std::fabs(x))) << "draw " << i;
    floatsDiffering += float(x) != float(libm);
    sum += x;
    sumSq += x * x;
  }
  // A few ulps of double change a float only across a rounding boundary: about 1e-8 a draw.
  EXPECT_LE(floatsDiffering, 2);
  double mean = sum / n, variance = sumSq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(double(n)));
  EXPECT_NEAR(variance, 1.0, 0.01);
}

} // namespace
