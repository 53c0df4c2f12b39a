#include "guard/guard.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"

namespace keel::guard {
namespace {

// A layer whose norm rose by more than this share of warn_factor counts as "risen" for the verdict.
constexpr double kRisenShare = 0.5;
// A stable snapshot needs its latest loss within this factor of the running loss median.
constexpr double kStableLossBand = 1.25;
// Loss-scale drops and regrowths, each at least this many within a window, mean oscillation.
constexpr int64_t kScaleOscillations = 3;

}  // namespace

Guard::Guard(const config::StabilityConfig& cfg, std::vector<std::string> layer_names,
             int64_t warmup_steps)
    : cfg_(cfg),
      layer_names_(std::move(layer_names)),
      grad_norms_(cfg.median_window),
      losses_(cfg.median_window),
      clip_flags_(cfg.median_window),
      layer_norms_(layer_names_.size(), RunningWindow(cfg.median_window)),
      warmup_steps_(std::max<int64_t>(warmup_steps, 0)),
      scale_drops_(cfg.median_window),
      scale_rises_(cfg.median_window) {}

nlohmann::json Guard::layer_report(const StepSignals& s) const {
  // Each layer against its own baseline: which modules moved, and did they move together?
  std::vector<std::pair<double, size_t>> ratios;
  for (size_t i = 0; i < s.layer_grad_norms.size() && i < layer_norms_.size(); ++i) {
    double median = layer_norms_[i].median();
    if (std::isfinite(median) && median > 0) ratios.emplace_back(s.layer_grad_norms[i] / median, i);
  }
  std::sort(ratios.rbegin(), ratios.rend());
  nlohmann::json top = nlohmann::json::array();
  for (size_t k = 0; k < std::min<size_t>(3, ratios.size()); ++k)
    top.push_back({{"layer", layer_names_[ratios[k].second]}, {"ratio", ratios[k].first}});
  size_t risen = std::count_if(ratios.begin(), ratios.end(),
                               [&](auto& r) { return r.first > cfg_.warn_factor * kRisenShare; });
  // All layers rising together points at the data or the learning rate; a few at one module.
  std::string verdict =
      ratios.empty() ? "unknown" : (2 * risen >= ratios.size() ? "global" : "local");
  return {{"top_layers", top},
          {"verdict", verdict},
          {"layers_risen", risen},
          {"layers", ratios.size()}};
}

Decision Guard::observe(const StepSignals& s) {
  Decision d;
  const bool finite = std::isfinite(s.loss) && std::isfinite(s.grad_norm);
  if (!finite) {
    ++consecutive_nan_;
    note_alarm(s.step);
    nlohmann::json detail = {
        {"loss", std::isfinite(s.loss) ? nlohmann::json(s.loss) : nullptr},
        {"grad_norm", std::isfinite(s.grad_norm) ? nlohmann::json(s.grad_norm) : nullptr},
        {"consecutive", consecutive_nan_}};
    if (cfg_.nan_policy == "abort") {
      detail["reason"] = "non_finite";
      d.events.push_back({"abort", detail});
      d.action = Action::kAbort;
      d.stop_message = "non-finite loss or gradient at step " + std::to_string(s.step) +
                       " and stability.nan_policy is abort";
      return d;
    }
    if (cfg_.nan_policy == "pause" || consecutive_nan_ >= cfg_.max_consecutive_nan) {
      detail["reason"] = "non_finite";
      d.events.push_back({"skip_nan", detail});
      d.events.push_back({"pause", detail});
      d.action = Action::kPause;
    } else {
      d.events.push_back({"skip_nan", detail});
      d.action = Action::kSkip;
    }
    return d;
  }
  consecutive_nan_ = 0;

  const bool baseline = baseline_ready();
  const double norm_median = grad_norms_.median();
  const double loss_median = losses_.median();
  const double norm_ratio = baseline && norm_median > 0 ? s.grad_norm / norm_median : 0.0;
  const double loss_ratio = baseline && loss_median > 0 ? s.loss / loss_median : 0.0;

  const bool norm_pause = norm_ratio > cfg_.pause_factor;
  const bool loss_pause = cfg_.loss_alarm_factor > 0 && loss_ratio > cfg_.loss_alarm_factor;
  // Every pause is preceded by a warn that carries the diagnosis (top layers, global/local), also
  // when only the loss alarmed: garbage data can raise the loss far more than the clipped-scale
  // gradient norm.
  if (norm_ratio > cfg_.warn_factor || loss_pause) {
    note_alarm(s.step);
    auto detail = layer_report(s);
    detail["alarm"] = norm_ratio > cfg_.warn_factor ? "grad_norm" : "loss";
    detail["grad_norm"] = s.grad_norm;
    detail["grad_norm_median"] = norm_median;
    detail["ratio"] = norm_ratio;
    detail["loss"] = s.loss;
    detail["loss_median"] = loss_median;
    detail["loss_ratio"] = loss_ratio;
    d.events.push_back({"warn", detail});
  }
  if (norm_pause || loss_pause) {
    note_alarm(s.step);
    nlohmann::json detail = {{"reason", norm_pause ? "grad_norm" : "loss"},
                             {"grad_norm", s.grad_norm},
                             {"grad_norm_median", norm_median},
                             {"loss", s.loss},
                             {"loss_median", loss_median}};
    d.events.push_back({"pause", detail});
    d.action = Action::kPause;
    return d;
  }

  // Applied: the values join the baselines.
  grad_norms_.push(s.grad_norm);
  losses_.push(s.loss);
  clip_flags_.push(s.clipped ? 1.0 : 0.0);
  for (size_t i = 0; i < s.layer_grad_norms.size() && i < layer_norms_.size(); ++i)
    layer_norms_[i].push(s.layer_grad_norms[i]);
  watch_rates(s, d);
  return d;
}

void Guard::watch_rates(const StepSignals& s, Decision& d) {
  const bool may_warn =
      last_rate_warn_step_ < 0 || s.step - last_rate_warn_step_ >= cfg_.median_window;
  auto warn = [&](nlohmann::json detail) {
    d.events.push_back({"warn", std::move(detail)});
    last_rate_warn_step_ = s.step;
  };
  // Clipping fires often while the lr ramps up, by design: only a window that lies wholly after
  // the warmup counts.
  const bool past_warmup = s.step >= warmup_steps_ + cfg_.median_window;
  if (may_warn && past_warmup && clip_flags_.size() >= cfg_.median_window &&
      clip_flags_.mean() > cfg_.clip_rate_warn) {
    const double rate = clip_flags_.mean();
    warn({{"signal", "clip_rate"},
          {"clip_rate", rate},
          {"window", cfg_.median_window},
          {"threshold", cfg_.clip_rate_warn},
          {"message", fmt::format("gradient clipping fired on {:.0f} % of the last {} steps (warns "
                                  "above {:.0f} %): look at the data (a bad region raises every "
                                  "norm) or the schedule (lr too high for this batch); raising "
                                  "optim.grad_clip only hides it",
                                  rate * 100, cfg_.median_window, cfg_.clip_rate_warn * 100)}});
  }
  if (s.loss_scale) {
    if (last_loss_scale_) {
      scale_drops_.push(*s.loss_scale < *last_loss_scale_ ? 1.0 : 0.0);
      scale_rises_.push(*s.loss_scale > *last_loss_scale_ ? 1.0 : 0.0);
    }
    last_loss_scale_ = s.loss_scale;
    if (may_warn && scale_drops_.sum() >= kScaleOscillations &&
        scale_rises_.sum() >= kScaleOscillations)
      warn({{"signal", "loss_scale"},
            {"loss_scale", *s.loss_scale},
            {"drops", scale_drops_.sum()},
            {"rises", scale_rises_.sum()},
            {"message", "fp16 loss scale oscillates; consider bf16"}});
  }
}

bool Guard::baseline_ready() const {
  return grad_norms_.size() >= std::min(kMinBaselineSteps, cfg_.median_window);
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
      events.push_back(
          {"warn",
           {{"signal", "update_ratio"},
            {"layer", layer},
            {"update_ratio", update_ratios[i]},
            {"threshold", cfg_.update_ratio_alarm},
            {"message",
             fmt::format("one update changed {} by {:.1f} % of its norm (warns above "
                         "{:.1f} %): the lr is high for these weights; look at the "
                         "schedule",
                         layer, update_ratios[i] * 100, cfg_.update_ratio_alarm * 100)}}});
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
      events.push_back(
          {"warn",
           {{"signal", "attention_drift"},
            {"layer", static_cast<int64_t>(i)},
            {"attention_std", attention_std[i]},
            {"trend", std::exp(trend)},
            {"factor", factor},
            {"log_steps", drifting},
            {"message", fmt::format("attention output of layer {} is {:.1f}x its trend for {} "
                                    "log steps: look for growing attention logits (lr, "
                                    "qk_norm) or a shift in the data",
                                    i, factor, drifting)}}});
    }
    trend += kAttentionTrendWeight * (value - trend);
  }
  return events;
}

