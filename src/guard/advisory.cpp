// The guard's advisory signals: they warn, never pause. The screen's tail (more samples masked
// than natural text explains), repeated data (content seen under another id, samples far below
// the baseline, a periodic dip in the loss), the clip rate and the fp16 loss scale (drops close
// together, or a slow decline), and at log steps the per-layer update ratios and the
// attention-output drift against its trend.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "guard/guard.h"

namespace keel::guard {
namespace {

// What a window of `samples` samples may hold of a tail before it says anything: the odd
// document, kScreenTailSamples of them or kScreenTailShare of the samples.
int64_t fixed_tail_allowance(double samples) {
  return std::max<int64_t>(kScreenTailSamples, static_cast<int64_t>(kScreenTailShare * samples));
}

}  // namespace

// Every masked step gets a `screen` event (the trainer adds the sample ids). A warning, with what
// it saw and where to look, comes when the screen masks more than the natural tail explains (the
// fixed allowance, and past it the run's own rate of masked samples outside incidents) and it has
// not warned within median_window steps.
void Guard::watch_screen(const StepSignals& s, Decision& d) {
  if (!s.screen_threshold) return;
  const bool quiet_before =
      last_screen_warn_step_ < 0 || s.step - last_screen_warn_step_ > cfg_.median_window;
  screen_tail_.push(static_cast<double>(s.masked_losses.size()), static_cast<double>(s.samples),
                    /*learn=*/s.step >= warmup_steps_ && !open_ && quiet_before);
  if (s.masked_losses.empty()) return;
  const double median = sample_losses_.median();
  const double worst = *std::max_element(s.masked_losses.begin(), s.masked_losses.end());
  nlohmann::json detail = {{"masked", s.masked_losses.size()},
                           {"samples", s.samples},
                           {"threshold", *s.screen_threshold},
                           {"median", median},
                           {"max_loss", worst}};
  if (open_) detail["incident"] = open_->id;
  last_screen_step_ = s.step;
  const auto masked_recently = static_cast<int64_t>(screen_tail_.recent_count());
  const int64_t tail_allowance =
      screen_tail_.allowance(fixed_tail_allowance(screen_tail_.recent_samples()));
  if (masked_recently > tail_allowance && quiet_before) {
    last_screen_warn_step_ = s.step;
    screen_tail_.forget_recent();
    nlohmann::json warn = detail;
    warn["signal"] = "screen";
    warn["masked_recently"] = masked_recently;
    warn["tail_allowance"] = tail_allowance;
    const std::string message = fmt::format(
        "the screen masked {} samples in the last {} steps, more than the {} a natural tail of "
        "odd documents explains; this step {} of {} had a loss above {:.3f} ({:.1f}x the median "
        "per-sample loss {:.3f}; worst {:.3f}). They were left out of the update and set aside in "
        "quarantine.jsonl: look at those samples' source (a corrupt shard, a broken converter, one "
        "site's crawl)",
        masked_recently, screen_tail_.recent_steps(), tail_allowance, s.masked_losses.size(),
        s.samples, *s.screen_threshold, *s.screen_threshold / median, median, worst);
    d.events.push_back({EventKind::kWarn, std::move(warn), message});
    d.events.back().about_screened_samples = true;
  }
  d.events.push_back({EventKind::kScreen, std::move(detail)});
  d.events.back().about_screened_samples = true;
}

// What became of the low side's samples, for its warnings.
std::string Guard::low_side_fate() const {
  return cfg_.screen.low == config::LowScreen::kQuarantine
             ? "They were left out of the update and set aside in quarantine.jsonl"
             : "As repeats they were left in (stability.screen.low: warn; quarantine masks them)";
}

void Guard::watch_repeats(const StepSignals& s, Decision& d) {
  watch_repeated_ids(s, d);
  watch_low_losses(s, d);
}

void Guard::watch_repeated_ids(const StepSignals& s, Decision& d) {
  repeat_tail_.push(static_cast<double>(s.repeated), static_cast<double>(s.samples),
                    /*learn=*/false);
  const auto repeated_recently = static_cast<int64_t>(repeat_tail_.recent_count());
  const int64_t repeat_allowance = fixed_tail_allowance(repeat_tail_.recent_samples());
  if (s.repeated > 0 && repeated_recently > repeat_allowance &&
      (last_repeat_warn_step_ < 0 || s.step - last_repeat_warn_step_ >= cfg_.median_window)) {
    last_repeat_warn_step_ = s.step;
    d.events.push_back(
        {EventKind::kWarn,
         {{"signal", "repeated_data"},
          {"repeated", s.repeated},
          {"samples", s.samples},
          {"repeated_recently", repeated_recently},
          {"tail_allowance", repeat_allowance}},
         fmt::format("{} of this step's {} samples repeat the tokens of samples seen before under "
                     "other ids: the same documents coming back. {}. Look at where the named "
                     "samples and the ones they repeat come from: a shard listed twice, a corpus "
                     "never deduplicated, a loader that wraps early",
                     s.repeated, s.samples, low_side_fate())});
    d.events.back().about_low_samples = true;
  }
}

void Guard::watch_low_losses(const StepSignals& s, Decision& d) {
  if (!s.low_threshold) return;
  // While the lr ramps up the loss falls fast and the baseline lags behind it: not counted.
  const bool past_warmup = s.step >= warmup_steps_;
  const auto low_now = static_cast<double>(s.low_losses.size());
  const bool quiet_before =
      last_low_warn_step_ < 0 || s.step - last_low_warn_step_ > cfg_.median_window;
  low_tail_.push(past_warmup ? low_now : 0.0, static_cast<double>(s.samples),
                 /*learn=*/past_warmup && !open_ && quiet_before);
  // Silent until the run knows its own low tail (two windows after warmup: one to teach it, and
  // the newest, judged against it).
  if (s.low_losses.empty() || !past_warmup || !low_tail_.learned()) return;
  const auto low_recently = static_cast<int64_t>(low_tail_.recent_count());
  const int64_t tail_allowance =
      low_tail_.allowance(fixed_tail_allowance(low_tail_.recent_samples()));
  if (low_recently <= tail_allowance || !quiet_before) return;
  last_low_warn_step_ = s.step;
  low_tail_.forget_recent();
  const double median = sample_losses_.median();
  const double lowest = *std::min_element(s.low_losses.begin(), s.low_losses.end());
  d.events.push_back(
      {EventKind::kWarn,
       {{"signal", "low_loss"},
        {"low", s.low_losses.size()},
        {"samples", s.samples},
        {"threshold", *s.low_threshold},
        {"median", median},
        {"min_loss", lowest},
        {"low_recently", low_recently},
        {"tail_allowance", tail_allowance}},
       fmt::format("{} samples in the last {} steps had a loss below {:.3f} ({:.2f}x the median "
                   "per-sample loss {:.3f}; lowest this step {:.3f}), more than the {} a natural "
                   "tail explains: memorised or repeated documents. {}. Look at the named "
                   "samples' sources for near-duplicates",
                   low_recently, low_tail_.recent_steps(), *s.low_threshold,
                   *s.low_threshold / median, median, lowest, tail_allowance, low_side_fate())});
  d.events.back().about_low_samples = true;
}

void Guard::watch_periodicity(const StepSignals& s, Decision& d) {
  if (s.step < warmup_steps_ ||
      (last_period_warn_step_ >= 0 && s.step - last_period_warn_step_ < cfg_.median_window))
    return;
  const auto found = periodicity_.detect();
  if (!found) return;
  last_period_warn_step_ = s.step;
  d.events.push_back(
      {EventKind::kWarn,
       {{"signal", "loss_periodicity"},
        {"period", found->period},
        {"correlation", found->correlation},
        {"dip_sigmas", found->dip},
        {"loss", s.loss},
        {"window", kPeriodWindow}},
       fmt::format("the loss dips every {} steps (autocorrelation {:.2f} over the last {} "
                   "applied steps; this step is {:.1f} robust standard deviations below its "
                   "trend): the same data coming back on a schedule. This step's lowest-loss "
                   "samples are named; look for a source that recurs",
                   found->period, found->correlation, kPeriodWindow, -found->dip)});
  d.events.back().about_low_samples = true;
}

// The rate signals (clip rate, fp16 loss scale) warn at most once per median_window steps.
bool Guard::rate_may_warn(int64_t step) const {
  return last_rate_warn_step_ < 0 || step - last_rate_warn_step_ >= cfg_.median_window;
}

void Guard::rate_warn(int64_t step, Decision& d, nlohmann::json detail, std::string message) {
  d.events.push_back({EventKind::kWarn, std::move(detail), std::move(message)});
  last_rate_warn_step_ = step;
}

void Guard::watch_rates(const StepSignals& s, Decision& d) {
  watch_clip_rate(s, d);
  watch_loss_scale(s, d);
}

void Guard::watch_clip_rate(const StepSignals& s, Decision& d) {
  // Clipping fires often while the lr ramps up, by design: only steps after the warmup teach the
  // run's clip rate, and the newest window is judged once a whole window has taught it.
  const double p = cfg_.clip_rate_warn;
  const auto window = static_cast<double>(cfg_.median_window);
  const double bound = p + kRateZ * std::sqrt(p * (1.0 - p) / window);
  const auto clipped = static_cast<int64_t>(clip_tail_.recent_count());
  const int64_t allowance = clip_tail_.allowance(static_cast<int64_t>(bound * window));
  if (!s.overflow && rate_may_warn(s.step) && clip_tail_.learned() &&
      clip_tail_.recent_steps() >= cfg_.median_window && clipped > allowance) {
    const double rate = static_cast<double>(clipped) / window;
    last_clip_warn_step_ = s.step;
    clip_tail_.forget_recent();
    rate_warn(
        s.step, d,
        {{"signal", "clip_rate"},
         {"clip_rate", rate},
         {"window", cfg_.median_window},
         {"threshold", cfg_.clip_rate_warn},
         {"bound", bound},
         {"learned_rate", clip_tail_.rate()},
         {"allowance", allowance}},
        fmt::format("gradient clipping fired on {} of the last {} steps, more than the {} that "
                    "stability.clip_rate_warn {:.0f} % and this run's own clip rate since warmup "
                    "({:.0f} %) explain: look at the data (a bad region raises every norm) or the "
                    "schedule (lr too high for this batch); raising optim.grad_clip only hides it",
                    clipped, cfg_.median_window, allowance, p * 100, clip_tail_.rate() * 100));
  }
}

// fp16: overflows at start-up calibrate the scale; after the first update, repeated overflows
// mean the gradients keep leaving fp16's range.
void Guard::watch_loss_scale(const StepSignals& s, Decision& d) {
  if (!s.loss_scale) return;
  last_loss_scale_ = s.loss_scale;
  if (applied_any_ && *s.loss_scale > 0) scale_log2_.push(std::log2(*s.loss_scale));
  const double drops = scale_drops_.sum();
  // A decline fitted over the whole window: single drops far apart, which the count below never
  // sees, add up to a trend.
  const double decline = scale_log2_.slope() * static_cast<double>(scale_log2_.size() - 1);
  if (rate_may_warn(s.step) && scale_log2_.size() >= scale_log2_.capacity() &&
      decline <= -kScaleTrendHalvings && drops < kScaleDropsWarn) {
    rate_warn(
        s.step, d,
        {{"signal", "loss_scale_trend"},
         {"loss_scale", *s.loss_scale},
         {"halvings", -decline},
         {"window", scale_log2_.size()}},
        fmt::format("the fp16 loss scale has been falling: {:.1f} halvings over the last {} "
                    "steps (now {}), the gradients growing toward fp16's limit a little at a "
                    "time; look at growing activations or weights (z-loss, qk_norm, weight decay) "
                    "before they overflow for good; bf16 has the range fp16 lacks",
                    -decline, scale_log2_.size(), *s.loss_scale));
    return;
  }
  if (rate_may_warn(s.step) && drops >= kScaleDropsWarn)
    rate_warn(
        s.step, d,
        {{"signal", "loss_scale"},
         {"loss_scale", *s.loss_scale},
         {"drops", drops},
         {"window", cfg_.median_window}},
        fmt::format("the fp16 loss scale dropped {:.0f} times in the last {} steps (now {}): "
                    "gradients keep overflowing fp16; do not just lower the lr: look at the "
                    "data first (a bad region raises gradients), then at growing activations; "
                    "bf16 has the range fp16 lacks",
                    drops, cfg_.median_window, *s.loss_scale));
}

std::vector<GuardEvent> Guard::observe_periodic(int64_t step,
                                                const std::vector<double>& update_ratios,
                                                const std::vector<double>& attention_std,
                                                double lr) {
  std::vector<GuardEvent> events;
  // An open incident or its recovery is the alarm path's (a transient spike the rollback undid
  // is not the schedule's failure); the watch reads the model again once it has closed.
  if (auto growth =
          open_ || in_recovery(step) ? std::nullopt : schedule_.observe(step, lr, attention_std))
    events.push_back(
        {EventKind::kWarn, *growth,
         fmt::format("the attention output of layer {} is {:.0f}x its value at "
                     "initialisation at lr {:.3g} (warns at {:.0f}x; at {:.0f}x the "
                     "guard backs the schedule off): the lr is high for this model",
                     growth->at("layer").get<int64_t>(), growth->at("growth").get<double>(), lr,
                     kGrowthWarn, kGrowthAlarm)});
  // While the lr ramps up, update ratios and activation statistics move by design: the trend
  // follows them, nothing warns.
  const bool may_warn =
      step > warmup_steps_ &&
      (last_periodic_warn_step_ < 0 || step - last_periodic_warn_step_ >= cfg_.median_window);
  watch_update_ratios(step, update_ratios, may_warn, events);
  watch_attention(step, attention_std, may_warn && events.empty(), events);
  return events;
}

void Guard::watch_update_ratios(int64_t step, const std::vector<double>& update_ratios,
                                bool may_warn, std::vector<GuardEvent>& events) {
  for (size_t i = 0; may_warn && i < update_ratios.size(); ++i) {
    // Advisory: a large update ratio says the lr is high for these weights; it does not block
    // stable promotion the way a gradient or loss alarm does.
    if (update_ratios[i] <= cfg_.update_ratio_alarm) continue;
    last_periodic_warn_step_ = step;
    const std::string layer = i < layer_names_.size() ? layer_names_[i] : "";
    events.push_back({EventKind::kWarn,
                      {{"signal", "update_ratio"},
                       {"layer", layer},
                       {"update_ratio", update_ratios[i]},
                       {"threshold", cfg_.update_ratio_alarm}},
                      fmt::format("one update changed {} by {:.1f} % of its norm (warns above "
                                  "{:.1f} %): the lr is high for these weights; look at the "
                                  "schedule",
                                  layer, update_ratios[i] * 100, cfg_.update_ratio_alarm * 100)});
    return;
  }
}

void Guard::watch_attention(int64_t step, const std::vector<double>& attention_std, bool may_warn,
                            std::vector<GuardEvent>& events) {
  const bool past_warmup = step > warmup_steps_;
  // The attention trend settles for a window after the ramp (measured: a clean text run's
  // attention output still jumped 4x its trend 20 steps after a 40-step warmup).
  const bool drift_settled = step > warmup_steps_ + cfg_.median_window;
  if (attention_trend_.size() != attention_std.size()) {
    attention_trend_.assign(attention_std.size(), std::numeric_limits<double>::quiet_NaN());
    attention_drifting_.assign(attention_std.size(), 0);
  }
  if (attention_deviation_.size() != attention_std.size())
    attention_deviation_.assign(attention_std.size(), RunningWindow(kDriftWindow));
  for (size_t i = 0; i < attention_std.size(); ++i) {
    if (!(attention_std[i] > 0) || !std::isfinite(attention_std[i])) continue;
    const double value = std::log(attention_std[i]);
    double& trend = attention_trend_[i];
    if (!std::isfinite(trend)) trend = value;
    const double deviation = std::abs(value - trend);
    const double factor = std::exp(deviation);
    // The layer's own variability raises the bar above kAttentionDriftFactor, never lowers it.
    RunningWindow& seen = attention_deviation_[i];
    double bar = kAttentionDriftFactor;
    if (seen.size() >= kDriftSamples)
      bar = std::max(bar, std::exp(seen.median() + kDriftZ * 1.4826 * seen.mad()));
    int64_t& drifting = attention_drifting_[i];
    drifting = past_warmup && factor > bar ? drifting + 1 : 0;
    if (drift_settled && drifting == 0) seen.push(deviation);
    // Silent until the layer's own variability is known.
    if (may_warn && drift_settled && seen.size() >= kDriftSamples && events.empty() &&
        drifting >= kDriftPersistence) {
      last_periodic_warn_step_ = step;
      events.push_back({EventKind::kWarn,
                        {{"signal", "attention_drift"},
                         {"layer", static_cast<int64_t>(i)},
                         {"attention_std", attention_std[i]},
                         {"trend", std::exp(trend)},
                         {"factor", factor},
                         {"bar", bar},
                         {"log_steps", drifting}},
                        fmt::format("attention output of layer {} is {:.1f}x its trend for {} "
                                    "log steps: look for growing attention logits (lr, "
                                    "qk_norm) or a shift in the data",
                                    i, factor, drifting)});
    }
    trend += kAttentionTrendWeight * (value - trend);
  }
}

}  // namespace keel::guard
