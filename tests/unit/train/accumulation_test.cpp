// Dynamic gradient accumulation: the count follows the normalized gradient norm against its
// median, by one micro-batch at a time, within its range, never feeding on its own changes.
#include "train/accumulation.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"

namespace keel::train {
namespace {

config::DataConfig dynamic_data(int64_t nominal = 4, int64_t min = 1, int64_t max = 8) {
  config::DataConfig d;
  d.grad_accum = config::GradAccum::kDynamic;
  d.grad_accum_steps = nominal;
  d.grad_accum_min = min;
  d.grad_accum_max = max;
  return d;
}

// A gradient whose norm is pure noise: `noise` at one micro-batch, falling as 1/sqrt(k).
double noisy_norm(double noise, int64_t k) { return noise / std::sqrt(static_cast<double>(k)); }

TEST(Accumulation, FixedNeverMoves) {
  config::DataConfig d;
  d.grad_accum_steps = 3;
  Accumulation a(d, /*warmup_steps=*/10);
  EXPECT_FALSE(a.dynamic());
  for (int64_t step = 1; step <= 300; ++step)
    EXPECT_FALSE(a.observe(step, step < 150 ? 1.0 : 50.0, false));
  EXPECT_EQ(a.steps(), 3);
  EXPECT_EQ(a.most(), 3);
  EXPECT_DOUBLE_EQ(a.lr_factor(), 1.0);
}

// The norm a change of the count causes is not a reason for another change: pure noise at a
// constant level keeps the count where it is, whatever the count.
TEST(Accumulation, ItsOwnChangesDoNotFeedIt) {
  Accumulation a(dynamic_data(), 10);
  for (int64_t step = 1; step <= 600; ++step)
    EXPECT_FALSE(a.observe(step, noisy_norm(2.0, a.steps()), false)) << step;
  EXPECT_EQ(a.steps(), 4);
}

// The norm runs high: one micro-batch fewer, then `hold` steps before the next change; it settles
// once the median has caught up, and never goes below the minimum.
TEST(Accumulation, FewerMicroBatchesWhileTheNormRunsHigh) {
  Accumulation::Rule rule;
  Accumulation a(dynamic_data(4, 2, 8), 10, rule);
  int64_t last_change = 0, changes = 0;
  for (int64_t step = 1; step <= 400; ++step) {
    const double noise = step < 150 ? 2.0 : 6.0;  // the noise triples at step 150
    if (auto c = a.observe(step, noisy_norm(noise, a.steps()), false)) {
      EXPECT_EQ(c->to, c->from - 1);
      EXPECT_GT(c->ratio, rule.high);
      EXPECT_GE(step, 150);
      if (last_change > 0) EXPECT_GE(step - last_change, rule.hold);
      last_change = step;
      ++changes;
    }
  }
  EXPECT_GE(changes, 1);
  EXPECT_LT(a.steps(), 4);
  EXPECT_GE(a.steps(), 2);
  EXPECT_LT(last_change, 300);  // settled: the baseline learned the new level
  EXPECT_DOUBLE_EQ(a.lr_factor(), std::sqrt(a.steps() / 4.0));
}

TEST(Accumulation, MoreMicroBatchesWhileTheNormRunsLowUpToTheMaximum) {
  Accumulation a(dynamic_data(4, 1, 6), 10);
  for (int64_t step = 1; step <= 1000; ++step) {
    // The norm keeps falling (the signal fades): the count climbs, one at a time, to its maximum.
    const double noise = 4.0 * std::pow(0.99, static_cast<double>(step));
    if (auto c = a.observe(step, noisy_norm(noise, a.steps()), false)) {
      EXPECT_EQ(c->to, c->from + 1);
      EXPECT_GT(step, 10);
    }
  }
  EXPECT_EQ(a.steps(), 6);
  EXPECT_EQ(a.most(), 6);
}

TEST(Accumulation, WarmupAndRecoveryHoldTheCount) {
  Accumulation a(dynamic_data(), 100);
  for (int64_t step = 1; step <= 100; ++step)
    EXPECT_FALSE(a.observe(step, 100.0 / static_cast<double>(step), false));
  for (int64_t step = 101; step <= 400; ++step)
    EXPECT_FALSE(a.observe(step, 10.0 / static_cast<double>(step), /*recovering=*/true));
  EXPECT_EQ(a.steps(), 4);
}

// A checkpoint's state continues the same decisions, bit for bit.
TEST(Accumulation, StateContinuesTheSameDecisions) {
  Accumulation a(dynamic_data(), 10), b(dynamic_data(), 10);
  const auto norm = [](int64_t step, int64_t k) {
    return noisy_norm(2.0 + std::sin(step * 0.05) * 1.5, k);
  };
  for (int64_t step = 1; step <= 150; ++step) a.observe(step, norm(step, a.steps()), false);
  b.load_state(nlohmann::json::parse(a.state().dump()));
  int64_t changes = 0;
  for (int64_t step = 151; step <= 500; ++step) {
    const auto ca = a.observe(step, norm(step, a.steps()), false);
    const auto cb = b.observe(step, norm(step, b.steps()), false);
    ASSERT_EQ(ca.has_value(), cb.has_value()) << step;
    changes += ca.has_value();
    ASSERT_EQ(a.steps(), b.steps()) << step;
  }
  EXPECT_GT(changes, 0);
}

TEST(Accumulation, StateOutsideTheRangeIsRefused) {
  Accumulation wide(dynamic_data(4, 1, 8), 0);
  nlohmann::json state = wide.state();
  state["steps"] = 8;
  Accumulation narrow(dynamic_data(4, 2, 6), 0);
  EXPECT_THROW(narrow.load_state(state), CheckpointError);
  state["steps"] = 5;
  narrow.load_state(state);
  EXPECT_EQ(narrow.steps(), 5);
}

TEST(Accumulation, AutoMaximumIsTwiceTheNominal) {
  config::DataConfig d = dynamic_data(3, 1, config::kAuto);
  Accumulation a(d, 0);
  EXPECT_EQ(a.most(), 6);
}

}  // namespace
}  // namespace keel::train