std::optional<GuardEvent> Guard::after_update(int64_t completed_steps) {
  if (!recovery_announced_ && completed_steps >= recovery_until_) {
    recovery_announced_ = true;
    return GuardEvent{"recovery_end", {{"lr_factor", 1.0}}};
  }
  return std::nullopt;
}

Decision Guard::on_rollback(int64_t step, const nlohmann::json& incident) {
  Decision d;
  ++rollbacks_;
  incidents_.push_back(incident);
  if (rollbacks_ > cfg_.rollback.max_rollbacks) {
    std::string summary;
    for (const auto& i : incidents_) summary += "\n  " + i.dump();
    d.action = Action::kAbort;
    d.events.push_back({"abort",
                        {{"reason", "max_rollbacks"},
                         {"rollbacks", rollbacks_},
                         {"max_rollbacks", cfg_.rollback.max_rollbacks},
                         {"incidents", incidents_}}});
    d.stop_message =
        "rollback " + std::to_string(rollbacks_) +
        " exceeds stability.rollback.max_rollbacks=" + std::to_string(cfg_.rollback.max_rollbacks) +
        "; incidents:" + summary;
    return d;
  }
  start_recovery(step);
  return d;
}

void Guard::start_recovery(int64_t step) {
  recovery_until_ = step + cfg_.recovery.steps;
  recovery_announced_ = cfg_.recovery.steps == 0;
  consecutive_nan_ = 0;
}

