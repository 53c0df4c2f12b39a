// The seed's §3.2, repeated data: the same documents coming back (a shard listed twice, a
// pre-tokenized corpus that never passed through dedup, a loader that wraps early) make the loss
// dip at regular times and bounce back. Two host-side detectors, no tensors:
//   RepeatWatch      exact repeats: a sample's content fingerprint (the trainer hashes its token
//                    window) seen before under another sample id. The same id again is the next
//                    epoch or the data after a rollback, not a repeat.
//   LossPeriodicity  a periodic dip in the loss of the applied steps, the symptom a person sees.
// The guard turns their findings into warnings (guard.h); the trainer masks repeated samples
// when stability.screen.low is quarantine.
//
// Owns: the newest kRepeatWatchSamples (hash, id) pairs and the id each content was first seen
// under (RepeatWatch); the newest kPeriodWindow losses (LossPeriodicity). Called by: the trainer
// (train/screen.cpp: duplicate_of, remember; snapshot.cpp: state, load_state) for RepeatWatch;
// the guard (guard.cpp, advisory.cpp, guard_state.cpp) for LossPeriodicity. Writes: nothing.
// Saves: RepeatWatch's pairs as the checkpoint's extra tensor "repeat_watch" (guard on), loaded
// by a resume and kept through a rollback; LossPeriodicity under trainer_state.json's "guard"
// ("loss_periodicity").
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::guard {

// Samples the repeat watch remembers (the most recent): 262,144 × (16 bytes + the map's entry),
// about 20 MB, and for a run of 512 samples a step still 512 steps back.
inline constexpr int64_t kRepeatWatchSamples = int64_t{1} << 18;

class RepeatWatch {
 public:
  explicit RepeatWatch(int64_t capacity = kRepeatWatchSamples)
      : capacity_(capacity < 1 ? 1 : capacity) {}

  // The id under which content `hash` was first seen, when that is not `id`; nullopt otherwise.
  std::optional<int64_t> duplicate_of(uint64_t hash, int64_t id) const;
  // Remembers one step's samples (every rank's, in the same order on every rank); past the
  // capacity the oldest are forgotten.
  void remember(const std::vector<uint64_t>& hashes, const std::vector<int64_t>& ids);
  int64_t size() const { return static_cast<int64_t>(order_.size()); }

  // What a resumed run needs to find the same repeats: (hash, id) pairs, oldest first.
  std::vector<int64_t> state() const;
  void load_state(const std::vector<int64_t>& flat);

 private:
  struct Seen {
    int64_t first_id = 0;  // the id the content was first seen under (while remembered)
    int64_t count = 0;     // remembered samples with this content
  };
  int64_t capacity_;
  std::deque<std::pair<uint64_t, int64_t>> order_;  // (hash, id), oldest first
  std::unordered_map<uint64_t, Seen> seen_;
};

// Periodic dips in the loss series. Each applied step's loss joins a window of kPeriodWindow;
// the residuals against a trailing kPeriodMedian-step median remove the trend. A period K in
// [kMinPeriod, window / 3] is found when the residuals' autocorrelation at lag K reaches
// kPeriodCorrelation and the newest step and the two K and 2K before it are dips: below the
// residuals' median by kDipSigmas robust standard deviations.
inline constexpr int64_t kPeriodWindow = 240;
inline constexpr int64_t kPeriodMedian = 9;
inline constexpr int64_t kMinPeriod = 3;
inline constexpr double kPeriodCorrelation = 0.5;
inline constexpr double kDipSigmas = 3.0;

class LossPeriodicity {
 public:
  struct Finding {
    int64_t period = 0;
    double correlation = 0.0;  // the residuals' autocorrelation at the period
    double dip = 0.0;          // the newest step's residual, in robust standard deviations
  };
  void push(double loss);
  std::optional<Finding> detect() const;
  nlohmann::json state() const { return losses_; }
  void load_state(const nlohmann::json& state);

 private:
  std::deque<double> losses_;
};

}  // namespace keel::guard
