#include "guard/guard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

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
  c.rollback.stuck_steps = config::stuck_steps(c.rollback, 1000);
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

// The attention_drift warnings among observe_periodic's events.
int drift_warns(const std::vector<GuardEvent>& events) {
  int n = 0;
  for (const auto& e : events) n += e.detail.value("signal", "") == "attention_drift";
  return n;
}

std::vector<std::string> kinds(const Decision& d) {
  std::vector<std::string> k;
  for (auto& e : d.events) k.push_back(name_of(e.kind));
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

// Replicas whose reduced gradients disagree: the step is skipped (a hardware_fault naming the
// ranks outside the majority, none with two ranks, when every rank is a suspect), the guard's
// baselines do not move, and a rank's second fault within kDeviceFaultWindow attempts stops the
// run as a faulty device, naming it; faults further apart do not.
TEST(Guard, ReplicasThatDisagreeSkipTheStepAndAFaultyDeviceStopsTheRun) {
  Guard g(test_config(), {"a", "b", "c", "d"});
  int64_t it = warm(g);
  const double median = g.grad_norm_median();
  StepSignals s = signals(it, 1.0);
  s.iteration = it;
  Decision d = g.replicas_disagree(s, {1.0, 1.0, 7.5});
  EXPECT_EQ(d.action, Action::kSkip);
  EXPECT_EQ(d.skip_reason, SkipReason::kHardware);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"hardware_fault"}));
  EXPECT_EQ(d.events[0].detail["ranks"], nlohmann::json::array({2}));
  EXPECT_NE(d.events[0].message.find("rank(s) [2]"), std::string::npos) << d.events[0].message;
  s.iteration = it + kDeviceFaultWindow;  // the first has left the window
  d = g.replicas_disagree(s, {1.0, 2.0});
  EXPECT_EQ(d.action, Action::kSkip);
  EXPECT_TRUE(d.events[0].detail["ranks"].empty()) << "two ranks: no majority, none blamed";
  EXPECT_EQ(g.grad_norm_median(), median);
  // The count is part of the guard's state: a resume keeps it.
  Guard resumed(test_config(), {"a", "b", "c", "d"});
  resumed.load_state(g.state());
  s.iteration += 1;
  d = g.replicas_disagree(s, {1.0, 2.0});
  EXPECT_EQ(d.action, Action::kAbort);
  EXPECT_EQ(d.faulty_ranks, (std::vector<int64_t>{0, 1})) << "both suspects, twice each";
  EXPECT_NE(d.stop_message.find("a faulty device"), std::string::npos) << d.stop_message;
  EXPECT_EQ(resumed.replicas_disagree(s, {1.0, 2.0}).action, Action::kAbort);
  // The stop drops the count of the devices it names: the job starts again without them.
  Guard requeued(test_config(), {"a", "b", "c", "d"});
  requeued.load_state(g.state());
  s.iteration += 1;
  EXPECT_EQ(requeued.replicas_disagree(s, {1.0, 2.0}).action, Action::kSkip);
}