double Guard::lr_factor(int64_t step) const {
  return step < recovery_until_ ? cfg_.recovery.lr_factor : 1.0;
}

bool Guard::promotable(int64_t step, int64_t window, bool require_no_alarms) const {
  if (require_no_alarms && last_alarm_step_ >= 0 && step - last_alarm_step_ <= window) return false;
  if (in_recovery(step)) return false;
  if (losses_.empty()) return true;
  double median = losses_.median();
  return !(median > 0) || losses_.last() <= kStableLossBand * median;
}

nlohmann::json Guard::state() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& w : layer_norms_) layers.push_back(w.state());
  return {{"grad_norms", grad_norms_.state()},
          {"losses", losses_.state()},
          {"clip_flags", clip_flags_.state()},
          {"layer_norms", layers},
          {"attention_trend", attention_trend_},
          {"attention_drifting", attention_drifting_},
          {"consecutive_nan", consecutive_nan_},
          {"rollbacks", rollbacks_},
          {"recovery_until", recovery_until_},
          {"recovery_announced", recovery_announced_},
          {"last_alarm_step", last_alarm_step_},
          {"last_rate_warn_step", last_rate_warn_step_},
          {"last_periodic_warn_step", last_periodic_warn_step_},
          {"last_loss_scale", last_loss_scale_ ? nlohmann::json(*last_loss_scale_) : nullptr},
          {"scale_drops", scale_drops_.state()},
          {"scale_rises", scale_rises_.state()},
          {"incidents", incidents_}};
}

void Guard::load_state(const nlohmann::json& st) {
  grad_norms_.load_state(st.at("grad_norms"));
  losses_.load_state(st.at("losses"));
  clip_flags_.load_state(st.at("clip_flags"));
  const auto& layers = st.at("layer_norms");
  for (size_t i = 0; i < layers.size() && i < layer_norms_.size(); ++i)
    layer_norms_[i].load_state(layers[i]);
  attention_trend_.clear();
  for (const auto& v : st.value("attention_trend", nlohmann::json::array()))
    attention_trend_.push_back(v.is_number() ? v.get<double>()
                                             : std::numeric_limits<double>::quiet_NaN());
  attention_drifting_ = st.value("attention_drifting", std::vector<int64_t>{});
  if (attention_drifting_.size() != attention_trend_.size())
    attention_drifting_.assign(attention_trend_.size(), 0);
  consecutive_nan_ = st.at("consecutive_nan").get<int64_t>();
  rollbacks_ = st.at("rollbacks").get<int64_t>();
  recovery_until_ = st.at("recovery_until").get<int64_t>();
  recovery_announced_ = st.at("recovery_announced").get<bool>();
  last_alarm_step_ = st.at("last_alarm_step").get<int64_t>();
  // Absent in checkpoints written before they were saved: start those watches afresh.
  last_rate_warn_step_ = st.value("last_rate_warn_step", int64_t{-1});
  last_periodic_warn_step_ = st.value("last_periodic_warn_step", int64_t{-1});
  last_loss_scale_.reset();
  if (auto it = st.find("last_loss_scale"); it != st.end() && it->is_number())
    last_loss_scale_ = it->get<double>();
  if (st.contains("scale_drops")) scale_drops_.load_state(st.at("scale_drops"));
  if (st.contains("scale_rises")) scale_rises_.load_state(st.at("scale_rises"));
  incidents_ = st.at("incidents");
}

}  // namespace keel::guard
