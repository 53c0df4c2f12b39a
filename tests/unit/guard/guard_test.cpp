#include "guard/guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"

namespace keel::guard {
namespace {

TEST(RunningWindow, MedianMeanStdOverTheLastN) {
  RunningWindow w(4);
  EXPECT_TRUE(std::isnan(w.median()));
  for (double v : {10.0, 1.0, 3.0}) w.push(v);
  EXPECT_DOUBLE_EQ(w.median(), 3.0);
  for (double v : {2.0, 4.0}) w.push(v);  // 10 falls out: {1, 3, 2, 4}
  EXPECT_EQ(w.size(), 4);
  EXPECT_DOUBLE_EQ(w.median(), 3.0);  // upper median of 1 2 3 4
  EXPECT_DOUBLE_EQ(w.mean(), 2.5);
  EXPECT_NEAR(w.stddev(), std::sqrt(1.25), 1e-12);
  RunningWindow copy(4);
  copy.load_state(w.state());
  EXPECT_DOUBLE_EQ(copy.median(), w.median());
  EXPECT_DOUBLE_EQ(copy.last(), 4.0);
}

config::StabilityConfig test_config() {
  config::StabilityConfig c;
  c.median_window = 20;
  c.warn_factor = 5;
  c.pause_factor = 10;
  c.loss_alarm_factor = 3;
  c.recovery.steps = 5;
  c.recovery.lr_factor = 0.25;
  c.rollback.max_rollbacks = 2;
  c.max_consecutive_nan = 3;
  return c;
}

StepSignals signals(int64_t step, double norm, double loss = 2.0,
                    std::vector<double> layers = {1, 1, 1, 1}) {
  StepSignals s;
  s.step = step;
  s.grad_norm = norm;
  s.loss = loss;
  s.layer_grad_norms = std::move(layers);
  return s;
}

// Feeds `n` calm steps (grad norm 1, every layer 1) so the baselines exist.
int64_t warm(Guard& g, int64_t n = 20) {
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(g.observe(signals(i, 1.0)).action, Action::kApply);
  return n;
}

std::vector<std::string> kinds(const Decision& d) {
  std::vector<std::string> k;
  for (auto& e : d.events) k.push_back(e.kind);
  return k;
}

TEST(Guard, NoAlarmBeforeABaselineExists) {
  Guard g(test_config(), {"a", "b", "c", "d"});
  g.observe(signals(0, 1.0));
  EXPECT_EQ(g.observe(signals(1, 1000.0)).action, Action::kApply);
}

TEST(Guard, ThresholdsAreStrictMultiplesOfTheMedian) {
  struct Case {
    double norm;
    Action action;
    std::vector<std::string> events;
  };
  for (const auto& c : std::vector<Case>{{4.9, Action::kApply, {}},
                                         {5.1, Action::kApply, {"warn"}},
                                         {9.9, Action::kApply, {"warn"}},
                                         {10.1, Action::kPause, {"warn", "pause"}}}) {
    Guard g(test_config(), {"a", "b", "c", "d"});
    int64_t step = warm(g);
    auto d = g.observe(signals(step, c.norm, 2.0, {c.norm, c.norm, c.norm, c.norm}));
    EXPECT_EQ(d.action, c.action) << c.norm;
    EXPECT_EQ(kinds(d), c.events) << c.norm;
  }
}

TEST(Guard, LossAlarmPausesOnItsOwn) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  auto d = g.observe(signals(step, 1.0, 6.5, {1.0}));  // 3.25 x the median loss of 2
  EXPECT_EQ(d.action, Action::kPause);
  EXPECT_EQ(d.events.back().detail["reason"], "loss");
  // The pause comes with a warn carrying the diagnosis, though the grad norm stayed in band.
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"warn", "pause"}));
  EXPECT_EQ(d.events[0].detail["alarm"], "loss");
  EXPECT_DOUBLE_EQ(d.events[0].detail["loss_ratio"].get<double>(), 3.25);
  EXPECT_TRUE(d.events[0].detail.contains("verdict"));
}

TEST(Guard, SpikesDoNotPoisonTheirBaseline) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  for (int i = 0; i < 30; ++i) g.observe(signals(step++, 50.0, 2.0, {50.0}));  // all pauses
  EXPECT_DOUBLE_EQ(g.grad_norm_median(), 1.0);
}