// A replay's verdict: a transient fault is on record and the run goes on; the same rank again
// within the window is a faulty device, another rank is not; a persistent fault stops at once.
TEST(Guard, DeviceFaultsFromAReplayCountPerRank) {
  Guard g(test_config(), {"a", "b", "c", "d"});
  const int64_t it = warm(g);
  Decision d = g.device_fault(it, {1}, /*persistent=*/false, {{"cause", "not_reproduced"}}, "x");
  EXPECT_EQ(d.action, Action::kApply) << "the step goes on with the replay's values";
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"hardware_fault"}));
  EXPECT_EQ(d.events[0].detail["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(d.events[0].message, "x");
  EXPECT_EQ(g.device_fault(it + 5, {2}, false, {}, "y").action, Action::kApply);
  d = g.device_fault(it + kDeviceFaultWindow - 1, {1}, false, {}, "z");
  EXPECT_EQ(d.action, Action::kAbort);
  EXPECT_EQ(d.faulty_ranks, std::vector<int64_t>{1});
  EXPECT_NE(d.stop_message.find("rank 1 computed a wrong result 2 times"), std::string::npos)
      << d.stop_message;
  // The job starts again without rank 1's device: the rank's next device starts with no count,
  // rank 2's stays.
  Guard requeued(test_config(), {"a", "b", "c", "d"});
  requeued.load_state(g.state());
  EXPECT_EQ(requeued.device_fault(it + 10, {1}, false, {}, "v").action, Action::kApply);
  EXPECT_EQ(requeued.device_fault(it + 11, {2}, false, {}, "u").action, Action::kAbort);

  Guard fresh(test_config(), {"a", "b", "c", "d"});
  d = fresh.device_fault(warm(fresh), {3}, /*persistent=*/true, {}, "w");
  EXPECT_EQ(d.action, Action::kAbort);
  EXPECT_EQ(d.faulty_ranks, std::vector<int64_t>{3});
  EXPECT_NE(d.stop_message.find("every time"), std::string::npos) << d.stop_message;
}

// stability.update_gate device: the device refuses an update on pause_levels(), before the host
// has read the step. observe() must refuse exactly the steps past them (finite values, no
// overflow, samples kept), or the device would apply an update the guard refuses. Values land
// on both sides of each level, one ulp apart, in warmup and after.
TEST(Guard, PauseLevelsSayExactlyWhichStepsObserveRefuses) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/15);
  std::mt19937 rng(7);
  std::lognormal_distribution<double> noise(0.0, 0.3);
  const double inf = std::numeric_limits<double>::infinity();
  int refused = 0, at_level = 0;
  int64_t step = 0;
  for (int64_t it = 0; it < 600 && step < 400; ++it) {
    const PauseLevels levels = g.pause_levels(step);
    double norm = noise(rng), loss = 2.0 * noise(rng);
    const int64_t phase = it % 40;
    const double above = phase % 2 ? 1.0 : -1.0;  // one ulp past the level, or one ulp short
    if (phase == 17 || phase == 18)
      norm = levels.grad_norm < inf ? std::nextafter(levels.grad_norm, above * inf) : norm * 30;
    if (phase == 29 || phase == 30)
      loss = levels.loss < inf ? std::nextafter(levels.loss, above * inf) : loss * 5;
    at_level += (phase == 17 || phase == 18) && levels.grad_norm < inf;
    at_level += (phase == 29 || phase == 30) && levels.loss < inf;
    StepSignals s = signals(step, norm, loss, {norm});
    s.iteration = it;
    const bool past = levels.norm_pause(norm) || levels.loss_pause(loss);
    Decision d = g.observe(s);
    ASSERT_EQ(d.action != Action::kApply, past)
        << "iteration " << it << ": norm " << norm << " (level " << levels.grad_norm << "), loss "
        << loss << " (level " << levels.loss << ")";
    refused += past;
    if (d.needs_diagnosis) d = g.resolve(std::move(d), 1.0);  // the data's fault: dropped
    ASSERT_NE(d.action, Action::kAbort) << "iteration " << it;
    if (d.action == Action::kApply) {
      g.after_update(++step);
    }
  }
  EXPECT_GE(refused, 10);
  EXPECT_GE(at_level, 20);  // the levels were finite (baselines set) when probed
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

// A loss jump well under loss_alarm_factor still alarms when the loss has been steady: 1.6x the
// median is 60 robust sigmas out here, but not when the loss swings widely step to step.
TEST(Guard, ASteadyLossThatJumpsAlarms) {
  Guard steady(test_config(), {"a"});
  for (int64_t i = 0; i < 20; ++i) steady.observe(signals(i, 1.0, 2.0 + 0.01 * (i % 3), {1.0}));
  auto d = steady.observe(signals(20, 1.0, 3.2, {1.0}));
  EXPECT_EQ(d.action, Action::kPause);
  EXPECT_EQ(d.events.back().detail["reason"], "loss");
  EXPECT_EQ(steady.observe(signals(21, 1.0, 3.1, {1.0})).action, Action::kPause);  // 1.54x

  Guard noisy(test_config(), {"a"});
  for (int64_t i = 0; i < 20; ++i) noisy.observe(signals(i, 1.0, 2.0 + 0.5 * (i % 3), {1.0}));
  EXPECT_EQ(noisy.observe(signals(20, 1.0, 4.0, {1.0})).action, Action::kApply);  // 1.6x, 3 sigmas
}

