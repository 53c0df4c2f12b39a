// The guard's state as a checkpoint holds it (trainer_state.json's "guard"): every running window,
// counter and incident, so a resumed run decides exactly as the uninterrupted one would.
// Keys absent in checkpoints written before keel had them start afresh.
#include <limits>

#include "guard/guard.h"

namespace keel::guard {

nlohmann::json Guard::Incident::to_json() const {
  return {{"id", id},
          {"first_step", first_step},
          {"first_iteration", first_iteration},
          {"furthest_step", furthest_step},
          {"reason", reason},
          {"alarms", alarms},
          {"rollbacks", rollbacks},
          {"skipped_steps", skipped},
          {"quiet_steps", quiet}};
}

Guard::Incident Guard::Incident::from_json(const nlohmann::json& j) {
  Incident i;
  i.id = j.at("id").get<int64_t>();
  i.first_step = j.at("first_step").get<int64_t>();
  i.first_iteration = j.at("first_iteration").get<int64_t>();
  i.furthest_step = j.at("furthest_step").get<int64_t>();
  i.reason = j.at("reason").get<std::string>();
  i.alarms = j.at("alarms").get<int64_t>();
  i.rollbacks = j.at("rollbacks").get<int64_t>();
  i.skipped = j.at("skipped_steps").get<int64_t>();
  i.quiet = j.value("quiet_steps", int64_t{0});
  return i;
}

nlohmann::json Guard::incidents() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& i : closed_) out.push_back(i.to_json());
  if (open_) out.push_back(open_->to_json());
  return out;
}

nlohmann::json Guard::state() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& w : layer_norms_) layers.push_back(w.state());
  nlohmann::json closed = nlohmann::json::array();
  for (const auto& i : closed_) closed.push_back(i.to_json());
  nlohmann::json deviations = nlohmann::json::array();
  for (const auto& w : attention_deviation_) deviations.push_back(w.state());
  return {{"grad_norms", grad_norms_.state()},
          {"losses", losses_.state()},
          {"clip_tail", clip_tail_.state()},
          {"layer_norms", layers},
          {"sample_losses", sample_losses_.state()},
          {"attention_trend", attention_trend_},
          {"schedule_watch", schedule_.state()},
          {"attention_drifting", attention_drifting_},
          {"attention_deviation", deviations},
          {"consecutive_nan", consecutive_nan_},
          {"consecutive_overflow", consecutive_overflow_},
          {"unapplied_in_a_row", unapplied_in_a_row_},
          {"norm_only_skips", norm_only_skips_},
          {"rollbacks", rollbacks_},
          {"recovery_until", recovery_until_},
          {"recovery_announced", recovery_announced_},
          {"last_alarm_step", last_alarm_step_},
          {"last_rate_warn_step", last_rate_warn_step_},
          {"last_clip_warn_step", last_clip_warn_step_},
          {"last_periodic_warn_step", last_periodic_warn_step_},
          {"last_screen_step", last_screen_step_},
          {"last_screen_warn_step", last_screen_warn_step_},
          {"screen_tail", screen_tail_.state()},
          {"applied_any", applied_any_},
          {"last_loss_scale", last_loss_scale_ ? nlohmann::json(*last_loss_scale_) : nullptr},
          {"scale_drops", scale_drops_.state()},
          {"scale_log2", scale_log2_.state()},
          {"low_tail", low_tail_.state()},
          {"repeat_tail", repeat_tail_.state()},
          {"loss_periodicity", periodicity_.state()},
          {"last_repeat_warn_step", last_repeat_warn_step_},
          {"last_low_warn_step", last_low_warn_step_},
          {"last_period_warn_step", last_period_warn_step_},
          {"open_incident", open_ ? open_->to_json() : nlohmann::json(nullptr)},
          {"incidents", closed},
          {"incident_starts", incident_starts_},
          {"device_faults", device_faults_}};
}

// The baselines the statistics of applied steps teach: what a rollback restores with the weights
// (the rest is the run's history, which a rollback keeps).
void Guard::load_baselines(const nlohmann::json& st) {
  grad_norms_.load_state(st.at("grad_norms"));
  losses_.load_state(st.at("losses"));
  // A checkpoint from before the clip rate learned its level (clip_flags) starts it afresh.
  clip_tail_ = TailRate(cfg_.median_window, kTailRateWindows);
  if (st.contains("clip_tail")) clip_tail_.load_state(st.at("clip_tail"));
  const auto& layers = st.at("layer_norms");
  for (size_t i = 0; i < layers.size() && i < layer_norms_.size(); ++i)
    layer_norms_[i].load_state(layers[i]);
  // Absent in checkpoints written before keel had them: those start afresh.
  sample_losses_.clear();
  if (st.contains("sample_losses")) sample_losses_.load_state(st.at("sample_losses"));
}

