#include "monitor/straggler_watch.h"

#include <algorithm>

namespace keel::monitor {

std::optional<StragglerFigures> StragglerWatch::figures(const std::vector<double>& work_ms) {
  if (work_ms.size() < 2) return std::nullopt;
  StragglerFigures f;
  const auto slowest = std::max_element(work_ms.begin(), work_ms.end());
  f.slowest_rank = static_cast<int>(slowest - work_ms.begin());
  f.slowest_ms = *slowest;
  std::vector<double> sorted = work_ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  // The lower median: with 2 ranks it is the other rank, so a lag is always measured against one.
  f.median_ms = sorted[(n - 1) / 2];
  f.lag_ms = f.slowest_ms - f.median_ms;
  return f;
}

std::optional<int> StragglerWatch::observe(const StragglerFigures& f) {
  ++window_;
  const bool lagging = f.lag_ms >= kMinLagMs && f.lag_ms >= kMinLagShare * f.median_ms;
  if (!lagging) {
    streak_rank_ = -1;
    streak_ = 0;
    return std::nullopt;
  }
  if (f.slowest_rank != streak_rank_) {
    streak_rank_ = f.slowest_rank;
    streak_ = 0;
  }
  if (++streak_ < kWindows) return std::nullopt;
  const auto last = warned_at_.find(f.slowest_rank);
  if (last != warned_at_.end() && window_ - last->second < kQuietWindows) return std::nullopt;
  warned_at_[f.slowest_rank] = window_;
  return f.slowest_rank;
}

}  // namespace keel::monitor