// In warmup the same jump only warns (one update of a young Adam can raise the loss 1.7x, and the
// next takes it back); past loss_alarm_factor (3x) it still pauses.
TEST(Guard, ALossJumpInWarmupWarnsAndThreeTimesTheMedianStillPauses) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/40);
  for (int64_t i = 0; i < 20; ++i) g.observe(signals(i, 1.0, 2.0 + 0.01 * (i % 3), {1.0}));
  auto d = g.observe(signals(20, 1.0, 3.2, {1.0}));
  EXPECT_EQ(d.action, Action::kApply);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"warn"}));
  EXPECT_EQ(d.events[0].detail["alarm"], "loss");
  EXPECT_EQ(g.observe(signals(21, 1.0, 6.5, {1.0})).action, Action::kPause);  // 3.2x the median
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
  cfg.nan_policy = config::NanPolicy::kAbort;
  Guard g(cfg, {"a"});
  Decision d = g.observe(signals(0, std::nan("")));
  EXPECT_EQ(d.action, Action::kAbort);
  ASSERT_FALSE(d.events.empty());
  EXPECT_EQ(d.events.back().kind, EventKind::kAbort);  // the trainer records it before it stops
  EXPECT_NE(d.stop_message.find("nan_policy is abort"), std::string::npos) << d.stop_message;
}

TEST(Guard, RecoveryOverlayThenEnd) {
  Guard g(test_config(), {"a"});
  warm(g);
  EXPECT_DOUBLE_EQ(g.lr_factor(30), 1.0);
  g.rolled_back(10);
  for (int64_t s = 10; s < 15; ++s) EXPECT_DOUBLE_EQ(g.lr_factor(s), 0.25) << s;
  EXPECT_DOUBLE_EQ(g.lr_factor(15), 1.0);
  EXPECT_TRUE(g.after_update(14).empty());
  auto end = g.after_update(15);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].kind, EventKind::kRecoveryEnd);
  EXPECT_TRUE(g.after_update(16).empty());  // announced once
}

// A pause-worthy alarm at `step` (attempt `iteration`): a loss 5x the median, on a model that
// `model_ratio` says is worse (> kModelWorse) or no worse than the stable snapshot.
Decision alarm(Guard& g, int64_t step, int64_t iteration, double model_ratio = 2.0) {
  StepSignals s = signals(step, 1.0, 10.0, {1.0});
  s.iteration = iteration;
  Decision d = g.observe(s);
  EXPECT_TRUE(d.action == Action::kAbort || d.needs_diagnosis);
  return g.resolve(std::move(d), model_ratio);
}

// The diagnosis decides the remedy: a model no worse than the stable snapshot gains nothing from
// a rollback, so the step (the data) is dropped; a worse model rolls back.
TEST(Guard, DataAlarmsDropTheStepModelAlarmsRollBack) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  Decision data = alarm(g, step, step, /*model_ratio=*/0.95);
  EXPECT_EQ(data.action, Action::kSkip);
  EXPECT_EQ(data.skip_reason, SkipReason::kData);
  EXPECT_EQ(data.incident, 1);
  EXPECT_EQ(data.events.back().detail["diagnosis"], "data");
  EXPECT_EQ(g.rollbacks(), 0);
  Decision model = alarm(g, step, step + 1, /*model_ratio=*/1.5);
  EXPECT_EQ(model.action, Action::kPause);
  EXPECT_EQ(model.incident, 1);  // the same incident
  EXPECT_EQ(model.events.back().detail["diagnosis"], "model");
  EXPECT_EQ(alarm(g, step, step + 2, std::nan("")).action, Action::kPause);  // unknown: worse

  // A step the screen masked whole: the data unless the model is worse on clean data too.
  Guard h(test_config(), {"a"});
  step = warm(h);
  StepSignals s = signals(step, 1.0, 0.0, {1.0});
  s.samples = 4;
  s.masked_losses = {9, 9, 9, 9};
  s.screen_threshold = 4.0;
  Decision screened = h.observe(s);
  ASSERT_TRUE(screened.needs_diagnosis);
  EXPECT_EQ(h.resolve(screened, 1.0).skip_reason, SkipReason::kScreenedOut);
  EXPECT_FALSE(h.in_incident());
  Decision broken = h.resolve(h.observe(s), 3.0);
  EXPECT_EQ(broken.action, Action::kPause);
  EXPECT_EQ(broken.events.back().detail["reason"], "model");
}

