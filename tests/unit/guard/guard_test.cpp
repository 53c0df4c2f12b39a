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
  Decision d = g.observe(signals(0, std::nan("")));
  EXPECT_EQ(d.action, Action::kAbort);
  ASSERT_FALSE(d.events.empty());
  EXPECT_EQ(d.events.back().kind, "abort");  // the trainer records it before it stops
  EXPECT_NE(d.stop_message.find("nan_policy is abort"), std::string::npos) << d.stop_message;
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
  EXPECT_EQ(g.on_rollback(10, {{"step", 11}}).action, Action::kApply);
  EXPECT_EQ(g.on_rollback(10, {{"step", 12}}).action, Action::kApply);
  Decision d = g.on_rollback(10, {{"step", 13}});
  ASSERT_EQ(d.action, Action::kAbort) << "third rollback should stop the run";
  const std::string& what = d.stop_message;
  EXPECT_NE(what.find("max_rollbacks=2"), std::string::npos) << what;
  EXPECT_NE(what.find("\"step\":11"), std::string::npos) << what;
  EXPECT_NE(what.find("\"step\":13"), std::string::npos) << what;
  ASSERT_EQ(d.events.size(), 1u);
  EXPECT_EQ(d.events[0].kind, "abort");
  EXPECT_EQ(d.events[0].detail["reason"], "max_rollbacks");
  EXPECT_EQ(d.events[0].detail["incidents"].size(), 3u);
}

// A guard restored from state() decides exactly as the one it was taken from: inside a clip-rate
// warn window (suppressed repeats), with a loss-scale history, and inside recovery.
TEST(Guard, RestoredStateDecidesExactlyAsTheOriginal) {
  auto cfg = test_config();
  cfg.clip_rate_warn = 0.5;
  Guard a(cfg, {"a", "b"});
  auto feed = [](Guard& g, int64_t step) {
    StepSignals s = signals(step, 1.0 + 0.01 * (step % 3));
    s.layer_grad_norms = {0.5, 0.5};
    s.clipped = true;  // always clipped: the clip-rate warning fires, then is suppressed
    s.loss_scale = (step % 7 == 0) ? 1024.0 : 2048.0;  // drops and rises
    return g.observe(s);
  };
  auto kinds = [](const Decision& d) {
    std::string out;
    for (const auto& e : d.events)
      out += e.kind +
             (e.detail.contains("signal") ? ":" + e.detail["signal"].get<std::string>() : "") + ",";
    return out;
  };
  int64_t step = 0;
  std::string history;
  for (; step < 45; ++step) history += kinds(feed(a, step));
  ASSERT_NE(history.find("warn:clip_rate"), std::string::npos) << history;
  EXPECT_EQ(a.on_rollback(step, {{"step", step}}).action, Action::kApply);  // recovery starts

  Guard b(cfg, {"a", "b"});
  b.load_state(nlohmann::json::parse(a.state().dump()));  // through text, as a checkpoint does
  for (int64_t i = 0; i < 60; ++i, ++step) {
    EXPECT_EQ(kinds(feed(a, step)), kinds(feed(b, step))) << "step " << step;
    EXPECT_EQ(a.lr_factor(step), b.lr_factor(step)) << "step " << step;
    EXPECT_EQ(a.after_update(step + 1).has_value(), b.after_update(step + 1).has_value()) << step;
  }
  EXPECT_EQ(a.state().dump(), b.state().dump());
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
  std::string message;
  for (int64_t s = 0; s <= 40; ++s) {
    auto sig = signals(s, 1.0, 2.0, {1.0});
    sig.clipped = s % 4 != 0;  // 75 % of steps clip
    for (auto& e : g.observe(sig).events)
      if (e.detail.value("signal", "") == "clip_rate") {
        ++warns;
        message = e.detail["message"];
      }
  }
  EXPECT_EQ(warns, 2);  // at step 20 and again a window later
  // What it saw, against what, and where to look.
  EXPECT_NE(message.find("75 % of the last 20 steps"), std::string::npos) << message;
  EXPECT_NE(message.find("look at the data"), std::string::npos) << message;
}

// Clipping during warmup is by design: the window must lie wholly after it before rates count.
TEST(Guard, ClipRateIsSilentDuringAndJustAfterWarmup) {
  auto cfg = test_config();
  cfg.clip_rate_warn = 0.5;
  Guard g(cfg, {"a"}, /*warmup_steps=*/30);
  int64_t first_warn = -1;
  for (int64_t s = 0; s < 80 && first_warn < 0; ++s) {
    auto sig = signals(s, 1.0, 2.0, {1.0});
    sig.clipped = true;
    for (auto& e : g.observe(sig).events)
      if (e.detail.value("signal", "") == "clip_rate") first_warn = s;
  }
  EXPECT_EQ(first_warn, 50);  // warmup 30 + a window of 20
}

// Attention statistics grow while a model learns: a trend that follows them stays quiet, a jump
// that lasts warns after kDriftPersistence log steps, and nothing warns during warmup.
TEST(Guard, AttentionDriftFollowsTheTrendAndWarnsOnALastingJump) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/50);
  auto drift_warns = [](const std::vector<GuardEvent>& events) {
    int n = 0;
    for (const auto& e : events) n += e.detail.value("signal", "") == "attention_drift";
    return n;
  };
  double std_value = 0.05;
  int warns = 0;
  int64_t step = 10;
  for (; step <= 1000; step += 10) {  // healthy: 8 % growth per log step, 2,000x overall
    std_value *= 1.08;
    warns += drift_warns(g.observe_periodic(step, {}, {std_value}));
  }
  EXPECT_EQ(warns, 0);
  std_value *= 6;  // a lasting jump
  int64_t warned_at = -1;
  for (int i = 0; i < 6 && warned_at < 0; ++i, step += 10)
    if (drift_warns(g.observe_periodic(step, {}, {std_value})) > 0) warned_at = i;
  EXPECT_EQ(warned_at, kDriftPersistence - 1);

  Guard early(test_config(), {"a"}, /*warmup_steps=*/500);
  warns = 0;
  for (int64_t s = 10; s < 500; s += 10)
    warns += drift_warns(early.observe_periodic(s, {}, {s < 200 ? 0.05 : 0.5}));
  EXPECT_EQ(warns, 0) << "no drift warning while the lr ramps up";
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