TEST(Guard, VerdictGlobalWhenLayersRiseTogetherLocalWhenFew) {
  Guard global(test_config(), {"a", "b", "c", "d"});
  int64_t step = warm(global);
  auto d = global.observe(signals(step, 6.0, 2.0, {6, 6, 5, 6}));
  ASSERT_EQ(kinds(d), std::vector<std::string>{"warn"});
  EXPECT_EQ(d.events[0].detail["verdict"], "global");
  EXPECT_EQ(d.events[0].detail["top_layers"].size(), 3u);

  Guard local(test_config(), {"a", "b", "c", "d"});
  step = warm(local);
  d = local.observe(signals(step, 6.0, 2.0, {1, 1, 30, 1}));
  ASSERT_EQ(kinds(d), std::vector<std::string>{"warn"});
  EXPECT_EQ(d.events[0].detail["verdict"], "local");
  EXPECT_EQ(d.events[0].detail["top_layers"][0]["layer"], "c");
}

TEST(Guard, NonFiniteSkipsThenEscalates) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(g.observe(signals(step, nan)).action, Action::kSkip);
  EXPECT_EQ(g.observe(signals(step, 1.0, std::numeric_limits<double>::infinity())).action,
            Action::kSkip);
  auto d = g.observe(signals(step, nan));
  EXPECT_EQ(d.action, Action::kPause);
  EXPECT_EQ(kinds(d), (std::vector<std::string>{"skip_nan", "pause"}));
  // A finite step resets the count.
  Guard h(test_config(), {"a"});
  step = warm(h);
  h.observe(signals(step, nan));
  h.observe(signals(step, 1.0));
  EXPECT_EQ(h.observe(signals(step, nan)).action, Action::kSkip);
}

TEST(Guard, NanPolicyAbortStopsTheRun) {
  auto cfg = test_config();
  cfg.nan_policy = "abort";
  Guard g(cfg, {"a"});
  EXPECT_THROW(g.observe(signals(0, std::nan(""))), RunStopped);
}

TEST(Guard, RecoveryOverlayThenEnd) {
  Guard g(test_config(), {"a"});
  warm(g);
  EXPECT_DOUBLE_EQ(g.lr_factor(30), 1.0);
  g.on_rollback(10, {{"step", 25}});
  for (int64_t s = 10; s < 15; ++s) EXPECT_DOUBLE_EQ(g.lr_factor(s), 0.25) << s;
  EXPECT_DOUBLE_EQ(g.lr_factor(15), 1.0);
  EXPECT_FALSE(g.after_update(14).has_value());
  auto end = g.after_update(15);
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->kind, "recovery_end");
  EXPECT_FALSE(g.after_update(16).has_value());  // announced once
}

TEST(Guard, MaxRollbacksStopsWithEveryIncident) {
  Guard g(test_config(), {"a"});
  g.on_rollback(10, {{"step", 11}});
  g.on_rollback(10, {{"step", 12}});
  try {
    g.on_rollback(10, {{"step", 13}});
    FAIL() << "third rollback should stop the run";
  } catch (const RunStopped& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("max_rollbacks=2"), std::string::npos) << what;
    EXPECT_NE(what.find("\"step\":11"), std::string::npos) << what;
    EXPECT_NE(what.find("\"step\":13"), std::string::npos) << what;
  }
}

TEST(Guard, PromotionNeedsACleanWindowOutsideRecovery) {
  Guard g(test_config(), {"a", "b", "c", "d"});
  int64_t step = warm(g);
  EXPECT_TRUE(g.promotable(step, 10, true));
  g.observe(signals(step, 6.0, 2.0, {6, 6, 6, 6}));  // warn at step 20
  EXPECT_FALSE(g.promotable(25, 10, true));
  EXPECT_TRUE(g.promotable(25, 10, false));
  EXPECT_TRUE(g.promotable(31, 10, true));
  g.on_rollback(31, {});
  EXPECT_FALSE(g.promotable(33, 10, true));  // recovering
  EXPECT_TRUE(g.promotable(36, 10, true));
}

TEST(Guard, ClipRateWarnsOncePerWindow) {
  auto cfg = test_config();
  cfg.clip_rate_warn = 0.5;
  Guard g(cfg, {"a"});
  int warns = 0;
  for (int64_t s = 0; s < 40; ++s) {
    auto sig = signals(s, 1.0, 2.0, {1.0});
    sig.clipped = s % 4 != 0;  // 75 % of steps clip
    for (auto& e : g.observe(sig).events)
      if (e.detail.value("signal", "") == "clip_rate") ++warns;
  }
  EXPECT_EQ(warns, 2);  // at step 19 and again a window later
}

TEST(Guard, StateRoundTrips) {
  Guard g(test_config(), {"a"});
  warm(g);
  g.on_rollback(5, {{"step", 7}});
  Guard h(test_config(), {"a"});
  h.load_state(g.state());
  EXPECT_EQ(h.state(), g.state());
  EXPECT_DOUBLE_EQ(h.lr_factor(6), 0.25);
}

}  // namespace
}  // namespace keel::guard
