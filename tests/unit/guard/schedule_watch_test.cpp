// The schedule watch (issue 47): the attention output's growth over its value at initialisation
// warns, then calls for a back-off that lowers the peak; the back-offs are limited and survive a
// checkpoint.
#include "guard/schedule_watch.h"

#include <gtest/gtest.h>

#include <cmath>

namespace keel::guard {
namespace {

constexpr int64_t kWarmup = 40;
constexpr double kPeak = 3e-3;

// A watch whose two layers started at std 0.01 and 0.02.
ScheduleWatch started() {
  ScheduleWatch w(kWarmup, kPeak);
  w.set_baseline({0.01, 0.02});
  return w;
}

TEST(ScheduleWatch, GrowthBelowTheWarnLevelIsQuietAndRecordsTheQuietLr) {
  ScheduleWatch w = started();
  EXPECT_FALSE(w.needs_baseline());
  EXPECT_FALSE(w.observe(10, 1e-3, {0.01 * 20, 0.02 * 49}));
  EXPECT_FALSE(w.pending());
  EXPECT_DOUBLE_EQ(w.last_quiet_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(w.lr_factor(11), 1.0);
}

TEST(ScheduleWatch, TheWarnLevelWarnsOnceNamingTheLayer) {
  ScheduleWatch w = started();
  ASSERT_FALSE(w.observe(10, 1e-3, {0.01, 0.02}));
  const auto warn = w.observe(20, 2e-3, {0.01 * 2, 0.02 * 60});
  ASSERT_TRUE(warn);
  EXPECT_EQ((*warn)["signal"], "attention_growth");
  EXPECT_EQ((*warn)["layer"], 1);
  EXPECT_NEAR((*warn)["growth"].get<double>(), 60.0, 1e-9);
  EXPECT_EQ((*warn)["quiet_step"], 10);
  EXPECT_FALSE(w.pending());
  EXPECT_FALSE(w.observe(30, 3e-3, {0.01 * 2, 0.02 * 70})) << "one warn per attempt";
}

TEST(ScheduleWatch, TheAlarmLevelCallsForABackoffToTheAttemptsStart) {
  ScheduleWatch w = started();
  ASSERT_FALSE(w.observe(10, 1e-3, {0.01 * 5, 0.02}));
  w.observe(20, 2e-3, {0.01 * 150, 0.02});
  ASSERT_TRUE(w.pending());
  const Backoff& b = *w.pending();
  EXPECT_EQ(b.step, 20);
  EXPECT_EQ(b.restart_step, 0);
  EXPECT_EQ(b.quiet_step, 10);
  EXPECT_DOUBLE_EQ(b.quiet_lr, 1e-3);
  EXPECT_DOUBLE_EQ(b.from_scale, 1.0);
  EXPECT_NEAR(b.to_scale, 1.0 / std::sqrt(10.0), 1e-12);
  EXPECT_EQ(b.number, 1);
  EXPECT_EQ(b.signals["layer"], 0);
  // Until the trainer carries it out, the schedule is unchanged.
  EXPECT_DOUBLE_EQ(w.lr_factor(21), 1.0);
}

TEST(ScheduleWatch, ABackoffWithinTheWarmupLowersThePeakAndTheScheduleRampsAsBefore) {
  ScheduleWatch w = started();
  w.observe(20, 2e-3, {0.01 * 150, 0.02});
  ASSERT_TRUE(w.pending());
  w.backed_off(0);
  EXPECT_FALSE(w.pending());
  EXPECT_EQ(w.backoffs(), 1);
  EXPECT_NEAR(w.lr_factor(1), kBackoffFactor, 1e-12) << "the schedule's own warmup ramps";
  EXPECT_NEAR(w.lr_factor(500), kBackoffFactor, 1e-12);
  EXPECT_EQ(w.restart_snapshot(50), 0);
}

TEST(ScheduleWatch, ABackoffPastTheWarmupWarmsUpAgainToTheNewPeak) {
  ScheduleWatch w = started();
  w.observe(90, 3e-3, {0.01 * 150, 0.02});
  ASSERT_TRUE(w.pending());
  w.backed_off(60);  // restored a snapshot past the 40-step warmup
  EXPECT_NEAR(w.lr_factor(60), kBackoffFactor / kWarmup, 1e-12);
  EXPECT_NEAR(w.lr_factor(79), kBackoffFactor * 20 / kWarmup, 1e-12);
  EXPECT_NEAR(w.lr_factor(99), kBackoffFactor, 1e-12);
  EXPECT_NEAR(w.lr_factor(1000), kBackoffFactor, 1e-12);
  // The new attempt is judged from its own start for max(2 x warmup, 100) steps.
  EXPECT_EQ(w.restart_snapshot(160), 60);
  EXPECT_FALSE(w.restart_snapshot(161));
}

TEST(ScheduleWatch, ABackoffToTheWarmupsLastStepWarmsUpAgainToo) {
  ScheduleWatch w = started();
  w.observe(50, 3e-3, {0.01 * 150, 0.02});
  w.backed_off(kWarmup);  // the schedule's own ramp is done there
  EXPECT_NEAR(w.lr_factor(kWarmup), kBackoffFactor / kWarmup, 1e-12);
  ScheduleWatch within = started();
  within.observe(30, 2e-3, {0.01 * 150, 0.02});
  within.backed_off(20);  // the schedule's ramp goes on, to the lowered peak
  EXPECT_NEAR(within.lr_factor(20), kBackoffFactor, 1e-12);
}

TEST(ScheduleWatch, ANonFiniteFirstReadingLeavesItsLayerUnjudgedAndTheStateValid) {
  ScheduleWatch w(kWarmup, kPeak);
  w.set_baseline({NAN, 0.02});
  ScheduleWatch resumed(kWarmup, kPeak);
  resumed.load_state(nlohmann::json::parse(w.state().dump()));
  EXPECT_FALSE(resumed.observe(10, 1e-3, {1e6, 0.02}));
  resumed.observe(20, 1e-3, {1e6, 0.02 * 200});
  EXPECT_TRUE(resumed.pending());
}

TEST(ScheduleWatch, NothingIsJudgedPastTheWindow) {
  ScheduleWatch w = started();
  EXPECT_EQ(w.restart_snapshot(100), 0);
  EXPECT_FALSE(w.restart_snapshot(101));
  EXPECT_FALSE(w.observe(101, 3e-3, {0.01 * 1000, 0.02 * 1000}));
  EXPECT_FALSE(w.pending());
}

TEST(ScheduleWatch, ANonFiniteReadingIsNotGrowth) {
  ScheduleWatch w = started();
  EXPECT_FALSE(w.observe(10, 1e-3, {NAN, INFINITY}));
  EXPECT_FALSE(w.pending());
}

TEST(ScheduleWatch, AfterTheLastBackoffTheNextAlarmStopsTheRunNamingAnLr) {
  ScheduleWatch w = started();
  for (int64_t i = 0; i < kMaxBackoffs; ++i) {
    w.observe(20, 1e-3, {0.01 * 200, 0.02});
    ASSERT_TRUE(w.pending()) << "back-off " << i + 1;
    w.backed_off(0);
  }
  EXPECT_FALSE(w.spent());
  w.observe(20, 1e-3, {0.01 * 200, 0.02});
  EXPECT_FALSE(w.pending());
  EXPECT_TRUE(w.spent());
  const std::string msg = w.stop_message();
  EXPECT_NE(msg.find("4 back-offs"), std::string::npos) << msg;
  // 3e-3 x 10^-2 now; the hint names the next half decade down.
  EXPECT_NE(msg.find("set optim.lr to 9.49e-06"), std::string::npos) << msg;
}

TEST(ScheduleWatch, TheStateKeepsTheLoweredScheduleAcrossAResume) {
  ScheduleWatch w = started();
  w.observe(90, 3e-3, {0.01 * 150, 0.02});
  w.backed_off(60);
  ScheduleWatch resumed(kWarmup, kPeak);
  resumed.load_state(w.state());
  EXPECT_FALSE(resumed.needs_baseline());
  EXPECT_EQ(resumed.backoffs(), 1);
  for (int64_t s : {60, 70, 99, 200}) EXPECT_DOUBLE_EQ(resumed.lr_factor(s), w.lr_factor(s));
  EXPECT_EQ(resumed.restart_snapshot(100), 60);
  // The baseline came along: the resumed attempt is judged as the live one would be.
  resumed.observe(100, 3e-4, {0.01 * 150, 0.02});
  EXPECT_TRUE(resumed.pending());
}

TEST(ScheduleWatch, ACheckpointWithoutTheWatchNeverJudges) {
  ScheduleWatch w(kWarmup, kPeak);
  w.load_state(nullptr);
  EXPECT_FALSE(w.needs_baseline());
  EXPECT_FALSE(w.observe(10, 1e-3, {1e6, 1e6}));
  EXPECT_FALSE(w.pending());
  EXPECT_FALSE(w.restart_snapshot(10));
  EXPECT_DOUBLE_EQ(w.lr_factor(10), 1.0);
}

TEST(ScheduleWatch, AModelWithoutAttentionStatisticsIsNotWatched) {
  ScheduleWatch w(kWarmup, kPeak);
  ASSERT_TRUE(w.needs_baseline());
  w.set_baseline({});
  EXPECT_FALSE(w.needs_baseline());
  EXPECT_FALSE(w.observe(10, 1e-3, {1e6}));
}

}  // namespace
}  // namespace keel::guard