// Alarms before the run has re-earned its lost ground belong to one incident: at most
// max_rollbacks rollbacks, each re-alarm skipping further ahead, then the offending steps are
// skipped instead.
TEST(Guard, AnIncidentEndsInAtMostMaxRollbacksWhateverItsLength) {
  Guard g(test_config(), {"a"});  // max_rollbacks 2
  int64_t step = warm(g);
  Decision first = alarm(g, step, step);
  ASSERT_EQ(first.action, Action::kPause);
  EXPECT_EQ(first.incident, 1);
  EXPECT_EQ(first.skip_ahead_steps, 0);
  g.rolled_back(step - 5);
  Decision second = alarm(g, step - 5, step + 3);  // re-alarm 3 attempts into the incident
  ASSERT_EQ(second.action, Action::kPause);
  EXPECT_EQ(second.incident, 1);
  EXPECT_EQ(second.skip_ahead_steps, 3);  // as far as the incident has lasted
  g.rolled_back(step - 5);
  for (int i = 0; i < 30; ++i) {  // a long bad region: every further alarm drops its step
    Decision d = alarm(g, step - 5, step + 4 + i);
    ASSERT_EQ(d.action, Action::kSkip) << i;
    EXPECT_EQ(d.skip_reason, SkipReason::kIncident);
    EXPECT_EQ(d.incident, 1);
  }
  EXPECT_EQ(g.rollbacks(), 2);
  EXPECT_TRUE(g.in_incident());
  // kIncidentQuietSteps clean updates in a row close it; the next alarm opens incident 2.
  int64_t s = step - 5;
  std::vector<std::string> ends;
  for (int64_t i = 0; i < 20; ++i, ++s) {
    ASSERT_EQ(g.observe(signals(s, 1.0, 2.0, {1.0})).action, Action::kApply);
    for (auto& e : g.after_update(s + 1)) ends.push_back(name_of(e.kind));
  }
  EXPECT_NE(std::find(ends.begin(), ends.end(), "incident_end"), ends.end());
  EXPECT_FALSE(g.in_incident());
  Decision next = alarm(g, s, 500);
  EXPECT_EQ(next.action, Action::kPause);
  EXPECT_EQ(next.incident, 2);
  EXPECT_EQ(g.incidents().size(), 2u);
  EXPECT_EQ(g.incidents()[0]["rollbacks"], 2);
  EXPECT_EQ(g.incidents()[0]["skipped_steps"], 30);
}

// The rollback budget is a rate: incidents spread over a long run are fine, a run that keeps
// meeting trouble stops with every incident in its message.
TEST(Guard, TooManyIncidentsWithinTheWindowStopTheRun) {
  auto cfg = test_config();
  cfg.rollback.max_incidents = 3;
  cfg.rollback.incident_window_steps = 100;
  Guard g(cfg, {"a"});
  int64_t step = warm(g);
  auto incident = [&](int64_t iteration) {
    Decision d = alarm(g, step, iteration);
    if (d.action == Action::kPause) {
      g.rolled_back(step);
      for (int64_t i = 0; i < kIncidentQuietSteps; ++i) {  // clean progress: it closes
        g.observe(signals(step + i, 1.0, 2.0, {1.0}));
        g.after_update(step + i + 1);
      }
    }
    return d;
  };
  for (int64_t it : {100, 250, 400, 550, 700}) EXPECT_EQ(incident(it).action, Action::kPause) << it;
  EXPECT_EQ(incident(720).action, Action::kPause);
  EXPECT_EQ(incident(740).action, Action::kPause);
  Decision d = incident(760);  // 4 incidents within 100 attempts
  ASSERT_EQ(d.action, Action::kAbort);
  EXPECT_EQ(d.events.back().kind, EventKind::kAbort);
  EXPECT_EQ(d.events.back().detail["reason"], "max_incidents");
  EXPECT_EQ(d.events.back().detail["incidents"].size(), 8u);
  EXPECT_NE(d.stop_message.find("max_incidents=3"), std::string::npos) << d.stop_message;
  EXPECT_NE(d.stop_message.find("\"first_iteration\":100"), std::string::npos) << d.stop_message;
}

TEST(Guard, StuckStopsTheRun) {
  auto cfg = test_config();
  cfg.rollback.stuck_steps = 15;
  Guard g(cfg, {"a"});
  int64_t step = warm(g);
  Decision d;
  int64_t it = step;
  for (; it < step + 40 && d.action != Action::kAbort; ++it) {
    StepSignals s = signals(step, 1.0, 2.0, {1.0});
    s.iteration = it;
    s.samples = 4;  // the screen masked every sample
    s.masked_losses = {9, 9, 9, 9};
    s.screen_threshold = 5.0;
    d = g.resolve(g.observe(s), /*model_ratio=*/1.0);  // the data: every sample masked
  }
  ASSERT_EQ(d.action, Action::kAbort);
  EXPECT_EQ(it - step, 15);
  EXPECT_EQ(d.events.back().detail["reason"], "stuck");
}

