// The one error hierarchy of keel. Every error is caught in main(), which maps it to an exit code:
//   2  the user's input is wrong (config, flags, data) — UserError and its children;
//   3  the run stopped itself on purpose (data-count mismatch, too many rollbacks, stall, its
//   record could not be written) — RunStopped — or a collective failed, most often because
//   another rank died first — DistError;
//   4  a device computes wrong: this node, not the run (a checkpoint was written) — FaultyDevice;
//   128 + signal after SIGTERM/SIGINT (a checkpoint was written) — Interrupted;
//   1  anything else: a bug.
#pragma once

#include <stdexcept>
#include <string>

namespace keel {

inline constexpr int kExitOk = 0;
inline constexpr int kExitBug = 1;
inline constexpr int kExitUserError = 2;
inline constexpr int kExitRunStopped = 3;
// A device computes wrong (train/replay.h): this node, not the run. Resuming elsewhere is safe (a
// checkpoint was written first); scripts/slurm/train.sbatch requeues without the hosts the run
// directory's exclude_hosts names.
inline constexpr int kExitFaultyDevice = 4;

// Something the user gave us is wrong. The message names the file/key/flag and what would be valid.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public UserError {
 public:
  using UserError::UserError;
};

class DataError : public UserError {
 public:
  using UserError::UserError;
};

// A checkpoint that cannot be read or verified. A user error: they pointed us at it.
class CheckpointError : public UserError {
 public:
  using UserError::UserError;
};

// Process-group setup or collective failures.
class DistError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run decided to stop (exit 3): the message says what it saw and why.
class RunStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The run stopped because a device computes wrong (exit kExitFaultyDevice).
class FaultyDevice : public RunStopped {
 public:
  using RunStopped::RunStopped;
};

// A run-record file (metrics, events, eval, samples, forensics, config.resolved.yaml) could not be
// written: a full disk, a vanished run directory. A run without its record is not worth running,
// so the run stops (exit 3) after a last checkpoint attempt; the message names the file.
class RecordError : public RunStopped {
 public:
  using RunStopped::RunStopped;
};

// SIGTERM/SIGINT arrived (a scheduler's preemption, a Ctrl-C): the run finished its step, saved a
// checkpoint, and exits 128 + signal (143 or 130) so a restart loop can tell it from a failure.
class Interrupted : public std::runtime_error {
 public:
  explicit Interrupted(int signal)
      : std::runtime_error("interrupted by signal " + std::to_string(signal)), signal_(signal) {}
  int exit_code() const { return 128 + signal_; }

 private:
  int signal_;
};

}  // namespace keel
