// The guard's advisory signals: they warn, never pause. The screen's tail (more samples masked
// than natural text explains), the clip rate and the fp16 loss-scale drops over a window, and at
// log steps the per-layer update ratios and the attention-output drift against its trend.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "guard/guard.h"

namespace keel::guard {

// Every masked step gets a `screen` event (the trainer adds the sample ids). A warning, with what
// it saw and where to look, comes when the screen masks more than the natural tail explains
// (kScreenTailSamples, kScreenTailShare) and it has not warned within median_window steps.
void Guard::watch_screen(const StepSignals& s, Decision& d) {
  if (!s.screen_threshold) return;
  screen_masked_.push(static_cast<double>(s.masked_losses.size()));
  screen_samples_.push(static_cast<double>(s.samples));
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
  const auto masked_recently = static_cast<int64_t>(screen_masked_.sum());
  const auto tail_allowance = std::max<int64_t>(
      kScreenTailSamples, static_cast<int64_t>(kScreenTailShare * screen_samples_.sum()));
  const bool quiet_before =
      last_screen_warn_step_ < 0 || s.step - last_screen_warn_step_ > cfg_.median_window;
  if (masked_recently > tail_allowance && quiet_before) {
    last_screen_warn_step_ = s.step;
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
        masked_recently, screen_masked_.size(), tail_allowance, s.masked_losses.size(), s.samples,
        *s.screen_threshold, *s.screen_threshold / median, median, worst);
    d.events.push_back({EventKind::kWarn, std::move(warn), message});
    d.events.back().about_screened_samples = true;
  }
  d.events.push_back({EventKind::kScreen, std::move(detail)});
  d.events.back().about_screened_samples = true;
}

void Guard::watch_rates(const StepSignals& s, Decision& d) {
  const auto may_warn = [&] {
    return last_rate_warn_step_ < 0 || s.step - last_rate_warn_step_ >= cfg_.median_window;
  };
  auto warn = [&](nlohmann::json detail, std::string message) {
    d.events.push_back({EventKind::kWarn, std::move(detail), std::move(message)});
    last_rate_warn_step_ = s.step;
  };
  // Clipping fires often while the lr ramps up, by design: only a window that lies wholly after
  // the warmup counts.
  const bool past_warmup = s.step >= warmup_steps_ + cfg_.median_window;
  if (!s.overflow && may_warn() && past_warmup && clip_flags_.size() >= cfg_.median_window &&
      clip_flags_.mean() > cfg_.clip_rate_warn) {
    const double rate = clip_flags_.mean();
    warn({{"signal", "clip_rate"},
          {"clip_rate", rate},
          {"window", cfg_.median_window},
          {"threshold", cfg_.clip_rate_warn}},
         fmt::format("gradient clipping fired on {:.0f} % of the last {} steps (warns "
                     "above {:.0f} %): look at the data (a bad region raises every "
                     "norm) or the schedule (lr too high for this batch); raising "
                     "optim.grad_clip only hides it",
                     rate * 100, cfg_.median_window, cfg_.clip_rate_warn * 100));
  }
  // fp16: overflows at start-up calibrate the scale; after the first update, repeated overflows
  // mean the gradients keep leaving fp16's range.
  if (!s.loss_scale) return;
  last_loss_scale_ = s.loss_scale;
  const double drops = scale_drops_.sum();
  if (may_warn() && drops >= kScaleDropsWarn)
    warn({{"signal", "loss_scale"},
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
                                                const std::vector<double>& attention_std) {
  std::vector<GuardEvent> events;
  // While the lr ramps up, update ratios and activation statistics move by design: the trend
  // follows them, nothing warns.
  const bool past_warmup = step > warmup_steps_;
  const bool may_warn = past_warmup && (last_periodic_warn_step_ < 0 ||
                                        step - last_periodic_warn_step_ >= cfg_.median_window);
  for (size_t i = 0; i < update_ratios.size(); ++i) {
    // Advisory: a large update ratio says the lr is high for these weights; it does not block
    // stable promotion the way a gradient or loss alarm does.
    if (may_warn && update_ratios[i] > cfg_.update_ratio_alarm) {
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
      break;
    }
  }
  if (attention_trend_.size() != attention_std.size()) {
    attention_trend_.assign(attention_std.size(), std::numeric_limits<double>::quiet_NaN());
    attention_drifting_.assign(attention_std.size(), 0);
  }
  for (size_t i = 0; i < attention_std.size(); ++i) {
    if (!(attention_std[i] > 0) || !std::isfinite(attention_std[i])) continue;
    const double value = std::log(attention_std[i]);
    double& trend = attention_trend_[i];
    if (!std::isfinite(trend)) trend = value;
    const double factor = std::exp(std::abs(value - trend));
    int64_t& drifting = attention_drifting_[i];
    drifting = past_warmup && factor > kAttentionDriftFactor ? drifting + 1 : 0;
    if (may_warn && events.empty() && drifting >= kDriftPersistence) {
      last_periodic_warn_step_ = step;
      events.push_back({EventKind::kWarn,
                        {{"signal", "attention_drift"},
                         {"layer", static_cast<int64_t>(i)},
                         {"attention_std", attention_std[i]},
                         {"trend", std::exp(trend)},
                         {"factor", factor},
                         {"log_steps", drifting}},
                        fmt::format("attention output of layer {} is {:.1f}x its trend for {} "
                                    "log steps: look for growing attention logits (lr, "
                                    "qk_norm) or a shift in the data",
                                    i, factor, drifting)});
    }
    trend += kAttentionTrendWeight * (value - trend);
  }
  return events;
}

}  // namespace keel::guard
