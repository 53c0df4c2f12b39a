#include "monitor/straggler_watch.h"

#include <gtest/gtest.h>

namespace keel::monitor {
namespace {

TEST(StragglerWatch, FiguresNameTheSlowestRankAndItsLagBehindTheMedian) {
  EXPECT_FALSE(StragglerWatch::figures({10.0}).has_value());
  const auto two = StragglerWatch::figures({10.0, 14.0});
  ASSERT_TRUE(two);
  EXPECT_EQ(two->slowest_rank, 1);
  EXPECT_DOUBLE_EQ(two->median_ms, 10.0);  // with two ranks, the other one
  EXPECT_DOUBLE_EQ(two->lag_ms, 4.0);
  const auto four = StragglerWatch::figures({10.0, 11.0, 30.0, 10.5});
  ASSERT_TRUE(four);
  EXPECT_EQ(four->slowest_rank, 2);
  EXPECT_DOUBLE_EQ(four->median_ms, 10.5);
  EXPECT_DOUBLE_EQ(four->lag_ms, 19.5);
}

// One warn after kWindows windows in a row of the same rank behind by the margin; a break in
// the streak, another rank or a small lag starts it again; then quiet for kQuietWindows.
TEST(StragglerWatch, WarnsOnceAboutARankPersistentlyBehind) {
  StragglerWatch watch;
  const StragglerFigures slow{3, 20.0, 10.0, 10.0};
  const StragglerFigures small{3, 11.0, 10.0, 1.0};  // under kMinLagMs and kMinLagShare
  const StragglerFigures other{1, 20.0, 10.0, 10.0};
  for (int i = 0; i < StragglerWatch::kWindows - 1; ++i) EXPECT_FALSE(watch.observe(slow));
  EXPECT_FALSE(watch.observe(small));  // the streak breaks
  for (int i = 0; i < StragglerWatch::kWindows - 1; ++i) EXPECT_FALSE(watch.observe(slow));
  EXPECT_FALSE(watch.observe(other));  // another rank: its own streak
  for (int i = 0; i < StragglerWatch::kWindows - 1; ++i) EXPECT_FALSE(watch.observe(slow));
  const auto warned = watch.observe(slow);
  ASSERT_TRUE(warned);
  EXPECT_EQ(*warned, 3);
  EXPECT_EQ(watch.streak(), StragglerWatch::kWindows);
  int again = 0;
  for (int i = 0; i < StragglerWatch::kQuietWindows; ++i) again += watch.observe(slow) ? 1 : 0;
  EXPECT_EQ(again, 1);  // once more, kQuietWindows after the first
  // A lag of a quarter of the median but under 2 ms is noise on a fast step.
  StragglerWatch fast;
  for (int i = 0; i < 3 * StragglerWatch::kWindows; ++i)
    EXPECT_FALSE(fast.observe({0, 5.0, 4.0, 1.0}));
}

}  // namespace
}  // namespace keel::monitor
