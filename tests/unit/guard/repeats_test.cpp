// Repeated data (the seed's §3.2): exact repeats by content, a periodic dip in the loss, samples
// far below the baseline, and the fp16 loss scale's slow decline.
#include "guard/repeats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "guard/guard.h"

namespace keel::guard {
namespace {

TEST(RepeatWatch, TheSameContentUnderAnotherIdIsARepeat) {
  RepeatWatch w;
  w.remember({11, 12, 13}, {1, 2, 3});
  EXPECT_EQ(w.duplicate_of(12, 7), std::optional<int64_t>(2));  // id 2's tokens under id 7
  EXPECT_FALSE(w.duplicate_of(12, 2));  // the same id again: the next epoch, a replay
  EXPECT_FALSE(w.duplicate_of(99, 7));  // new content
  w.remember({12}, {7});                // remembered under the first id it was seen with
  EXPECT_EQ(w.duplicate_of(12, 8), std::optional<int64_t>(2));
  EXPECT_FALSE(w.duplicate_of(12, 2));
}

TEST(RepeatWatch, ForgetsTheOldestPastItsCapacityAndRoundTrips) {
  RepeatWatch w(4);
  w.remember({1, 2, 3}, {10, 20, 30});
  w.remember({4, 5}, {40, 50});  // 1 falls out
  EXPECT_EQ(w.size(), 4);
  EXPECT_FALSE(w.duplicate_of(1, 99));
  EXPECT_EQ(w.duplicate_of(2, 99), std::optional<int64_t>(20));
  RepeatWatch copy(4);
  copy.load_state(w.state());
  EXPECT_EQ(copy.size(), 4);
  EXPECT_EQ(copy.duplicate_of(5, 99), std::optional<int64_t>(50));
  EXPECT_FALSE(copy.duplicate_of(1, 99));
  // A hash with its top bit set survives the int64 state.
  RepeatWatch big;
  big.remember({0xF000000000000001ull}, {1});
  RepeatWatch big_copy;
  big_copy.load_state(big.state());
  EXPECT_EQ(big_copy.duplicate_of(0xF000000000000001ull, 2), std::optional<int64_t>(1));
}

// A falling loss with noise: `dip` subtracted every `period` steps from `first_dip` on.
std::optional<LossPeriodicity::Finding> run_series(int64_t steps, int64_t period, double dip,
                                                   int64_t first_dip, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.02);
  LossPeriodicity p;
  std::optional<LossPeriodicity::Finding> last;
  for (int64_t t = 0; t < steps; ++t) {
    double loss = 3.0 * std::exp(-static_cast<double>(t) / 400.0) + 2.0 + noise(rng);
    if (period > 0 && t >= first_dip && (t - first_dip) % period == 0) loss -= dip;
    p.push(loss);
    last = p.detect();
  }
  return last;
}

TEST(LossPeriodicity, FindsTheDipsPeriodAtADip) {
  // The series ends on a dip (steps 100, 110, ... 399 would not; 109 + 10k does: 399 = 109 + 290).
  const auto found = run_series(400, 10, 0.3, 109);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->period, 10);
  EXPECT_GE(found->correlation, kPeriodCorrelation);
  EXPECT_LT(found->dip, -kDipSigmas);
}

TEST(LossPeriodicity, SilentOnNoiseATrendOrBetweenDips) {
  for (uint32_t seed = 1; seed <= 20; ++seed)
    EXPECT_FALSE(run_series(600, 0, 0.0, 0, seed).has_value()) << seed;
  EXPECT_FALSE(run_series(400, 10, 0.3, 105).has_value());  // the newest step is no dip
  EXPECT_FALSE(run_series(100, 10, 0.3, 9).has_value());    // the window is not full yet
}

config::StabilityConfig config_with(int64_t median_window) {
  config::StabilityConfig c;
  c.median_window = median_window;
  c.recovery.steps = 5;
  c.rollback.stuck_steps = 1000;
  c.screen.min_samples = 40;
  return c;
}

StepSignals calm(int64_t step, int64_t samples = 8) {
  StepSignals s;
  s.step = step;
  s.grad_norm = 1.0;
  s.loss = 2.0;
  s.layer_grad_norms = {1.0};
  s.samples = samples;
  for (int64_t i = 0; i < samples; ++i) s.kept_losses.push_back(1.9 + 0.025 * (i % 5));
  return s;
}

int count_warns(const Decision& d, const std::string& signal) {
  int n = 0;
  for (const auto& e : d.events)
    n += e.kind == EventKind::kWarn && e.detail.value("signal", "") == signal;
  return n;
}