// The screen's threshold: factor x the median per-sample loss, or median + z robust sigmas when
// the samples spread more; off until the baseline holds min_samples.
TEST(Guard, ScreenThresholdFollowsThePerSampleBaseline) {
  auto cfg = test_config();
  cfg.screen.min_samples = 40;
  cfg.screen.factor = 2.0;
  cfg.screen.z = 6.0;
  Guard g(cfg, {"a"}, /*warmup_steps=*/0, /*samples_per_step=*/4);
  int64_t step = 0;
  for (; step < 9; ++step) {
    StepSignals s = signals(step, 1.0, 2.0, {1.0});
    s.samples = 4;
    s.kept_losses = {1.9, 2.0, 2.0, 2.1};
    g.observe(s);
  }
  EXPECT_FALSE(g.screen_threshold(step).has_value());  // 36 samples < 40
  StepSignals s = signals(step, 1.0, 2.0, {1.0});
  s.samples = 4;
  s.kept_losses = {1.9, 2.0, 2.0, 2.1};
  g.observe(s);
  ASSERT_TRUE(g.screen_threshold(++step).has_value());
  // 2 x the median 2.0; median + 6 x 1.4826 x MAD 0.1 = 2.89 is lower.
  EXPECT_DOUBLE_EQ(*g.screen_threshold(step), 4.0);
  cfg.screen.enabled = false;
  Guard off(cfg, {"a"}, 0, 4);
  EXPECT_FALSE(off.screen_threshold(100).has_value());
}

TEST(Guard, ScreenedSamplesWarnOnceThenReportAndAllMaskedSkips) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  StepSignals s = signals(step, 1.0, 2.0, {1.0});
  s.samples = 8;
  s.kept_losses = {2.0, 2.0, 2.0, 2.0, 2.0, 2.0};
  s.masked_losses = {9.0, 8.0};
  s.screen_threshold = 4.0;
  // Two odd samples are the tail of natural data: masked and reported, not a warning.
  Decision d = g.observe(s);
  EXPECT_EQ(d.action, Action::kApply);  // the kept samples train
  ASSERT_EQ(kinds(d), std::vector<std::string>{"screen"});
  EXPECT_EQ(d.events[0].detail["masked"], 2);
  // Three more in the next step: five within the window is more than the tail explains.
  s.step = ++step;
  s.kept_losses = {2.0, 2.0, 2.0, 2.0, 2.0};
  s.masked_losses = {9.0, 8.0, 7.0};
  d = g.observe(s);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"warn", "screen"}));
  EXPECT_EQ(d.events[0].detail["signal"], "screen");
  EXPECT_EQ(d.events[0].detail["masked_recently"], 5);
  EXPECT_EQ(d.events[0].detail["tail_allowance"], kScreenTailSamples);
  EXPECT_NE(d.events[0].message.find("quarantine.jsonl"), std::string::npos);
  s.step = ++step;
  s.kept_losses.clear();
  s.masked_losses = std::vector<double>(8, 9.0);
  d = g.observe(s);
  EXPECT_EQ(kinds(d), std::vector<std::string>{"screen"});  // no second warn right away
  EXPECT_EQ(d.action, Action::kSkip);
  EXPECT_EQ(d.skip_reason, SkipReason::kScreenedOut);
}

// One odd sample every few steps, for as long as the run lasts, is never a warning; the same
// samples arriving together are.
TEST(Guard, AThinTailOfOddSamplesNeverWarns) {
  Guard g(test_config(), {"a"});
  int64_t step = warm(g);
  for (int i = 0; i < 400; ++i) {
    StepSignals s = signals(++step, 1.0, 2.0, {1.0});
    s.samples = 16;
    s.screen_threshold = 4.0;
    s.kept_losses.assign(i % 7 == 0 ? 15 : 16, 2.0);
    if (i % 7 == 0) s.masked_losses = {5.0};
    for (const auto& e : g.observe(s).events) ASSERT_NE(e.kind, EventKind::kWarn) << i;
  }
}

