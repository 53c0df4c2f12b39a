// The stability state machine (DESIGN.md): it watches one step's signals and decides whether the
// update is applied, skipped, or the run pauses and rolls back to the newest stable snapshot.
//
//   NORMAL ── grad_norm > warn_factor × median ──► warn (event; the update is applied); every pause
//             below is also preceded by a warn carrying the same diagnosis
//   NORMAL ── non-finite loss or gradient ──► skip the update (skip_nan); max_consecutive_nan in a
//             row escalate to a pause (nan_policy: pause escalates at once, abort stops the run)
//   NORMAL ── grad_norm > pause_factor × median, or loss > loss_alarm_factor × median loss ──►
//             pause: the trainer writes forensics, rolls back to STABLE, quarantines the data
//             window, and calls on_rollback(), which starts RECOVERY: lr × recovery.lr_factor for
//             recovery.steps optimizer steps, then recovery_end and the normal schedule.
//
// Pure host-side logic on a handful of doubles per step: no tensors, trivially unit-testable.
// Statistics only take values of applied updates, so a spike never poisons its own baseline.
// Not thread-safe; one Guard per rank, fed all-reduced values so every rank decides the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/schema.h"
#include "guard/running_stats.h"

namespace keel::guard {

struct StepSignals {
  int64_t step = 0;                      // optimizer step index about to be applied
  double loss = 0.0;                     // mean batch cross-entropy
  double grad_norm = 0.0;                // global L2, before clipping
  std::vector<double> layer_grad_norms;  // one per layer group (same order as layer_names)
  bool clipped = false;
  std::optional<double> loss_scale;  // fp16 only
};

// kAbort: the run must stop (nan_policy abort, or past the rollback budget); the decision's last
// event is the abort, which the trainer records before it stops.
enum class Action { kApply, kSkip, kPause, kAbort };

struct GuardEvent {
  std::string kind;  // warn | skip_nan | pause | recovery_end | abort
  nlohmann::json detail;
};

struct Decision {
  Action action = Action::kApply;
  std::vector<GuardEvent> events;
  std::string stop_message;  // kAbort: why the run stops, for the person reading the log
};

class Guard {
 public:
  // `warmup_steps`: the schedule's warmup. Signals that move by design while the lr ramps up
  // (clip rate, update ratios, activation statistics) stay silent until it is over, and the clip
  // rate until a whole window after it.
  Guard(const config::StabilityConfig& cfg, std::vector<std::string> layer_names,
        int64_t warmup_steps = 0);

  Decision observe(const StepSignals& s);
  // Signals too costly for every step, read at log steps: per-layer update ratios |Δw|/|w| and
  // attention-output std per layer, compared with a slow trend of its own (an EMA of its log)
  // that follows the training trajectory; a drift warns only when it persists over
  // kDriftPersistence log steps. Returns warn events.
  std::vector<GuardEvent> observe_periodic(int64_t step, const std::vector<double>& update_ratios,
                                           const std::vector<double>& attention_std);
  // Call after every applied update; returns recovery_end when the recovery overlay just ended.
  std::optional<GuardEvent> after_update(int64_t completed_steps);
  // The run rolled back so that `step` updates are done; recovery covers the next recovery.steps.
  // Past rollback.max_rollbacks the decision is kAbort, with every incident in its message.
  Decision on_rollback(int64_t step, const nlohmann::json& incident);

  // Starts the recovery overlay for the recovery.steps updates after `step` without counting a
  // rollback (a resume that is a recovery).
  void start_recovery(int64_t step);
  // Multiplier on the scheduled lr for the update with index `step` (recovery overlay).
  double lr_factor(int64_t step) const;
  bool in_recovery(int64_t step) const { return step < recovery_until_; }
  // A snapshot at `step` may become stable: no alarm within the last `window` steps (when
  // required) and the loss not above its running median band.
  bool promotable(int64_t step, int64_t window, bool require_no_alarms) const;

  int64_t rollbacks() const { return rollbacks_; }
  const nlohmann::json& incidents() const { return incidents_; }
  double grad_norm_median() const { return grad_norms_.median(); }
  double grad_norm_mean() const { return grad_norms_.mean(); }
  double grad_norm_stddev() const { return grad_norms_.stddev(); }
  bool baseline_ready() const;
  double loss_median() const { return losses_.median(); }

  // Everything observe() and friends depend on, so a resumed run decides exactly as the
  // uninterrupted one would (warn suppression windows and the loss-scale watch included).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  nlohmann::json layer_report(const StepSignals& s) const;
  void note_alarm(int64_t step) { last_alarm_step_ = step; }
  void watch_rates(const StepSignals& s, Decision& d);

  config::StabilityConfig cfg_;
  std::vector<std::string> layer_names_;
  RunningWindow grad_norms_, losses_, clip_flags_;
  std::vector<RunningWindow> layer_norms_;
  int64_t warmup_steps_;
  std::vector<double> attention_trend_;      // per layer: EMA of log(attention-output std)
  std::vector<int64_t> attention_drifting_;  // per layer: consecutive log steps off the trend
  int64_t consecutive_nan_ = 0;
  int64_t rollbacks_ = 0;
  int64_t recovery_until_ = -1;
  bool recovery_announced_ = true;
  int64_t last_alarm_step_ = -1;
  int64_t last_rate_warn_step_ = -1;
  int64_t last_periodic_warn_step_ = -1;
  std::optional<double> last_loss_scale_;
  RunningWindow scale_drops_, scale_rises_;
  nlohmann::json incidents_ = nlohmann::json::array();
};

// Minimum samples in the window before an alarm can fire: a baseline of two values is no baseline.
inline constexpr int64_t kMinBaselineSteps = 10;
// Attention-output std this many times above or below its trend warns, after kDriftPersistence
// log steps in a row (a lasting change, not one noisy reading).
inline constexpr double kAttentionDriftFactor = 3.0;
inline constexpr int64_t kDriftPersistence = 2;
// Weight of the newest reading in the attention trend (per log step): slow enough that a jump
// stands out, fast enough to follow the growth of healthy training.
inline constexpr double kAttentionTrendWeight = 0.3;

}  // namespace keel::guard
