// Replay before blame (issue 48). An alarm that would blame the step's data is first checked
// against the machine: the step's forward and backward passes run again on the same weights, the
// same micro-batches and the random state the step began with, before any update. With several
// ranks the micro-batches move one rank on (rank r computes rank r-1's), so that every rank's part
// is computed again on another device, and each rank's own part (its Contribution: its samples'
// summed losses, its gradients' summed squares before any reduction) is compared with what the
// step's own rank computed:
//
//   every part the same           the data (or the model) is at fault: the guard judges the step
//                                 as before;
//   one rank's part differs       that rank computed wrong once (a transient fault): the step goes
//                                 on with the replay's values, nothing is quarantined;
//   a rank wrong in both of the   that rank computes wrong every time (a persistent fault: it is
//   parts it computed             the one device in both differing pairs; with two ranks, the one
//                                 whose own part stood out); the run stops as a faulty device.
//
// One process replays on itself: a transient fault is found, a persistent one looks like the data.
// "The same" is within a tolerance the run measures at its start: each start recomputes its first
// guarded step once and takes the largest relative difference it sees (0 where the run is
// deterministic, as it is on the CPU); parts that differ by more than 1000 times that (at least
// 1e-6) differ. A run noisier than kReplayNoiseLimit cannot tell, and says so.
//
// Owns: the random state of the step in progress, the measured noise and tolerance. Called by:
// trainer.cpp (guarded_update) and replay.cpp. Writes: nothing. Saves: nothing (measured again at
// each start).
#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "train/host_read.h"

namespace keel::train {

// A run whose step, recomputed, moves by more than this (relative) is too noisy to tell a device
// that computed wrong from its own noise: replays are off for that start.
inline constexpr double kReplayNoiseLimit = 1e-5;
// Parts differ when they differ by more than this many times the measured noise (and 1e-6).
inline constexpr double kReplayToleranceFactor = 1000.0;

class ReplayCheck {
 public:
  // The random state micro-step `micro` of the step begins with (taken before each one's forward
  // pass: whatever draws between them, the replay draws what the step drew).
  void remember_rng(torch::Device device, int64_t micro);
  void restore_rng(torch::Device device, int64_t micro) const;

  // Whether this start has measured its noise yet (its first guarded step is replayed for it).
  bool calibrated() const { return noise_.has_value(); }
  void calibrate(double noise);
  // Calibrated, and quiet enough to tell.
  bool enabled() const { return noise_ && *noise_ <= kReplayNoiseLimit; }
  double noise() const { return noise_.value_or(0.0); }
  double tolerance() const;

  // The relative difference of two parts (0: the same to the bit; both NaN count as the same).
  static double difference(const Contribution& a, const Contribution& b);
  // The difference between each rank's part as the step computed it (`step`) and as the replay
  // did (`replay`, where rank r computed rank r-`shift`'s), indexed by the rank whose data it is.
  static std::vector<double> differences(const std::vector<Contribution>& step,
                                         const std::vector<Contribution>& replay, int64_t shift);
  // The rank whose own part stands out: a non-finite one first, else the largest gradient.
  static int64_t suspect(const std::vector<Contribution>& parts);

  // What the replay of a step found.
  struct Finding {
    std::vector<int64_t> transient;   // ranks whose part did not reproduce elsewhere
    std::vector<int64_t> persistent;  // ranks wrong in their own part and in the one they replayed
    bool global_differs = false;      // the reduced result differs though no part does
    bool machine_fault() const {
      return !transient.empty() || !persistent.empty() || global_differs;
    }
  };
  // `differences` per rank's data (above), the step's parts, the replay's shift, and the relative
  // difference of the reduced values (loss, global norm) between the step and its replay.
  Finding judge(const std::vector<double>& differences, const std::vector<Contribution>& step,
                int64_t shift, double global_difference) const;

  // While a replay runs: faults that strike once stay away (faults.h).
  bool replaying() const { return replaying_; }
  void set_replaying(bool on) { replaying_ = on; }

 private:
  std::vector<torch::Tensor> rng_cpu_, rng_device_;  // per micro-step
  std::optional<double> noise_;
  bool replaying_ = false;
};

}  // namespace keel::train
