// Learning-rate schedules: pure functions of (config, peak lr, step, max_steps). See schedule.h.
#include "schedule/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace keel::schedule {
namespace {

// Linear warmup: the first update (step 0) gets peak/warmup, the last warmup step gets peak.
double warmup_lr(double peak_lr, int64_t step, int64_t warmup) {
  return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
}

// Fraction of the way from `begin` to `end` reached at `step`, clamped to [0, 1].
double progress(int64_t step, int64_t begin, int64_t end) {
  if (end <= begin) return 1.0;
  const double p = static_cast<double>(step - begin) / static_cast<double>(end - begin);
  return std::clamp(p, 0.0, 1.0);
}

double cosine_lr(const config::ScheduleConfig& cfg, double peak_lr, int64_t step, int64_t max_steps,
                 int64_t warmup) {
  if (step < warmup) return warmup_lr(peak_lr, step, warmup);
  const double min_lr = cfg.min_lr_ratio * peak_lr;
  const double p = progress(step, warmup, max_steps);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

// Warmup, then peak until the decay phase (the last phases.decay x max_steps steps), then
// exponential decay peak * ratio^p, which reaches min_lr_ratio * peak exactly at max_steps. The
// stable phase is what lies between: phases.stable x max_steps, or longer or shorter when an
// explicit warmup_steps replaces phases.warmup.
double three_phase_lr(const config::ScheduleConfig& cfg, double peak_lr, int64_t step,
                      int64_t max_steps, int64_t warmup) {
  if (step < warmup) return warmup_lr(peak_lr, step, warmup);
  const int64_t decay_begin = decay_start(cfg, max_steps);
  if (step < decay_begin) return peak_lr;
  return peak_lr * std::pow(cfg.min_lr_ratio, progress(step, decay_begin, max_steps));
}

}  // namespace

int64_t warmup_steps(const config::ScheduleConfig& cfg, int64_t max_steps) {
  return config::warmup_steps(cfg, max_steps);
}

int64_t decay_start(const config::ScheduleConfig& cfg, int64_t max_steps) {
  const auto decay =
      static_cast<int64_t>(std::llround(cfg.phases.decay * static_cast<double>(max_steps)));
  return std::clamp<int64_t>(max_steps - decay, schedule::warmup_steps(cfg, max_steps), max_steps);
}

double lr_at(const config::ScheduleConfig& cfg, double peak_lr, int64_t step, int64_t max_steps) {
  const int64_t warmup = schedule::warmup_steps(cfg, max_steps);
  switch (cfg.kind) {
    case config::ScheduleKind::kCosine:
      return cosine_lr(cfg, peak_lr, step, max_steps, warmup);
    case config::ScheduleKind::kThreePhase:
      return three_phase_lr(cfg, peak_lr, step, max_steps, warmup);
    case config::ScheduleKind::kConstant:
      break;
  }
  return step < warmup ? warmup_lr(peak_lr, step, warmup) : peak_lr;
}

}  // namespace keel::schedule
