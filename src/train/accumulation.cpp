#include "train/accumulation.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace keel::train {

Accumulation::Accumulation(const config::DataConfig& data, int64_t warmup_steps, Rule rule)
    : dynamic_(data.grad_accum == config::GradAccum::kDynamic),
      nominal_(std::max<int64_t>(data.grad_accum_steps, 1)),
      min_(dynamic_ ? std::max<int64_t>(data.grad_accum_min, 1) : nominal_),
      max_(dynamic_ ? std::max(config::grad_accum_max(data), nominal_) : nominal_),
      warmup_steps_(std::max<int64_t>(warmup_steps, 0)),
      rule_(rule),
      steps_(nominal_),
      last_change_step_(warmup_steps_),
      norms_(rule.window) {}

double Accumulation::lr_factor() const {
  return std::sqrt(static_cast<double>(steps_) / static_cast<double>(nominal_));
}

std::optional<Accumulation::Change> Accumulation::observe(int64_t step, double grad_norm,
                                                          bool recovering) {
  if (!dynamic_ || step <= warmup_steps_ || recovering || !std::isfinite(grad_norm))
    return std::nullopt;
  norms_.push(grad_norm * lr_factor());  // sqrt(k / k0): the norm as k0 micro-batches would give
  if (norms_.size() < 2 * rule_.recent || step - last_change_step_ < rule_.hold)
    return std::nullopt;
  const double ratio = norms_.median_of_last(rule_.recent) / norms_.median();
  if (!std::isfinite(ratio)) return std::nullopt;
  int64_t next = steps_;
  if (ratio > rule_.high) next = std::max(steps_ - 1, min_);
  if (ratio < rule_.low) next = std::min(steps_ + 1, max_);
  if (next == steps_) return std::nullopt;
  const Change change{steps_, next, ratio};
  steps_ = next;
  last_change_step_ = step;
  return change;
}

nlohmann::json Accumulation::state() const {
  return {{"steps", steps_}, {"last_change_step", last_change_step_}, {"norms", norms_.state()}};
}

void Accumulation::load_state(const nlohmann::json& state) {
  const int64_t saved = state.at("steps").get<int64_t>();
  if (saved < min_ || saved > max_)
    throw CheckpointError("trainer_state.json: grad_accum.steps " + std::to_string(saved) +
                          " lies outside this run's [" + std::to_string(min_) + ", " +
                          std::to_string(max_) +
                          "] (data.grad_accum_min, data.grad_accum_max); widen the range to "
                          "resume this checkpoint");
  steps_ = saved;
  last_change_step_ = state.at("last_change_step").get<int64_t>();
  norms_.load_state(state.at("norms"));
}

}  // namespace keel::train
