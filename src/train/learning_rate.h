// The learning rate of one update: the schedule's value at the optimizer step, times the guard's
// recovery overlay (recovery.lr_factor for recovery.steps updates after a rollback), times an
// injected lr_spike. The overlay multiplies; it never moves the schedule: a run rolled back to
// step S continues the schedule from S (a warmup is not restarted, a decay not replayed).
#pragma once

#include <cstdint>

#include "config/schema.h"
#include "guard/guard.h"
#include "train/faults.h"

namespace keel::train {

// `step` is the index of the update about to be applied (updates done so far), `iteration` the
// step-attempt counter the faults are keyed to. guard and faults may be null.
double effective_lr(const config::Config& cfg, int64_t step, int64_t iteration,
                    const guard::Guard* guard, const FaultInjector* faults);

}  // namespace keel::train
