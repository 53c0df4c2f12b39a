// The replay check's rules (train/replay.h): how each rank's part of a step, computed again one
// rank on, tells a bad batch from a device that computed wrong once or every time.
#include "train/replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace keel::train {
namespace {

using Parts = std::vector<Contribution>;

// The replay moves the data one rank on: rank r computes rank r-1's part.
Parts rotated(const Parts& parts) {
  Parts out(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) out[(r + 1) % parts.size()] = parts[r];
  return out;
}

ReplayCheck exact() {
  ReplayCheck c;
  c.calibrate(0.0);
  return c;
}

TEST(ReplayCheck, DifferencesAreRelativeAndNaNMatchesNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ReplayCheck::difference({1.0, 2.0}, {1.0, 2.0}), 0.0);
  EXPECT_NEAR(ReplayCheck::difference({1.0, 2.0}, {1.0, 2.2}), 0.2 / 2.2, 1e-12);
  EXPECT_EQ(ReplayCheck::difference({nan, 2.0}, {nan, 2.0}), 0.0) << "a NaN the data makes";
  EXPECT_TRUE(std::isinf(ReplayCheck::difference({nan, 2.0}, {1.0, 2.0})));
  // Parts are compared with the rank whose data they are: rank 0's data was replayed on rank 1.
  const Parts step = {{1, 1}, {2, 2}, {3, 3}};
  EXPECT_EQ(ReplayCheck::differences(step, rotated(step), 1), std::vector<double>(3, 0.0));
}

// A bad batch reproduces on any device: nothing is a machine fault. A one-off fault: the part
// that did not come back is named. A device wrong every time: it is the one device in both
// differing pairs (with two ranks, the one whose own part stood out).
TEST(ReplayCheck, TellsTheDataFromATransientAndAPersistentFault) {
  const ReplayCheck check = exact();
  const Parts clean = {{10, 1}, {11, 1.1}, {12, 1.2}, {13, 1.3}};
  Parts bad_batch = clean;
  bad_batch[2] = {40, 900};
  auto found =
      check.judge(ReplayCheck::differences(bad_batch, rotated(bad_batch), 1), bad_batch, 1, 0.0);
  EXPECT_FALSE(found.machine_fault());

  Parts once = clean;
  once[1].grad_square = 1e6;  // rank 1's device, once; the replay computes its data right
  found = check.judge(ReplayCheck::differences(once, rotated(clean), 1), once, 1, 0.9);
  EXPECT_EQ(found.transient, std::vector<int64_t>{1});
  EXPECT_TRUE(found.persistent.empty());

  Parts replay = rotated(clean);
  replay[2].grad_square = 5e5;  // rank 2 computes rank 1's data wrong too
  Parts step = clean;
  step[2].grad_square = 7e5;  // and its own
  found = check.judge(ReplayCheck::differences(step, replay, 1), step, 1, 0.9);
  EXPECT_EQ(found.persistent, std::vector<int64_t>{2});
  EXPECT_TRUE(found.transient.empty()) << "both differing pairs are rank 2's doing";

  const Parts two = {{10, 1}, {11, 1e6}};  // two ranks: rank 1 wrong in both pairs
  const Parts two_replay = {{11, 1.1}, {10, 3e5}};
  found = check.judge(ReplayCheck::differences(two, two_replay, 1), two, 1, 0.9);
  EXPECT_EQ(found.persistent, std::vector<int64_t>{1});
  EXPECT_EQ(ReplayCheck::suspect({{10, 1}, {std::nan(""), 1}}), 1) << "a NaN stands out first";

  // Every rank's own part came back, the reduced values did not: the reduction.
  found = check.judge(ReplayCheck::differences(clean, rotated(clean), 1), clean, 1, 0.5);
  EXPECT_TRUE(found.global_differs);
  // One process replays on itself.
  found = check.judge(ReplayCheck::differences({{10, 5e5}}, {{10, 1}}, 0), {{10, 5e5}}, 0, 0.9);
  EXPECT_EQ(found.transient, std::vector<int64_t>{0});
}

// The tolerance rests on the run's own noise: exact where the step computed again matched to the
// bit, 1000x the noise otherwise, and no verdict at all from a run too noisy to tell.
TEST(ReplayCheck, TheToleranceFollowsTheMeasuredNoise) {
  ReplayCheck c;
  EXPECT_FALSE(c.calibrated());
  EXPECT_FALSE(c.enabled());
  c.calibrate(0.0);
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.tolerance(), 0.0);
  c.calibrate(3e-8);
  EXPECT_DOUBLE_EQ(c.tolerance(), 3e-5);
  const Parts step = {{10, 1.0}, {11, 1.0}};
  const Parts noisy = {{11, 1.0 + 2e-5}, {10, 1.0}};  // within 1000x the noise
  EXPECT_FALSE(c.judge(ReplayCheck::differences(step, noisy, 1), step, 1, 2e-5).machine_fault());
  c.calibrate(1e-3);
  EXPECT_FALSE(c.enabled()) << "noisier than kReplayNoiseLimit: the replay cannot tell";
  c.calibrate(std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(c.enabled());
}

}  // namespace
}  // namespace keel::train
