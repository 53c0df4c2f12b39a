// The kinds of event in RUN_DIR/events.jsonl: one list, the file's contract (DESIGN.md, "Run
// directory"), written by name. The guard decides with them, the trainer records them, the report
// reads them back by the same names.
#pragma once

namespace keel {

enum class EventKind {
  kRunStart,           // a start: world size, device, parameters, resume
  kRunEnd,             // the run reached run.max_steps
  kResume,             // a checkpoint was restored
  kCrashLoop,          // latest became a recovery from stable: two deaths at one step
  kInterrupted,        // SIGTERM/SIGINT: checkpointed, exiting
  kCheckpoint,         // a checkpoint was written
  kCheckpointCadence,  // checkpoint.every_steps auto decided
  kStableSnapshot,     // that checkpoint is a stable snapshot
  kLoaderWait,         // training waited for data (backpressure)
  kMemory,             // the memory plan and the measured peak, once per start
  kGradAccum,          // dynamic accumulation changed the micro-batches per step
  kWarn,               // a signal crossed its warn threshold; training goes on
  kScreen,             // samples masked out of a step and quarantined
  kSkipNan,            // a non-finite loss or gradient: the update skipped
  kOverflow,           // fp16: the loss scaler skipped the update and lowered the scale
  kPause,              // an alarm: forensics, then a rollback or a dropped step
  kRollback,           // back to the newest stable snapshot
  kRecoveryStart,      // the recovery overlay (lr x recovery.lr_factor) began
  kRecoveryEnd,        // and ended
  kIncidentEnd,        // an incident closed: training clean again
  kAbort,              // the run stopped itself (exit 3; 4 for a faulty device)
  kHardwareFault,      // a device computed wrong (replicas disagree, or a replay did not reproduce)
  kScheduleBackoff,    // the model could not take its lr: rolled back, the schedule's peak lowered
};
// The last kind: every kind is EventKind(0) .. kLastEventKind, for the tests that each is known.
constexpr EventKind kLastEventKind = EventKind::kScheduleBackoff;

// The name events.jsonl carries ("run_start", "skip_nan", ...).
constexpr const char* name_of(EventKind kind) {
  switch (kind) {
    case EventKind::kRunStart:
      return "run_start";
    case EventKind::kRunEnd:
      return "run_end";
    case EventKind::kResume:
      return "resume";
    case EventKind::kCrashLoop:
      return "crash_loop";
    case EventKind::kInterrupted:
      return "interrupted";
    case EventKind::kCheckpoint:
      return "checkpoint";
    case EventKind::kCheckpointCadence:
      return "checkpoint_cadence";
    case EventKind::kStableSnapshot:
      return "stable_snapshot";
    case EventKind::kLoaderWait:
      return "loader_wait";
    case EventKind::kMemory:
      return "memory";
    case EventKind::kGradAccum:
      return "grad_accum";
    case EventKind::kWarn:
      return "warn";
    case EventKind::kScreen:
      return "screen";
    case EventKind::kSkipNan:
      return "skip_nan";
    case EventKind::kOverflow:
      return "overflow";
    case EventKind::kPause:
      return "pause";
    case EventKind::kRollback:
      return "rollback";
    case EventKind::kRecoveryStart:
      return "recovery_start";
    case EventKind::kRecoveryEnd:
      return "recovery_end";
    case EventKind::kIncidentEnd:
      return "incident_end";
    case EventKind::kAbort:
      return "abort";
    case EventKind::kHardwareFault:
      return "hardware_fault";
    case EventKind::kScheduleBackoff:
      return "schedule_backoff";
  }
  return "?";
}

}  // namespace keel
