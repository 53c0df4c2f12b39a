// What the chosen checkpoint interval costs, estimated before launch for `keel validate`: the size
// of one checkpoint, how long it takes to write on this machine's checkpoint disk, how long
// training stalls for it (the whole write when synchronous, the host copy when async), and that
// stall as a share of the training time between two saves.
//
// Two short probes measure this machine rather than assume it: a write of up to 64 MiB through
// the checkpoint writer (hashing, fsync) into the checkpoint directory, and a square matmul in the
// run's precision on the run's device for the step time. The step time derived from the matmul
// peak assumes a model FLOPs utilisation (kAssumedMfu); a measured step time (--step-time, from a
// previous run's metrics) replaces that guess.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "config/schema.h"

namespace keel::cli {

inline constexpr double kAssumedMfu = 0.35;
// Above this share of training time, `keel validate` warns about the checkpoint interval.
inline constexpr double kCheckpointShareWarn = 0.05;

struct CheckpointCostOptions {
  int64_t world_size = 1;
  bool probe = true;  // false: no disk or matmul probe (figures that need one are absent)
  std::optional<double> step_seconds;  // measured optimizer step time, replaces the estimate
};

struct CheckpointCost {
  int64_t parameters = 0;
  double checkpoint_bytes = 0;
  std::string probe_dir;  // where the disk probe wrote
  std::optional<double> disk_write_bytes_per_s;
  std::optional<double> host_copy_bytes_per_s;
  double flops_per_step = 0;
  std::optional<double> matmul_flops_per_s;  // measured peak on the run's device and precision
  bool device_absent = false;  // the run's device is not on this machine: no matmul probe
  std::optional<double> step_seconds;
  bool step_seconds_measured = false;  // true when given by the user
  int64_t interval_steps = 0;  // steps between saves (max_steps when only at the end; 0 unknown)
  bool auto_interval = false;  // checkpoint.every_steps: auto (interval_steps estimated here)
  int64_t stable_interval_steps = 0;
  std::optional<double> write_seconds;  // one checkpoint, start to durable
  std::optional<double> stall_seconds;  // training time lost per save
  std::optional<double> share;          // stall / (interval * step + stall)
};

CheckpointCost estimate_checkpoint_cost(const config::Config& config,
                                        const CheckpointCostOptions& options);

// Human-readable lines for `keel validate` ("estimate: ..."), one figure per line.
std::string format_checkpoint_cost(const CheckpointCost& cost, const config::Config& config);

}  // namespace keel::cli
