// The recovery overlay on every schedule kind: a quarter of the scheduled lr for recovery.steps
// updates after a rollback, then exactly the schedule again, continued from the rolled-back step.
#include "train/learning_rate.h"

#include <gtest/gtest.h>

#include "schedule/schedule.h"

namespace keel::train {
namespace {

config::Config with_schedule(const std::string& kind) {
  config::Config cfg;
  cfg.run.max_steps = 1000;
  cfg.optim.lr = 1e-3;
  cfg.schedule.kind = *config::parse_choice<config::ScheduleKind>(kind);
  cfg.schedule.warmup_steps = 100;
  cfg.stability.recovery.steps = 50;
  cfg.stability.rollback.stuck_steps = 250;  // resolved, as config::resolve_auto leaves it
  cfg.stability.recovery.lr_factor = 0.25;
  return cfg;
}

class RecoveryOverlay : public ::testing::TestWithParam<std::string> {};

TEST_P(RecoveryOverlay, QuarterLrForRecoveryStepsThenTheScheduleFromTheRolledBackStep) {
  const auto cfg = with_schedule(GetParam());
  guard::Guard guard(cfg.stability, {"layers.0"});
  auto scheduled = [&](int64_t step) {
    return schedule::lr_at(cfg.schedule, cfg.optim.lr, step, cfg.run.max_steps);
  };
  // Before any incident the overlay is the identity, in warmup and after it.
  for (int64_t step : {0, 50, 99, 100, 400, 999})
    EXPECT_DOUBLE_EQ(effective_lr(cfg, step, step, &guard, nullptr), scheduled(step)) << step;

  // Paused at 620, rolled back to the stable snapshot at 600.
  guard.rolled_back(600);
  for (int64_t step = 600; step < 650; ++step)
    EXPECT_DOUBLE_EQ(effective_lr(cfg, step, step + 21, &guard, nullptr), 0.25 * scheduled(step))
        << step;
  for (int64_t step : {650, 651, 800, 999})
    EXPECT_DOUBLE_EQ(effective_lr(cfg, step, step + 21, &guard, nullptr), scheduled(step)) << step;

  // A rollback inside warmup keeps the warmup position: recovery scales the warmup ramp.
  guard::Guard early(cfg.stability, {"layers.0"});
  early.rolled_back(40);
  EXPECT_DOUBLE_EQ(effective_lr(cfg, 40, 46, &early, nullptr), 0.25 * scheduled(40));
  EXPECT_LT(scheduled(40), cfg.optim.lr);  // still warming up, not restarted from 0 or at peak
}

TEST_P(RecoveryOverlay, InjectedSpikeMultipliesOnTopAndWithoutAGuardTheScheduleIsPlain) {
  auto cfg = with_schedule(GetParam());
  config::FaultSpec spike;
  spike.kind = config::FaultKind::kLrSpike;
  spike.at_step = 300;
  spike.steps = 2;
  spike.factor = 100;
  FaultInjector faults({spike}, /*grad_accum_steps=*/1, /*vocab_size=*/256, /*seed=*/1);
  const double base = schedule::lr_at(cfg.schedule, cfg.optim.lr, 300, cfg.run.max_steps);
  EXPECT_DOUBLE_EQ(effective_lr(cfg, 300, 300, nullptr, &faults), 100 * base);
  EXPECT_DOUBLE_EQ(effective_lr(cfg, 300, 302, nullptr, &faults), base);  // keyed to iterations
  EXPECT_DOUBLE_EQ(effective_lr(cfg, 300, 300, nullptr, nullptr), base);
}

INSTANTIATE_TEST_SUITE_P(EveryScheduleKind, RecoveryOverlay,
                         ::testing::Values("cosine", "three_phase", "constant"));

}  // namespace
}  // namespace keel::train