// fp16: start-up overflows are the scaler calibrating, not NaN incidents; later, repeated drops
// within a window warn (with the default growth interval the scale rises once per 2,000 steps, so
// the warning must not need rises).
TEST(Guard, Fp16OverflowsAreTheScalersBusinessAndRepeatedDropsWarn) {
  Guard g(test_config(), {"a"});
  double scale = 65536;
  for (int i = 0; i < 12; ++i, scale /= 2) {  // start-up: 12 overflows in a row
    StepSignals s = signals(0, std::numeric_limits<double>::infinity(), 5.5, {1.0});
    s.overflow = true;
    s.loss_scale = scale;
    Decision d = g.observe(s);
    EXPECT_EQ(d.action, Action::kSkip) << i;
    EXPECT_EQ(d.skip_reason, SkipReason::kOverflow);
    EXPECT_EQ(kinds(d), std::vector<std::string>{"overflow"});
  }
  int64_t step = 0;
  int warns = 0;
  for (; step < 60; ++step) {
    StepSignals s = signals(step, 1.0, 2.0, {1.0});
    s.loss_scale = scale;
    s.overflow = step == 30 || step == 36 || step == 42;  // 3 within a window of 20
    if (s.overflow) s.grad_norm = std::numeric_limits<double>::infinity();
    for (auto& e : g.observe(s).events) warns += e.detail.value("signal", "") == "loss_scale";
    if (s.overflow) scale /= 2;
  }
  EXPECT_EQ(warns, 1);
  // A collapsed scale is no longer the scaler's business: the step is non-finite.
  StepSignals s = signals(step, std::numeric_limits<double>::infinity(), 2.0, {1.0});
  s.overflow = true;
  s.loss_scale = 1.0;
  EXPECT_EQ(kinds(g.observe(s)).front(), "skip_nan");
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
    // A quarter of the steps clip, then every one: the clip-rate warning fires, then is
    // suppressed.
    s.clipped = step >= 20 || step % 4 == 0;
    s.loss_scale = (step % 7 == 0) ? 1024.0 : 2048.0;  // drops and rises
    return g.observe(s);
  };
  auto kinds = [](const Decision& d) {
    std::string out;
    for (const auto& e : d.events)
      out += std::string(name_of(e.kind)) +
             (e.detail.contains("signal") ? ":" + e.detail["signal"].get<std::string>() : "") + ",";
    return out;
  };
  int64_t step = 0;
  std::string history;
  for (; step < 45; ++step) history += kinds(feed(a, step));
  ASSERT_NE(history.find("warn:clip_rate"), std::string::npos) << history;
  a.rolled_back(step);  // recovery starts

  Guard b(cfg, {"a", "b"});
  b.load_state(nlohmann::json::parse(a.state().dump()));  // through text, as a checkpoint does
  for (int64_t i = 0; i < 60; ++i, ++step) {
    EXPECT_EQ(kinds(feed(a, step)), kinds(feed(b, step))) << "step " << step;
    EXPECT_EQ(a.lr_factor(step), b.lr_factor(step)) << "step " << step;
    EXPECT_EQ(a.after_update(step + 1).size(), b.after_update(step + 1).size()) << step;
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
  g.rolled_back(31);
  EXPECT_FALSE(g.promotable(33, 10, true));  // recovering
  EXPECT_TRUE(g.promotable(36, 10, true));
}

// Runs a guard (window 20, clip_rate_warn 50 %) over steps [0, steps) clipped where `clipped`
// says; returns the steps the clip rate warned at, and the last warning's message.
std::vector<int64_t> clip_warns(const std::function<bool(int64_t)>& clipped, int64_t steps,
                                int64_t warmup_steps = 0, std::string* message = nullptr) {
  auto cfg = test_config();
  cfg.clip_rate_warn = 0.5;
  Guard g(cfg, {"a"}, warmup_steps);
  std::vector<int64_t> warned;
  for (int64_t s = 0; s < steps; ++s) {
    auto sig = signals(s, 1.0, 2.0, {1.0});
    sig.clipped = clipped(s);
    for (auto& e : g.observe(sig).events)
      if (e.detail.value("signal", "") == "clip_rate") {
        warned.push_back(s);
        if (message) *message = e.message;
      }
  }
  return warned;
}

