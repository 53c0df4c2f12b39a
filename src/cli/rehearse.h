// `keel validate --rehearse`: the checklist's "rollback rehearsed", done on this machine. A short
// run of the config's own model, data and device (one process) with a bad batch and an lr spike
// injected, in a scratch directory that is removed after; the run's events say whether the
// defences paused, rolled back to a stable snapshot and recovered.
#pragma once

#include <string>

#include "config/schema.h"

namespace keel::cli {

struct Rehearsal {
  bool passed = false;
  std::string what;  // what happened, or why it did not; with the run's duration
};

// The rehearsal's config: `cfg` unlocked (its copy only), shortened to kRehearsalSteps with a
// short warmup and frequent checkpoints, eval off, and the two faults.
config::Config rehearsal_config(const config::Config& cfg);

// Runs `keel train` (this binary) on rehearsal_config(cfg) and reads its events.
Rehearsal rehearse(const config::Config& cfg);

}  // namespace keel::cli
