// The schedule's own failure (issue 47): a peak lr the model cannot take. It shows in the attention
// output long before the loss: per layer, its std grows with the square of the lr while the
// warmup ramps (measured on real text, tiny model: at the end of a 40-step warmup 11x its value
// at initialisation at the configured lr, 135x at 3x, 1,700x at 10x, 11,600x at 30x; the loss
// still looks ordinary there and stalls only later). The watch judges that growth against the
// run's own first measurement, while the model meets its lr: through the warmup and as long
// again after it (at least kGrowthJudgedSteps steps).
//
//   growth >= kGrowthWarn of any layer   warn (signal attention_growth), once per attempt
//   growth >= kGrowthAlarm               a model-side alarm: a back-off is due
//
// Back-off (the trainer carries it out): roll back to the start of the attempt (the run's step-0
// snapshot, or the one the previous back-off restored: the whole attempt met a peak too high, and
// a snapshot from its ramp carries the damage — measured: a back-off from 3x the lr to step 15
// ended 5 % worse than one to step 0; the data replayed: the model was at fault, not the data),
// lower the schedule's peak by kBackoffFactor, warm up again to the new peak, and go on. At most
// kMaxBackoffs; the next alarm stops the run (exit 3) naming an lr to try. The lr at which the
// signal was last quiet is on record, not a bound: the growth follows the updates made, so during
// the ramp it lags the lr (a peak 30x too high read quiet at the warmup's first lr, peak / 40).
//
// Pure host-side logic on a few doubles per log step. Owns: the baseline, this attempt's readings,
// the peak's scale and the rewarm. Called by the Guard (observe_periodic, lr_factor, state).
// Saves: state() in the guard's state, so a resume keeps the lowered schedule.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace keel::guard {

// A back-off the watch decided on, for the trainer to carry out.
struct Backoff {
  int64_t step = 0;          // the log step the alarm came at
  int64_t restart_step = 0;  // the attempt's start: roll back to a snapshot no later than this
  int64_t quiet_step = 0;    // the newest reading below the warn level, and its lr (on record)
  double quiet_lr = 0.0;
  double from_scale = 1.0, to_scale = 1.0;  // the peak's multiplier before and after
  int64_t number = 0;                       // 1 = the run's first back-off
  nlohmann::json signals;                   // per layer: growth; the levels
};

class ScheduleWatch {
 public:
  // `warmup_steps`: the schedule's (resolved). `peak_lr`: optim.lr, for messages.
  ScheduleWatch(int64_t warmup_steps, double peak_lr);

  // A fresh run measures the attention output once before its first update.
  bool needs_baseline() const { return baseline_.empty() && !disabled_; }
  void set_baseline(const std::vector<double>& attention_std);

  // A log step's reading at lr `lr`. Returns the warn, if this reading warns; after an alarm,
  // pending() holds the back-off (or abort() says the run must stop).
  std::optional<nlohmann::json> observe(int64_t step, double lr,
                                        const std::vector<double>& attention_std);
  const std::optional<Backoff>& pending() const { return pending_; }
  // The growth a reading shows (the largest over the layers), for the metrics; nullopt while
  // there is no baseline to judge it against.
  std::optional<double> growth(const std::vector<double>& attention_std) const;
  // The alarm came with every back-off spent: the run cannot train at this lr.
  bool spent() const { return spent_; }
  // The trainer rolled back so that `step` updates are done: the lowered peak applies from here,
  // ramping up again over the warmup when the rollback went to the schedule's last warmup step
  // or past it (within the warmup, the schedule's own ramp goes on to the lowered peak).
  void backed_off(int64_t step);

  // Multiplier on the scheduled lr for the update with index `step`.
  double lr_factor(int64_t step) const;
  // The snapshot a back-off would restore (the attempt's start) while the watch still judges at
  // `step`: checkpoint retention keeps it. nullopt once the window has closed.
  std::optional<int64_t> restart_snapshot(int64_t step) const;
  double scale() const { return scale_; }
  int64_t backoffs() const { return backoffs_; }
  double last_quiet_lr() const { return quiet_lr_; }
  // The message of the stop when spent().
  std::string stop_message() const;

  nlohmann::json state() const;
  // A checkpoint of a keel before the watch (no "schedule_watch"): it never judges (no baseline).
  void load_state(const nlohmann::json& st);

 private:
  int64_t judged_until() const;
  // Each layer's reading over its baseline (null where not finite), the largest, and its layer
  // (-1 when none is finite and above 0).
  struct Reading {
    nlohmann::json per_layer = nlohmann::json::array();
    double growth = 0.0;
    int64_t layer = -1;
  };
  Reading read(const std::vector<double>& attention_std) const;

  int64_t warmup_steps_;
  double peak_lr_;
  std::vector<double> baseline_;  // per layer: the attention-output std before the first update
  bool disabled_ = false;
  double scale_ = 1.0;
  int64_t backoffs_ = 0;
  int64_t attempt_start_ = 0;  // the step the current attempt (the run, or a back-off) began at
  int64_t rewarm_from_ = -1;   // a back-off past the warmup: the ramp starts here
  // This attempt: the newest reading below the warn level, and whether it warned.
  int64_t quiet_step_ = 0;
  double quiet_lr_ = 0.0;
  bool warned_ = false;
  bool spent_ = false;
  std::optional<Backoff> pending_;
};

// Growth of the attention-output std over its value at initialisation (any layer) that warns, and
// that calls for a back-off. Clean runs at the configured lr stayed below 21x within the judged
// window and below 42x in 400 steps (docs/stability.md); 3x the lr passes 100x by 1.5 warmups.
inline constexpr double kGrowthWarn = 50.0;
inline constexpr double kGrowthAlarm = 100.0;
// The judged window: the warmup and as long again after it, at least this many steps.
inline constexpr int64_t kGrowthJudgedSteps = 100;
// Each back-off lowers the peak half an order of magnitude (the step of a usual lr sweep: 1, 3,
// 10, 30): the growth goes with the square of the lr, so one step cuts it about 10x.
inline constexpr double kBackoffFactor = 0.31622776601683794;  // 1 / sqrt(10)
// Four half-decade steps cover a peak two orders of magnitude too high.
inline constexpr int64_t kMaxBackoffs = 4;

}  // namespace keel::guard
