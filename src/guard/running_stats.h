// Host-side running statistics over the last N values of a per-step signal (grad norm, loss,
// per-layer norms, per-sample losses). The Guard reads one small packed tensor per step, so these
// live on the host.
//
// Owns: the newest values (RunningWindow); a tail's newest window and the steps that taught its
// rate (TailRate). Called by: their owners: the guard (guard.cpp, advisory.cpp, guard_state.cpp)
// and train/accumulation.cpp (the normalized norms). Writes: nothing. Saves: nothing of its own:
// state() goes under its owner's key (trainer_state.json's "guard", or "grad_accum"'s "norms");
// load_state() keeps the capacity its owner built it with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::guard {

class RunningWindow {
 public:
  explicit RunningWindow(int64_t capacity = 100) : capacity_(capacity < 1 ? 1 : capacity) {}
  void push(double value);
  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  bool empty() const { return values_.empty(); }
  double median() const;  // upper median for even counts; NaN when empty
  // Median absolute deviation from the median (upper medians); NaN when empty. 1.4826 x MAD
  // estimates the standard deviation of normal data, robustly to outliers.
  double mad() const;
  // The upper median of the newest `n` values (all of them when fewer); NaN when empty.
  double median_of_last(int64_t n) const;
  // The step-to-step noise as a robust standard deviation: 1.4826 x the median absolute
  // difference of consecutive values / sqrt(2). A smooth trend (a falling loss) barely moves it,
  // unlike the spread around the median. NaN with fewer than 2 values.
  double difference_sigma() const;
  double mean() const;
  double stddev() const;  // population standard deviation
  double sum() const;
  // The least-squares slope of the values against their order (per value); NaN with fewer than 2.
  double slope() const;
  int64_t capacity() const { return capacity_; }
  double last() const { return values_.back(); }  // precondition: !empty()
  void clear() { values_.clear(); }
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  int64_t capacity_;
  std::deque<double> values_;
};

// The run's own rate of a tail of the per-sample losses (samples the screen masked, samples below
// the low bound): the newest window's count, and the rate of the windows before it (up to
// `windows` of them), from the steps allowed to teach it. A window is judged against the rate of
// the windows before it, never against itself.
class TailRate {
 public:
  TailRate(int64_t window, int64_t windows)
      : window_(window < 1 ? 1 : window), counts_(window_ * windows), samples_(window_ * windows) {}
  // One step: `count` of its `samples` in the tail; `learn`: whether it may teach the rate once it
  // leaves the newest window (not in warmup, not during an incident).
  void push(double count, double samples, bool learn);
  double recent_count() const;
  double recent_samples() const;
  int64_t recent_steps() const { return static_cast<int64_t>(recent_.size()); }
  // The rate taught so far (tail count per sample; 0 before any step taught it).
  double rate() const { return counts_.sum() / std::max(samples_.sum(), 1.0); }
  // The rate has been taught by at least one whole window of steps.
  bool learned() const { return samples_.size() >= window_; }
  // What the newest window may hold: `floor`, and once the rate is learned, lambda + z sqrt(lambda)
  // + z, lambda the count that rate predicts for the window (z = 4: a Poisson count passes it
  // with probability about 1e-4).
  int64_t allowance(int64_t floor) const;
  // The newest window warned: none of it may teach the rate (a bad source must not teach the
  // bar that flags it to rise).
  void forget_recent() {
    for (Step& s : recent_) s.learn = false;
  }
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  struct Step {
    double count, samples;
    bool learn;
  };
  void retire_beyond_window();
  int64_t window_;
  std::deque<Step> recent_;
  RunningWindow counts_, samples_;  // the steps that left the newest window and could teach
};

}  // namespace keel::guard