// After a window that teaches the run's rate (25 %), the newest window warns past both
// clip_rate_warn's binomial noise (0.5 + 3.72 x sqrt(0.25 / 20): 18 of 20) and what the learned
// rate explains (lambda 5: 5 + 4 sqrt(5) + 4, 17): 75 % is noise, 100 % warns, once per window.
TEST(Guard, ClipRateWarnsOncePerWindowPastTheWindowsNoise) {
  EXPECT_EQ(clip_warns([](int64_t s) { return s < 20 ? s % 4 == 0 : s % 4 != 0; }, 61),
            std::vector<int64_t>{});
  std::string message;
  EXPECT_EQ(clip_warns([](int64_t s) { return s >= 20 || s % 4 == 0; }, 61, 0, &message),
            (std::vector<int64_t>{39, 59}));  // a warned window never teaches the rate
  // What it saw, against what, and where to look.
  EXPECT_NE(message.find("20 of the last 20 steps, more than the 18"), std::string::npos)
      << message;
  EXPECT_NE(message.find("own clip rate since warmup (25 %)"), std::string::npos) << message;
  EXPECT_NE(message.find("look at the data"), std::string::npos) << message;
}

// Clipping during warmup is by design and teaches nothing; the run's own rate after it is its
// setup's (a corpus whose norms sit above optim.grad_clip clips on most steps): silent, however
// high, until it rises past what that rate explains.
TEST(Guard, ClipRateLearnsTheRunsOwnRateAfterWarmup) {
  // Always clipped in a warmup of 30, a quarter of the steps for a window, then always: the
  // window after the one that taught 25 % warns (had warmup taught, 70 % would explain it).
  EXPECT_EQ(clip_warns([](int64_t s) { return s < 30 || s >= 50 || s % 4 == 0; }, 80, 30),
            std::vector<int64_t>{69});
  // 95 % from the start, and every step clipped: never a warning.
  EXPECT_EQ(clip_warns([](int64_t s) { return s % 20 != 0; }, 400, 30), std::vector<int64_t>{});
  EXPECT_EQ(clip_warns([](int64_t) { return true; }, 400, 30), std::vector<int64_t>{});
}

// Early in training the gradient norm jumps by an order of magnitude as the model leaves its
// first plateau: during warmup that warns (with what it saw) but never pauses; after it, it does.
TEST(Guard, AGradNormJumpInWarmupWarnsButDoesNotPause) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/40);
  int64_t step = warm(g);  // steps 0-19
  Decision d = g.observe(signals(step, 30.0, 2.0, {30.0}));
  EXPECT_EQ(d.action, Action::kApply);
  ASSERT_EQ(kinds(d), (std::vector<std::string>{"warn"}));
  const std::string message = d.events[0].message;
  EXPECT_NE(message.find("30.0x its running median 1"), std::string::npos) << message;
  EXPECT_NE(message.find("after the warmup"), std::string::npos) << message;

  Guard h(test_config(), {"a"}, /*warmup_steps=*/20);
  step = warm(h);  // the warmup is over
  EXPECT_EQ(h.observe(signals(step, 30.0, 2.0, {30.0})).action, Action::kPause);
}

// The same grad-norm alarm on different batches in a row, the loss at its median and the model
// no worse on clean data: the model's gradient scale moved, not the data. Dropping batches would
// stall the run until it stops as stuck; after a quarter of stuck_steps (here 3) the step is
// applied and the median restarts from it.
TEST(Guard, AGradNormLevelThatPersistsAcrossBatchesIsTheModelNotTheData) {
  auto cfg = test_config();
  cfg.rollback.stuck_steps = 12;
  Guard g(cfg, {"a"});
  int64_t step = warm(g);
  auto high = [&](int64_t it) {
    StepSignals s = signals(step, 30.0, 2.0, {30.0});
    s.iteration = it;
    return g.resolve(g.observe(s), /*model_ratio=*/1.0);
  };
  EXPECT_EQ(high(step).skip_reason, SkipReason::kData);
  EXPECT_EQ(high(step + 1).skip_reason, SkipReason::kData);
  Decision third = high(step + 2);
  EXPECT_EQ(third.action, Action::kApply);
  ASSERT_EQ(kinds(third), (std::vector<std::string>{"warn", "warn"}));  // the alarm, the verdict
  EXPECT_EQ(third.events[1].detail["signal"], "grad_scale");
  EXPECT_EQ(third.events[1].detail["batches"], 3);
  // The new level is the baseline now: no alarm at it, and the loss alarm still works.
  StepSignals next = signals(step + 1, 30.0, 2.0, {30.0});
  next.iteration = step + 3;
  EXPECT_EQ(g.observe(next).action, Action::kApply);
  next.loss = 10.0;
  EXPECT_EQ(g.observe(next).action, Action::kPause);

  // A loss that rose with the norm is not a moved scale: the data keeps being dropped.
  Guard h(cfg, {"a"});
  step = warm(h);
  for (int64_t it = step; it < step + 5; ++it) {
    StepSignals s = signals(step, 30.0, 2.6, {30.0});  // 1.3x the median loss
    s.iteration = it;
    EXPECT_EQ(h.resolve(h.observe(s), 1.0).skip_reason, SkipReason::kData) << it;
  }
}

