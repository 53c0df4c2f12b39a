// The guard's part in a schedule back-off (schedule_watch.h): the stop when every back-off is
// spent, and the state after the trainer rolled back for one.
#include "guard/guard.h"

namespace keel::guard {

std::optional<Decision> Guard::backoffs_spent() const {
  if (!schedule_.spent()) return std::nullopt;
  Decision d;
  abort("schedule", schedule_.stop_message(),
        {{"backoffs", schedule_.backoffs()},
         {"scale", schedule_.scale()},
         {"last_quiet_lr", schedule_.last_quiet_lr()}},
        d);
  return d;
}

void Guard::backed_off(int64_t step, const nlohmann::json& snapshot_state) {
  // The restored model's baselines; not a rollback of an incident: no recovery overlay (the
  // schedule ramps up again instead) and no rollback counted against rollback.max_rollbacks.
  if (snapshot_state.is_object()) load_baselines(snapshot_state);
  consecutive_nan_ = 0;
  unapplied_in_a_row_ = 0;
  // An incident's recovery overlay belongs to the abandoned attempt: it ends here (its
  // recovery_end follows if it was on), the new attempt ramps up on the lowered peak instead.
  recovery_until_ = step;
  schedule_.backed_off(step);
}

}  // namespace keel::guard
