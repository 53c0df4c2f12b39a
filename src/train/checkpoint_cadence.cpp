#include "train/checkpoint_cadence.h"

#include <fmt/format.h>

#include "checkpoint/checkpointer.h"

namespace keel::train {

CheckpointCadence::CheckpointCadence(const config::CheckpointConfig& cfg, int64_t max_steps)
    : cfg_(cfg), max_steps_(max_steps) {
  if (cfg_.every_steps != config::kAuto) {
    set_interval(cfg_.every_steps);
    decided_ = true;
  }
}

void CheckpointCadence::set_interval(int64_t every) {
  every_ = every;
  stable_every_ = checkpoint::stable_interval(cfg_, every_);
  stable_window_ = checkpoint::stable_window(cfg_, every_);
}

bool CheckpointCadence::attempt_finished() {
  if (decided_) return false;
  ++attempts_;
  if (attempts_ == checkpoint::kCadenceStartStep) start_ = Clock::now();
  return attempts_ == checkpoint::kCadenceProbeStep;
}

double CheckpointCadence::measured_step_seconds() const {
  return seconds_since(start_) /
         static_cast<double>(checkpoint::kCadenceProbeStep - checkpoint::kCadenceStartStep);
}

nlohmann::json CheckpointCadence::decide(double stall_seconds, double step_seconds) {
  set_interval(
      checkpoint::auto_interval(stall_seconds, step_seconds, cfg_.max_overhead, max_steps_));
  decided_ = true;
  return {{"every_steps", every_},
          {"stable_every_steps", stable_every_},
          {"stable_window", stable_window_},
          {"save_stall_s", stall_seconds},
          {"step_s", step_seconds},
          {"overhead", checkpoint::checkpoint_overhead(stall_seconds, step_seconds, every_)},
          {"max_overhead", cfg_.max_overhead}};
}

std::string CheckpointCadence::log_line(const nlohmann::json& decision) const {
  const double overhead = decision.at("overhead").get<double>();
  // The interval is rounded up, so the share is at most the target, except where a clamp won: a
  // short run keeps kMinAutoCheckpoints snapshots, and no interval is below kMinAutoInterval.
  const std::string share =
      overhead <= cfg_.max_overhead * 1.0001
          ? fmt::format("about {:.1f} % of training time", overhead * 100)
          : fmt::format(
                "{:.1f} % of training time, above checkpoint.max_overhead {:.1f} %: a run "
                "keeps at least {} checkpoints (at most max_steps / {} steps apart) and "
                "saves at most every {} steps",
                overhead * 100, cfg_.max_overhead * 100, checkpoint::kMinAutoCheckpoints,
                checkpoint::kMinAutoCheckpoints, checkpoint::kMinAutoInterval);
  return fmt::format(
      "checkpoint.every_steps auto: every {} steps, stable snapshots every {} (a save stalls "
      "{:.3f} s, a step takes {:.3f} s: {})",
      every_, stable_every_, decision.at("save_stall_s").get<double>(),
      decision.at("step_s").get<double>(), share);
}

CheckpointCadence::Due CheckpointCadence::due(int64_t step) const {
  Due d;
  d.save = every_ > 0 && step % every_ == 0;
  d.stable_candidate = stable_every_ > 0 && step % stable_every_ == 0;
  return d;
}

}  // namespace keel::train
