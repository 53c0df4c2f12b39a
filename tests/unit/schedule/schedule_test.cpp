// Learning-rate schedules at known steps, against values computed by hand.
#include "schedule/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "common/error.h"

namespace keel::schedule {
namespace {

config::ScheduleConfig make(const std::string& kind, int64_t warmup, double min_ratio = 0.1) {
  config::ScheduleConfig c;
  c.kind = *config::parse_choice<config::ScheduleKind>(kind);
  c.warmup_steps = warmup;
  c.min_lr_ratio = min_ratio;
  return c;
}

struct Point {
  int64_t step;
  double lr;
};

void expect_points(const config::ScheduleConfig& cfg, double peak, int64_t max_steps,
                   const std::vector<Point>& points) {
  for (const auto& [step, lr] : points) {
    EXPECT_NEAR(lr_at(cfg, peak, step, max_steps), lr, 1e-12)
        << config::name_of(cfg.kind) << " step " << step;
  }
}

TEST(ScheduleTest, CosineWarmupThenCosineToMin) {
  // warmup 10 of 110 steps: step s < 10 gets 2*(s+1)/10; then 0.2 + 1.8 * (1 + cos(pi p)) / 2.
  const auto cfg = make("cosine", 10);
  expect_points(cfg, 2.0, 110,
                {{0, 0.2},
                 {4, 1.0},
                 {9, 2.0},
                 {10, 2.0},                                                 // p = 0
                 {35, 0.2 + 0.9 * (1.0 + std::cos(std::numbers::pi / 4))},  // p = 1/4
                 {60, 1.1},                                                 // p = 1/2
                 {110, 0.2},                                                // p = 1
                 {500, 0.2}});                                              // clamped past the end
  EXPECT_EQ(schedule::warmup_steps(cfg, 110), 10);
}

TEST(ScheduleTest, CosineWithoutWarmupStartsAtPeak) {
  expect_points(make("cosine", 0, 0.0), 1.0, 100, {{0, 1.0}, {50, 0.5}, {100, 0.0}});
}

TEST(ScheduleTest, ThreePhaseFromFractions) {
  // 100 steps: warmup 10 (0.1), stable 70 (0.7), decay 80..100 as 1.0 * 0.1^p.
  auto cfg = make("three_phase", config::kAuto);
  cfg.phases = {0.1, 0.7, 0.2};
  expect_points(cfg, 1.0, 100,
                {{0, 0.1},
                 {9, 1.0},
                 {10, 1.0},
                 {79, 1.0},
                 {80, 1.0},
                 {85, std::pow(0.1, 0.25)},
                 {90, std::sqrt(0.1)},
                 {100, 0.1},
                 {150, 0.1}});
  EXPECT_EQ(schedule::warmup_steps(cfg, 100), 10);
}

TEST(ScheduleTest, ThreePhaseWarmupStepsOverridesFraction) {
  // warmup 20 steps replaces phases.warmup; the decay keeps its 20 steps (80..100), so the stable
  // phase shrinks to 60.
  auto cfg = make("three_phase", 20);
  cfg.phases = {0.1, 0.7, 0.2};
  expect_points(cfg, 1.0, 100,
                {{0, 0.05}, {19, 1.0}, {20, 1.0}, {79, 1.0}, {90, std::sqrt(0.1)}, {100, 0.1}});
  EXPECT_EQ(schedule::warmup_steps(cfg, 100), 20);
}

TEST(ScheduleTest, ThreePhaseDecayFractionIsRead) {
  // The decay phase is the last phases.decay x max_steps steps: 0.5 of 100 -> 50..100.
  auto cfg = make("three_phase", config::kAuto);
  cfg.phases = {0.1, 0.4, 0.5};
  expect_points(cfg, 1.0, 100, {{49, 1.0}, {50, 1.0}, {75, std::sqrt(0.1)}, {100, 0.1}});
  EXPECT_EQ(schedule::decay_start(cfg, 100), 50);
  cfg.phases = {0.1, 0.9, 0.0};  // no decay phase: the peak to the end
  EXPECT_EQ(schedule::decay_start(cfg, 100), 100);
  expect_points(cfg, 1.0, 100, {{99, 1.0}});
}

TEST(ScheduleTest, AutoWarmupIsATenthOfTheRunUpTo2000Steps) {
  auto cfg = make("cosine", config::kAuto);
  EXPECT_EQ(schedule::warmup_steps(cfg, 400), 40);
  EXPECT_EQ(schedule::warmup_steps(cfg, 100000), 2000);
  cfg = make("three_phase", config::kAuto);
  cfg.phases = {0.2, 0.6, 0.2};
  EXPECT_EQ(schedule::warmup_steps(cfg, 1000), 200);
}

TEST(ScheduleTest, ConstantWarmupThenPeak) {
  expect_points(make("constant", 4), 3.0, 100,
                {{0, 0.75}, {1, 1.5}, {3, 3.0}, {4, 3.0}, {99, 3.0}});
  expect_points(make("constant", 0), 3.0, 100, {{0, 3.0}, {99, 3.0}});
}

TEST(ScheduleTest, FirstStepIsNeverZero) {
  for (const char* kind : {"cosine", "three_phase", "constant"}) {
    EXPECT_GT(lr_at(make(kind, 1000), 1e-3, 0, 2000), 0.0) << kind;
  }
}

}  // namespace
}  // namespace keel::schedule
