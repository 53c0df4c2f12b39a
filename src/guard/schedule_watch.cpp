#include "guard/schedule_watch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace keel::guard {

ScheduleWatch::ScheduleWatch(int64_t warmup_steps, double peak_lr)
    : warmup_steps_(std::max<int64_t>(warmup_steps, 0)), peak_lr_(peak_lr) {}

void ScheduleWatch::set_baseline(const std::vector<double>& attention_std) {
  baseline_ = attention_std;
  if (baseline_.empty()) disabled_ = true;  // a model without attention statistics
  // A layer whose first reading is not finite is not judged (and the state stays valid JSON).
  for (double& b : baseline_)
    if (!std::isfinite(b)) b = 0.0;
}

ScheduleWatch::Reading ScheduleWatch::read(const std::vector<double>& attention_std) const {
  Reading r;
  for (size_t i = 0; i < attention_std.size() && i < baseline_.size(); ++i) {
    const double g = baseline_[i] > 0 ? attention_std[i] / baseline_[i] : 0.0;
    // A non-finite reading is the loss's and the gradients' business (skip_nan), not growth.
    r.per_layer.push_back(std::isfinite(g) ? nlohmann::json(g) : nlohmann::json(nullptr));
    if (std::isfinite(g) && g > r.growth) r.growth = g, r.layer = static_cast<int64_t>(i);
  }
  return r;
}

std::optional<double> ScheduleWatch::growth(const std::vector<double>& attention_std) const {
  if (disabled_ || baseline_.empty() || attention_std.empty()) return std::nullopt;
  return read(attention_std).growth;
}

int64_t ScheduleWatch::judged_until() const {
  const int64_t span = std::max(2 * warmup_steps_, kGrowthJudgedSteps);
  // A back-off within the warmup starts the schedule's own ramp again; past it, its own ramp.
  return attempt_start_ <= warmup_steps_ ? span : attempt_start_ + span;
}

std::optional<nlohmann::json> ScheduleWatch::observe(int64_t step, double lr,
                                                     const std::vector<double>& attention_std) {
  if (disabled_ || baseline_.empty() || pending_ || spent_ || step > judged_until())
    return std::nullopt;
  const auto [per_layer, growth, layer] = read(attention_std);
  if (growth < kGrowthWarn) {
    quiet_step_ = step, quiet_lr_ = lr;
    return std::nullopt;
  }
  nlohmann::json detail = {{"signal", "attention_growth"},
                           {"layer", layer},
                           {"growth", growth},
                           {"growth_layers", per_layer},
                           {"lr", lr},
                           {"warn_level", kGrowthWarn},
                           {"alarm_level", kGrowthAlarm},
                           {"quiet_step", quiet_step_},
                           {"quiet_lr", quiet_lr_}};
  if (growth >= kGrowthAlarm) {
    if (backoffs_ >= kMaxBackoffs) {
      spent_ = true;
      return std::nullopt;
    }
    Backoff b;
    b.step = step;
    b.restart_step = attempt_start_;
    b.quiet_step = quiet_step_;
    b.quiet_lr = quiet_lr_;
    b.from_scale = scale_;
    b.to_scale = scale_ * kBackoffFactor;
    b.number = backoffs_ + 1;
    b.signals = detail;
    pending_ = b;
  }
  if (warned_) return std::nullopt;
  warned_ = true;
  return detail;
}

void ScheduleWatch::backed_off(int64_t step) {
  if (!pending_) return;
  scale_ = pending_->to_scale;
  ++backoffs_;
  pending_.reset();
  attempt_start_ = step;
  // From the warmup's last step on the schedule's own ramp is done: ramp again to the new peak.
  // Within it, the schedule's ramp goes on from `step`, to the lowered peak.
  rewarm_from_ = step >= warmup_steps_ && warmup_steps_ > 0 ? step : -1;
  quiet_step_ = step, quiet_lr_ = 0.0;
  warned_ = false;
}

double ScheduleWatch::lr_factor(int64_t step) const {
  if (rewarm_from_ < 0 || warmup_steps_ == 0 || step < rewarm_from_) return scale_;
  const double ramp = static_cast<double>(step - rewarm_from_ + 1) / warmup_steps_;
  return scale_ * std::min(1.0, ramp);
}

std::optional<int64_t> ScheduleWatch::restart_snapshot(int64_t step) const {
  if (disabled_ || baseline_.empty() || step > judged_until()) return std::nullopt;
  return attempt_start_;
}

std::string ScheduleWatch::stop_message() const {
  return fmt::format(
      "the attention output grew past {:.0f}x its value at initialisation again after {} "
      "back-offs of the schedule's peak (now {:.3g}, {:.3g}x optim.lr {:.3g}): the model cannot "
      "train at this lr and batch. HINT: set optim.lr to {:.3g} or lower (or raise the batch), "
      "and keep model.qk_norm on",
      kGrowthAlarm, backoffs_, peak_lr_ * scale_, scale_, peak_lr_,
      peak_lr_ * scale_ * kBackoffFactor);
}

nlohmann::json ScheduleWatch::state() const {
  return {
      {"baseline", baseline_},     {"disabled", disabled_},           {"scale", scale_},
      {"backoffs", backoffs_},     {"attempt_start", attempt_start_}, {"rewarm_from", rewarm_from_},
      {"quiet_step", quiet_step_}, {"quiet_lr", quiet_lr_},           {"warned", warned_}};
}

void ScheduleWatch::load_state(const nlohmann::json& st) {
  pending_.reset();
  spent_ = false;
  if (st.is_null()) {
    baseline_.clear();
    disabled_ = true;
    return;
  }
  baseline_ = st.at("baseline").get<std::vector<double>>();
  disabled_ = st.at("disabled").get<bool>();
  scale_ = st.at("scale").get<double>();
  backoffs_ = st.at("backoffs").get<int64_t>();
  attempt_start_ = st.at("attempt_start").get<int64_t>();
  rewarm_from_ = st.at("rewarm_from").get<int64_t>();
  quiet_step_ = st.at("quiet_step").get<int64_t>();
  quiet_lr_ = st.at("quiet_lr").get<double>();
  warned_ = st.at("warned").get<bool>();
}

}  // namespace keel::guard
