// `keel validate --rehearse`: the checklist's "rollback rehearsed", done on this machine. A short
// run of the config's own model, data and device (one process) with a device's wrong gradient, a
// bad batch and an lr spike injected, in a scratch directory that is removed after; the run's
// events say whether the wrong gradient was named a machine fault (train/replay.h) and the
// defences paused, rolled back to a stable snapshot and recovered. Then the schedule: whether the
// attention output stayed quiet through the warmup at the configured peak (the guard's schedule
// watch, schedule_watch.h), and, from short probes at half-decade multiples of the peak, the
// peak at which it would not.
#pragma once

#include <string>

#include "config/schema.h"

namespace keel::cli {

struct Rehearsal {
  bool passed = false;
  std::string what;       // what happened, or why it did not; with the run's duration
  bool lr_quiet = false;  // the configured peak stayed below the watch's warn level
  std::string lr_what;    // the growth measured at the peak and the peak that would be too high
};

// The rehearsal's config: `cfg` unlocked (its copy only), shortened to kRehearsalSteps with a
// short warmup and frequent checkpoints, eval off, and the three faults.
config::Config rehearsal_config(const config::Config& cfg);

// A probe of the schedule: rehearsal_config(cfg) at `lr_multiple` x the peak for
// kProbeSteps steps, without faults.
config::Config probe_config(const config::Config& cfg, double lr_multiple);

// Runs `keel train` (this binary) on rehearsal_config(cfg), then the probes, and reads their
// events and metrics.
Rehearsal rehearse(const config::Config& cfg);

}  // namespace keel::cli
