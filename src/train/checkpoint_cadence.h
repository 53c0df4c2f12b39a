// When the trainer saves: a checkpoint every checkpoint.every_steps updates (fixed, or `auto`:
// decided once this process has timed its first step attempts and a save), and a stable candidate
// every checkpoint.stable.every_steps, promoted when the stable.window steps before it passed
// without an alarm.
//
// Owns: the intervals and the measurement behind `auto` (this process's step attempts, when its
// timing began, its newest save's stall). Called by: snapshot.cpp: maybe_checkpoint() calls
// attempt_finished() after every step attempt, then due(); save_checkpoint() calls saved() after
// every save; when attempt_finished() says the time has come, decide_checkpoint_cadence() agrees
// the figures with the other ranks and calls decide(). Writes: nothing (the trainer saves, and
// puts the decision on record as a checkpoint_cadence event). Saves: nothing: rebuilt at each
// start, so a resumed run under `auto` measures and decides anew. One per trainer, one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "config/schema.h"

namespace keel::train {

class CheckpointCadence {
 public:
  CheckpointCadence(const config::CheckpointConfig& cfg, int64_t max_steps);

  // Counts a step attempt. True once, at the kCadenceProbeStep-th attempt of this process, while
  // checkpoint.every_steps auto is undecided: the trainer calls decide() now (after a save of its
  // own when saved() was never called, so a save's stall is known).
  bool attempt_finished();
  // The mean time of this process's step attempts since its kCadenceStartStep-th.
  double measured_step_seconds() const;
  // A save stalled training `stall_seconds` (its newest, in this process).
  void saved(double stall_seconds) { save_stall_s_ = stall_seconds; }
  const std::optional<double>& save_stall_seconds() const { return save_stall_s_; }

  // Decides the auto interval from figures every rank agreed on (the mean of theirs). Returns the
  // checkpoint_cadence event's detail; log_line() says the same in words.
  nlohmann::json decide(double stall_seconds, double step_seconds);
  std::string log_line(const nlohmann::json& decision) const;

  struct Due {
    bool save = false;              // a checkpoint is due
    bool stable_candidate = false;  // a stable candidate is due (a checkpoint too, with a guard)
  };
  Due due(int64_t step) const;
  int64_t stable_window() const { return stable_window_; }

 private:
  void set_interval(int64_t every);

  config::CheckpointConfig cfg_;
  int64_t max_steps_;
  int64_t every_ = 0;          // steps between checkpoints; 0 = only at the end
  int64_t stable_every_ = 0;   // steps between stable candidates
  int64_t stable_window_ = 0;  // steps before a stable candidate that must be free of alarms
  bool decided_ = false;
  int64_t attempts_ = 0;  // step attempts this process made before deciding
  Clock::time_point start_;
  std::optional<double> save_stall_s_;
};

}  // namespace keel::train