void Guard::load_state(const nlohmann::json& st) {
  load_baselines(st);
  // Absent in checkpoints of a keel before the watch: it never judges (no baseline of its own).
  schedule_.load_state(st.value("schedule_watch", nlohmann::json()));
  attention_trend_.clear();
  for (const auto& v : st.value("attention_trend", nlohmann::json::array()))
    attention_trend_.push_back(v.is_number() ? v.get<double>()
                                             : std::numeric_limits<double>::quiet_NaN());
  attention_drifting_ = st.value("attention_drifting", std::vector<int64_t>{});
  if (attention_drifting_.size() != attention_trend_.size())
    attention_drifting_.assign(attention_trend_.size(), 0);
  attention_deviation_.clear();
  for (const auto& w : st.value("attention_deviation", nlohmann::json::array())) {
    attention_deviation_.emplace_back(kDriftWindow);
    attention_deviation_.back().load_state(w);
  }
  consecutive_nan_ = st.at("consecutive_nan").get<int64_t>();
  consecutive_overflow_ = st.value("consecutive_overflow", int64_t{0});
  unapplied_in_a_row_ = st.value("unapplied_in_a_row", int64_t{0});
  norm_only_skips_ = st.value("norm_only_skips", int64_t{0});
  rollbacks_ = st.at("rollbacks").get<int64_t>();
  recovery_until_ = st.at("recovery_until").get<int64_t>();
  recovery_announced_ = st.at("recovery_announced").get<bool>();
  last_alarm_step_ = st.at("last_alarm_step").get<int64_t>();
  last_rate_warn_step_ = st.value("last_rate_warn_step", int64_t{-1});
  last_clip_warn_step_ = st.value("last_clip_warn_step", int64_t{-1});
  last_periodic_warn_step_ = st.value("last_periodic_warn_step", int64_t{-1});
  last_screen_step_ = st.value("last_screen_step", int64_t{-1});
  last_screen_warn_step_ = st.value("last_screen_warn_step", last_screen_step_);
  screen_tail_ = TailRate(cfg_.median_window, kTailRateWindows);
  if (st.contains("screen_tail")) screen_tail_.load_state(st.at("screen_tail"));
  applied_any_ = st.value("applied_any", !grad_norms_.empty());
  last_loss_scale_.reset();
  if (auto it = st.find("last_loss_scale"); it != st.end() && it->is_number())
    last_loss_scale_ = it->get<double>();
  scale_drops_.clear();
  if (st.contains("scale_drops")) scale_drops_.load_state(st.at("scale_drops"));
  scale_log2_.clear();
  if (st.contains("scale_log2")) scale_log2_.load_state(st.at("scale_log2"));
  low_tail_ = TailRate(cfg_.median_window, kTailRateWindows);
  if (st.contains("low_tail")) low_tail_.load_state(st.at("low_tail"));
  repeat_tail_ = TailRate(cfg_.median_window, 1);
  if (st.contains("repeat_tail")) repeat_tail_.load_state(st.at("repeat_tail"));
  periodicity_.load_state(st.value("loss_periodicity", nlohmann::json::array()));
  last_repeat_warn_step_ = st.value("last_repeat_warn_step", int64_t{-1});
  last_low_warn_step_ = st.value("last_low_warn_step", int64_t{-1});
  last_period_warn_step_ = st.value("last_period_warn_step", int64_t{-1});
  open_.reset();
  if (auto it = st.find("open_incident"); it != st.end() && it->is_object())
    open_ = Incident::from_json(*it);
  closed_.clear();
  for (const auto& i : st.value("incidents", nlohmann::json::array()))
    if (i.contains("alarms")) closed_.push_back(Incident::from_json(i));
  incident_starts_.clear();
  for (int64_t v : st.value("incident_starts", std::vector<int64_t>{}))
    incident_starts_.push_back(v);
  // (A checkpoint from before the faults had ranks holds "hardware_faults": iterations alone, which
  // name no device; the count starts again.)
  device_faults_.clear();
  for (const auto& f : st.value("device_faults", std::vector<std::pair<int64_t, int64_t>>{}))
    device_faults_.push_back(f);
}

}  // namespace keel::guard
