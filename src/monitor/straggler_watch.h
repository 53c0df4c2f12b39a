// Which rank holds the others back. In a synchronous job every rank's step takes as long as the
// slowest one's: the others wait for it in the collectives. So each rank's own work is its step
// time less the time it waited for collectives (Communicator::seconds_waiting); the rank with the
// most is the slowest, and its lag is how far it is behind the median rank. Megatron's straggler
// detector and NVIDIA's resiliency extension score ranks the same way, on per-rank timings.
//
// A rank is a straggler when it is the slowest, by at least kMinLagShare of the median rank's work
// and kMinLagMs, in kWindows logged windows in a row: one warn, then none for that rank for
// kQuietWindows windows. The margins were measured on the 2-core development machine, where
// ranks share cores and a window's lag is noisy (docs/distributed.md, "Stragglers").
//
// Owns: the streak of the current slowest rank and when each rank was last warned about. Called
// by: the trainer at each logged step, on rank 0, with every rank's figures. Writes: nothing.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace keel::monitor {

struct StragglerFigures {
  int slowest_rank = 0;
  double slowest_ms = 0.0;  // its work per step, in the window
  double median_ms = 0.0;   // the median rank's
  double lag_ms = 0.0;      // slowest_ms - median_ms
};

class StragglerWatch {
 public:
  static constexpr double kMinLagShare = 0.25;
  static constexpr double kMinLagMs = 2.0;
  static constexpr int kWindows = 5;
  static constexpr int kQuietWindows = 100;

  // The window's figures from every rank's work per step (ms); nullopt for fewer than 2 ranks.
  static std::optional<StragglerFigures> figures(const std::vector<double>& work_ms);

  // Takes a logged window's figures; returns the rank to warn about when this window makes its
  // streak long enough, and it was not warned about within kQuietWindows windows.
  std::optional<int> observe(const StragglerFigures& f);
  int streak() const { return streak_; }

 private:
  int64_t window_ = 0;
  int streak_rank_ = -1;
  int streak_ = 0;
  std::map<int, int64_t> warned_at_;  // rank -> the window it was last warned about in
};

}  // namespace keel::monitor
