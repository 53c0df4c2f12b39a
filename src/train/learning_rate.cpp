#include "train/learning_rate.h"

#include "schedule/schedule.h"

namespace keel::train {

double effective_lr(const config::Config& cfg, int64_t step, int64_t iteration,
                    const guard::Guard* guard, const FaultInjector* faults) {
  return schedule::lr_at(cfg.schedule, cfg.optim.lr, step, cfg.run.max_steps) *
         (guard ? guard->lr_factor(step) : 1.0) * (faults ? faults->lr_multiplier(iteration) : 1.0);
}

}  // namespace keel::train
