// Learning-rate schedules as pure functions of the optimizer step (never of wall time).
//   cosine:      linear warmup 0 -> peak over the warmup, then cosine to min_lr_ratio x peak at
//                max_steps
//   three_phase: warmup (linear) / stable (peak) / decay (exponential to min_lr_ratio x peak over
//                the last phases.decay x max_steps steps); the warmup is phases.warmup x max_steps
//                unless warmup_steps is given, and the stable phase takes what lies between
//   constant:    linear warmup, then peak
// warmup_steps: auto resolves as config::warmup_steps() says.
#pragma once

#include <cstdint>

#include "config/schema.h"

namespace keel::schedule {

// lr for the optimizer update with 0-based index `step` (the first update is step 0 and gets
// peak/warmup_steps when warming up, never 0). Steps past max_steps stay at the final value.
double lr_at(const config::ScheduleConfig& cfg, double peak_lr, int64_t step, int64_t max_steps);

// Number of warmup steps the schedule actually uses for these settings.
int64_t warmup_steps(const config::ScheduleConfig& cfg, int64_t max_steps);

// three_phase: the 0-based step at which the decay phase begins (the steps before it, after the
// warmup, stay at the peak); max_steps when there is no decay phase.
int64_t decay_start(const config::ScheduleConfig& cfg, int64_t max_steps);

}  // namespace keel::schedule