// Attention statistics grow while a model learns: a trend that follows them stays quiet, a jump
// that lasts warns after kDriftPersistence log steps, and nothing warns during warmup.
TEST(Guard, AttentionDriftFollowsTheTrendAndWarnsOnALastingJump) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/50);
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

// A layer whose attention output naturally jumps 5x for two log steps in every six (the fixed 3x
// bar alone warns at each pair) raises its bar to about 13x from its own deviations, and is
// silent until it knows them; a jump far past its variability still warns.
TEST(Guard, AttentionDriftBarFollowsTheLayersOwnVariability) {
  Guard g(test_config(), {"a"}, /*warmup_steps=*/20);
  int warns = 0;
  int64_t step = 10;
  for (int i = 0; i < 200; ++i, step += 10) {
    const double jumpy[] = {1.0, 1.0, 1.0, 1.0, 5.0, 5.0};
    warns += drift_warns(g.observe_periodic(step, {}, {0.1 * jumpy[i % 6]}));
  }
  EXPECT_EQ(warns, 0);
  int64_t warned_at = -1;
  for (int i = 0; i < 6 && warned_at < 0; ++i, step += 10)
    if (drift_warns(g.observe_periodic(step, {}, {0.1 * 200})) > 0) warned_at = i;
  EXPECT_EQ(warned_at, kDriftPersistence - 1);
}

// TailRate judges the newest window against the rate of the windows before it.
TEST(TailRate, AllowanceFromTheRateOfEarlierWindows) {
  TailRate t(/*window=*/10, /*windows=*/4);
  for (int i = 0; i < 10; ++i) t.push(1.0, 10.0, /*learn=*/true);  // 10 % in the tail
  EXPECT_FALSE(t.learned());
  EXPECT_EQ(t.allowance(4), 4);
  EXPECT_DOUBLE_EQ(t.recent_count(), 10.0);
  for (int i = 0; i < 10; ++i) t.push(0.0, 10.0, /*learn=*/false);  // not taught: an incident
  EXPECT_TRUE(t.learned());
  EXPECT_DOUBLE_EQ(t.recent_count(), 0.0);
  // lambda = 0.1 x 100 samples = 10: 10 + 4 x sqrt(10) + 4 = 26.6.
  EXPECT_EQ(t.allowance(4), 26);
  for (int i = 0; i < 10; ++i) t.push(0.0, 10.0, true);  // the untaught window left: rate unchanged
  EXPECT_EQ(t.allowance(4), 26);
  TailRate back(10, 4);
  back.load_state(nlohmann::json::parse(t.state().dump()));
  EXPECT_EQ(back.allowance(4), 26);
  EXPECT_EQ(back.recent_steps(), 10);
  // Resumed with a shorter window: the steps beyond it retire (and teach) at once.
  TailRate shorter(5, 4);
  shorter.load_state(nlohmann::json::parse(t.state().dump()));
  EXPECT_EQ(shorter.recent_steps(), 5);
}

// A window that warned never teaches the rate: a bad source cannot raise the bar that flags it.
TEST(TailRate, AWarnedWindowDoesNotTeachTheRate) {
  TailRate t(10, 4);
  for (int i = 0; i < 20; ++i) t.push(0.0, 10.0, true);
  ASSERT_TRUE(t.learned());
  EXPECT_EQ(t.allowance(4), 4);                          // lambda 0: 0 + 0 + 4
  for (int i = 0; i < 10; ++i) t.push(5.0, 10.0, true);  // half the samples in the tail
  t.forget_recent();
  for (int i = 0; i < 10; ++i) t.push(0.0, 10.0, true);
  EXPECT_EQ(t.allowance(4), 4);
}

TEST(Guard, StateRoundTrips) {
  Guard g(test_config(), {"a"});
  warm(g);
  g.rolled_back(5);
  Guard h(test_config(), {"a"});
  h.load_state(g.state());
  EXPECT_EQ(h.state(), g.state());
  EXPECT_DOUBLE_EQ(h.lr_factor(6), 0.25);
}

}  // namespace
}  // namespace keel::guard
