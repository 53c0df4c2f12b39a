// checkpoint.every_steps: auto — the interval at which a save costs at most max_overhead of
// training time, rounded up to a round number, within [kMinAutoInterval, max_steps / 8].
#include <gtest/gtest.h>

#include <limits>

#include "checkpoint/checkpointer.h"

namespace keel::checkpoint {
namespace {

TEST(AutoInterval, ASaveCostsAtMostTheOverheadRoundedUp) {
  // A 5 s save at 1 s a step and 1 %: 500 steps exactly.
  EXPECT_EQ(auto_interval(5.0, 1.0, 0.01, 100000), 500);
  // 0.03 s at 0.08 s: 37.5 steps -> 40 (the next of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k).
  EXPECT_EQ(auto_interval(0.03, 0.08, 0.01, 100000), 40);
  // 60 s at 1 s: 6,000 steps, about 1.7 hours: the seed's cadence at scale.
  EXPECT_EQ(auto_interval(60.0, 1.0, 0.01, 100000), 6000);
  EXPECT_EQ(auto_interval(61.0, 1.0, 0.01, 100000), 8000);
  for (double stall : {0.001, 0.02, 0.3, 7.0, 90.0}) {
    const int64_t n = auto_interval(stall, 0.5, 0.01, 1000000);
    EXPECT_LE(stall / (n * 0.5), 0.01 + 1e-12) << stall;  // the cost stays under 1 %
  }
}

TEST(AutoInterval, BoundedByTenStepsAndAnEighthOfTheRun) {
  EXPECT_EQ(auto_interval(0.0001, 1.0, 0.01, 100000), kMinAutoInterval);
  EXPECT_EQ(auto_interval(30.0, 0.01, 0.01, 400), 50);  // 300,000 wanted; a short run keeps 8
  EXPECT_EQ(auto_interval(1.0, 0.0, 0.01, 400), 50);    // no step time measured: the densest
  EXPECT_EQ(auto_interval(std::numeric_limits<double>::quiet_NaN(), 1.0, 0.01, 400), 50);
  EXPECT_EQ(auto_interval(1.0, 1.0, 0.01, 40), kMinAutoInterval);
}

TEST(StableInterval, EveryCheckpointIsACandidateUnlessSetOtherwise) {
  config::CheckpointConfig c;  // every_steps auto, stable.every_steps auto, window auto
  EXPECT_EQ(stable_interval(c, 25), 25);
  EXPECT_EQ(stable_window(c, 25), 25);  // the interval before it passed without an alarm
  c.stable.every_steps = 0;
  EXPECT_EQ(stable_interval(c, 25), 25);
  c.stable.every_steps = 100;
  c.stable.window = 40;
  EXPECT_EQ(stable_interval(c, 25), 100);
  EXPECT_EQ(stable_window(c, 25), 40);
}

}  // namespace
}  // namespace keel::checkpoint