TEST(Guard, LowThresholdIsTheScreensMirrorAndLowSamplesStayOutOfTheBaseline) {
  Guard g(config_with(20), {"a"}, /*warmup_steps=*/0, /*samples_per_step=*/8);
  int64_t step = 0;
  for (; step < 20; ++step) g.observe(calm(step));
  ASSERT_TRUE(g.low_threshold(step).has_value());
  // median 1.95, MAD 0.025: min(1.95 / 2², 1.95 - 6 x 1.4826 x 0.025) = 0.4875.
  EXPECT_NEAR(*g.low_threshold(step), 0.4875, 1e-9);
  const double before = *g.screen_threshold(step);
  for (int i = 0; i < 30; ++i, ++step) {  // a stream of low samples, trained on (warn mode)
    StepSignals s = calm(step);
    s.kept_losses = std::vector<double>(8, 0.1);
    s.low_losses = s.kept_losses;
    s.low_threshold = g.low_threshold(step);
    s.screen_threshold = g.screen_threshold(step);
    g.observe(s);
  }
  EXPECT_DOUBLE_EQ(*g.screen_threshold(step), before);  // the baseline never saw them
}

TEST(Guard, RepeatedDataWarnsAtTheFirstRepeatThenOncePerWindow) {
  Guard g(config_with(20), {"a"}, 0, 8);
  int64_t step = 0;
  for (; step < 20; ++step) g.observe(calm(step));
  int warns = 0;
  for (int i = 0; i < 30; ++i, ++step) {
    StepSignals s = calm(step);
    s.repeated = i % 10 == 0 ? 8 : 0;  // a set coming back every 10 steps
    const Decision d = g.observe(s);
    warns += count_warns(d, "repeated_data");
    if (i == 0) {
      ASSERT_EQ(count_warns(d, "repeated_data"), 1);
      for (const auto& e : d.events)
        if (e.kind == EventKind::kWarn) EXPECT_TRUE(e.about_low_samples);
    }
  }
  EXPECT_EQ(warns, 2);  // steps 20 and 40 (the one at 30 is within its window)
}

TEST(Guard, LowLossWarnsPastTheNaturalTailOnlyAfterWarmup) {
  Guard g(config_with(20), {"a"}, /*warmup_steps=*/30, 8);
  int64_t step = 0;
  for (; step < 20; ++step) g.observe(calm(step));
  auto low_step = [&](int64_t n_low) {
    StepSignals s = calm(step);
    s.screen_threshold = g.screen_threshold(step);
    s.low_threshold = g.low_threshold(step);
    for (int64_t i = 0; i < n_low; ++i) s.low_losses.push_back(0.2);
    return count_warns(g.observe(s), "low_loss");
  };
  int warns = 0;
  for (; step < 30; ++step) warns += low_step(3);  // in warmup: silent
  EXPECT_EQ(warns, 0);
  // A thin tail (one low sample every 5 steps): the run learns it over the first window after
  // warmup, silent meanwhile, and it stays silent once learned.
  for (int i = 0; i < 80; ++i, ++step) warns += low_step(i % 5 == 0 ? 1 : 0);
  EXPECT_EQ(warns, 0);
  // Six a step: past the learned rate (lambda 4 a window: 4 + 4 x 2 + 4 = 16) by the third.
  int64_t first = -1;
  for (int i = 0; i < 6 && first < 0; ++i, ++step)
    if (low_step(6) > 0) first = i;
  EXPECT_GE(first, 1);
  EXPECT_LE(first, 3);
}

TEST(Guard, AGradualLossScaleDeclineWarnsAsATrend) {
  // median_window 20: the count warns at 3 drops within 20 steps; the trend looks at 80.
  Guard g(config_with(20), {"a"});
  double scale = 1024;
  int trend = 0, count = 0;
  for (int64_t step = 0; step < 200; ++step) {
    StepSignals s = calm(step, 0);
    s.loss_scale = scale;
    s.overflow = step > 0 && step % 15 == 0;  // one drop every 15 steps: never 3 in 20
    if (s.overflow) s.grad_norm = std::numeric_limits<double>::infinity();
    const Decision d = g.observe(s);
    trend += count_warns(d, "loss_scale_trend");
    count += count_warns(d, "loss_scale");
    if (s.overflow) scale /= 2;
  }
  EXPECT_EQ(count, 0);
  EXPECT_GE(trend, 1);

  Guard steady(config_with(20), {"a"});
  scale = 1024;
  for (int64_t step = 0; step < 400; ++step) {  // a drop every 50 steps, a rise every 40
    StepSignals s = calm(step, 0);
    s.loss_scale = scale;
    s.overflow = step > 0 && step % 50 == 0;
    if (s.overflow) s.grad_norm = std::numeric_limits<double>::infinity();
    const Decision d = steady.observe(s);
    EXPECT_EQ(count_warns(d, "loss_scale_trend"), 0) << step;
    if (s.overflow) scale /= 2;
    if (step % 40 == 39) scale *= 2;
  }
}

}  // namespace
}  // namespace keel::guard
