// Learning-rate schedules: pure functions of (config, peak lr, step, max_steps). See schedule.h.
#include "schedule/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "common/error.h"

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

// Warmup, then peak until the decay phase starts (warmup + stable fraction), then exponential decay
// peak * ratio^p, which reaches min_lr_ratio * peak exactly at max_steps.
double three_phase_lr(const config::ScheduleConfig& cfg, double peak_lr, int64_t step,
                      int64_t max_steps, int64_t warmup) {
  if (step < warmup) return warmup_lr(peak_lr, step, warmup);
  const auto stable = static_cast<int64_t>(std::llround(cfg.phases.stable * max_steps));
  const int64_t decay_begin = std::min(warmup + stable, max_steps);
  if (step < decay_begin) return peak_lr;
  return peak_lr * std::pow(cfg.min_lr_ratio, progress(step, decay_begin, max_steps));
}

}  // namespace

int64_t warmup_steps(const config::ScheduleConfig& cfg, int64_t max_steps) {
  int64_t w = cfg.warmup_steps;
  if (cfg.kind == "three_phase" && cfg.warmup_steps <= 0) {
    w = static_cast<int64_t>(std::llround(cfg.phases.warmup * max_steps));
  }
  return std::clamp<int64_t>(w, 0, std::max<int64_t>(max_steps, 0));
}

double lr_at(const config::ScheduleConfig& cfg, double peak_lr, int64_t step, int64_t max_steps) {
  const int64_t warmup = warmup_steps(cfg, max_steps);
  if (cfg.kind == "cosine") return cosine_lr(cfg, peak_lr, step, max_steps, warmup);
  if (cfg.kind == "three_phase") return three_phase_lr(cfg, peak_lr, step, max_steps, warmup);
  if (cfg.kind == "constant") return step < warmup ? warmup_lr(peak_lr, step, warmup) : peak_lr;
  throw ConfigError("schedule.kind: unknown schedule '" + cfg.kind +
                    "'\nHINT: use one of cosine, three_phase, constant");
}

}  // namespace keel::schedule
