// The stability state machine (DESIGN.md): it watches one step's signals and decides whether the
// update is applied, skipped, or the run pauses and rolls back to the newest stable snapshot.
//
//   SCREEN   before every update the trainer masks the samples whose loss is above
//            screen_threshold() (far above the running per-sample baseline) out of the loss and
//            sets them aside; the rest of the batch trains. A step whose every sample was masked
//            is skipped. The first masked step after a quiet spell warns (signal "screen").
//   NORMAL ── grad_norm > warn_factor × median ──► warn (event; the update is applied); every pause
//             below is also preceded by a warn carrying the same diagnosis
//   NORMAL ── non-finite loss or gradient ──► skip the update (skip_nan); max_consecutive_nan in a
//             row escalate to a pause (nan_policy: pause escalates at once, abort stops the run).
//             An fp16 overflow is the loss scaler's business (skip, halve the scale: event
//             `overflow`), unless the scale has collapsed or overflows never stop.
//   NORMAL ── grad_norm > pause_factor × median, or loss > loss_alarm_factor × median loss ──►
//             an alarm, handled as part of an INCIDENT:
//
// Diagnosis. An alarm (and a step the screen masked whole) asks whether the model or the data is
// at fault: the trainer measures the model on a fixed reference batch against the newest stable
// snapshot's measure and calls resolve(). A model no worse than the snapshot it would roll back to
// gains nothing from a rollback: the offending step is dropped (its data set aside), and the run
// goes on (diagnosis "data"). A model worse than that snapshot rolls back (diagnosis "model"):
// Incidents. The first alarm opens an incident; alarms that follow before training has made
// progress on clean data again (kIncidentQuietSteps updates in a row with no alarm and nothing
// screened out) belong to it. Within an incident the remedy escalates, so it ends in at most
// rollback.max_rollbacks rollbacks whatever the length of a bad region:
//   1st rollback   pause: forensics, rollback to STABLE, the data since it set aside plus
//                  rollback.skip_ahead_steps, RECOVERY (lr × recovery.lr_factor for
//                  recovery.steps updates);
//   next ones      pause again, the skip-ahead doubled each time (at least the attempts the
//                  incident has lasted), until max_rollbacks rollbacks;
//   after that     the offending step is skipped (its data set aside), no rollback.
// The run stops (abort, exit 3, every incident summarised) when clearly stuck: more than
// rollback.max_incidents incidents opened within rollback.incident_window_steps attempts, or
// rollback.stuck_steps attempts in a row without an applied update.
//
// Pure host-side logic on a handful of doubles per step: no tensors, trivially unit-testable.
// Statistics only take values of applied updates (and kept samples), so a spike never poisons its
// own baseline. Not thread-safe; one Guard per rank, fed all-reduced values so every rank decides
// the same.
//
// Owns: the baselines (running windows of the grad norm, the loss, the per-layer norms and the
// kept samples' losses), the tail rates, the loss-scale watch, the loss periodicity, the attention
// trends, the warning windows, the streaks, the incidents and the recovery overlay. Called by:
// setup.cpp (built when stability.enabled), verdict.cpp (pause_levels, observe, resolve),
// trainer.cpp (the screen's thresholds, the clip statistics, after_update), step_record.cpp
// (observe_periodic, in_recovery), learning_rate.cpp (lr_factor), recovery.cpp (rolled_back,
// start_recovery) and snapshot.cpp (state, load_state, promotable). Writes: nothing (its decisions
// carry GuardEvents, which the trainer puts in events.jsonl). Saves: all of it but the step
// awaiting diagnosis (within one step) in trainer_state.json's "guard" (guard_state.cpp): a
// resume loads it whole, a rollback only the snapshot's baselines.
#pragma once

#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/event_kind.h"
#include "config/schema.h"
#include "guard/repeats.h"
#include "guard/running_stats.h"
#include "guard/schedule_watch.h"

namespace keel::guard {

struct StepSignals {
  int64_t step = 0;                      // optimizer step index about to be applied
  int64_t iteration = 0;                 // step attempts so far (only moves forward)
  double loss = 0.0;                     // mean cross-entropy over the kept samples
  double grad_norm = 0.0;                // global L2, before clipping
  std::vector<double> layer_grad_norms;  // one per layer group (same order as layer_names)
  bool clipped = false;
  std::optional<double> loss_scale;  // fp16 only
  bool overflow = false;             // fp16: the scaler found inf/NaN in the scaled gradients
  // The screen: samples in the step, the losses of those kept (the per-sample baseline learns
  // from them), and of those masked (above the threshold the step was screened with).
  int64_t samples = 0;
  std::vector<double> kept_losses;
  std::vector<double> masked_losses;
  std::optional<double> screen_threshold;
  // The low side (repeated or memorised data): the threshold the step was judged with (set with
  // screen_threshold), the losses of the samples below it (masked under screen.low quarantine,
  // kept and trained otherwise; either way they never join the baseline), and how many samples
  // repeat content seen before under another id (the trainer's RepeatWatch).
  std::optional<double> low_threshold;
  std::vector<double> low_losses;
  int64_t repeated = 0;
};

// kAbort: the run must stop (nan_policy abort, or clearly stuck); the decision's last event is the
// abort, which the trainer records before it stops.
enum class Action { kApply, kSkip, kPause, kAbort };

// An event the guard decided on: warn, screen, skip_nan, overflow, pause, recovery_end,
// incident_end or abort. The trainer reads only the typed fields; record() is the detail
// events.jsonl records, serialised here alone.
struct GuardEvent {
  GuardEvent(EventKind k, nlohmann::json d, std::string m = {})
      : kind(k), detail(std::move(d)), message(std::move(m)) {}

  EventKind kind;
  nlohmann::json detail;  // the figures the event was decided on
  std::string message;    // warn: the line a person reads in the log (empty otherwise)
  // A screen event, or a warn about the screen: the trainer names the masked samples in it
  // (name_samples).
  bool about_screened_samples = false;
  // A warn about repeated data (repeated_data, low_loss, loss_periodicity): the trainer names the
  // step's repeated and low samples in it (or its lowest-loss ones), with where they are.
  bool about_low_samples = false;

  void name_samples(nlohmann::json top_samples) { detail["top_samples"] = std::move(top_samples); }
  nlohmann::json record() const;
};

// Why a step's update was not applied.
enum class SkipReason {
  kNone,
  kNonFinite,    // a non-finite loss or gradient
  kOverflow,     // fp16: the loss scaler's overflow
  kScreenedOut,  // the screen masked every sample (diagnosis pending)
  kData,         // the model was fine: the step's data set the alarm off
  kIncident,     // the incident's rollbacks are spent
  kHardware,     // the ranks' reduced gradients disagreed: a device computed wrong
};

struct Decision {
  Action action = Action::kApply;
  // An alarm (or a step screened out whole) whose remedy depends on whether the model or the data
  // is at fault: the trainer measures the model and calls Guard::resolve() before acting.
  bool needs_diagnosis = false;
  std::vector<GuardEvent> events;
  std::string stop_message;  // kAbort: why the run stops, for the person reading the log
  // kAbort for a faulty device: the ranks whose devices compute wrong (the run stops with
  // kExitFaultyDevice after a checkpoint, so that a requeue leaves their hosts out).
  std::vector<int64_t> faulty_ranks;
  int64_t incident = -1;  // kPause, or kSkip within an incident: the incident's id
  // kPause: steps of data to set aside past the pause, besides the window since the snapshot.
  int64_t skip_ahead_steps = 0;
  SkipReason skip_reason = SkipReason::kNone;  // kSkip: why the update was not applied
  // kPause, or kSkip within an incident: which alarm of the incident this is (1 = its first).
  int64_t alarm_in_incident = 0;
  // kPause with a rollback: which rollback of the incident it is (1 = its first).
  int64_t rollback = 0;
};

// Whether several ranks' global gradient norms (rank order; empty or one: trivially) are the same
// to the bit, as healthy replicas' reduced gradients make them; Guard::replicas_disagree otherwise.
bool replicas_agree(const std::vector<double>& rank_grad_norms);

// The levels past which observe() pauses the step, known before the step's values are. With them
// the device refuses an update before the host has read the step (stability.update_gate: device):
// observe() refuses exactly the steps whose loss or gradient norm is non-finite, whose fp16 scaler
// overflowed, whose every sample the screen masked, or whose values lie above these levels, and
// applies every other (a pause that diagnosis turns into an applied update aside). Plain
// comparisons, so the device's verdict and the host's agree to the bit.
struct PauseLevels {
  double grad_norm = std::numeric_limits<double>::infinity();  // pause_factor x its median
  // The lower of loss_alarm_factor x its median and the loss jump's level (the larger of
  // kLossJumpRatio x its recent level and that level plus kLossJumpZ x its step-to-step noise).
  double loss = std::numeric_limits<double>::infinity();
  // The loss jump's level alone, once the loss has a baseline: above it a step warns, in warmup
  // too; after warmup it pauses (it is part of `loss`).
  double loss_jump = std::numeric_limits<double>::infinity();
  bool norm_pause(double grad_norm_value) const { return grad_norm_value > grad_norm; }
  bool loss_pause(double loss_value) const { return loss_value > loss; }
};

// Whether the guard refuses a step's update: a non-finite loss or gradient norm, an fp16 overflow,
// no sample kept by the screen, or a value past its pause level. The one rule for both sides:
// observe() applies it to the host's doubles, the device's update gate (stability.update_gate:
// device) to the step's fp64 tensors, before the host has read them. It is written with operators
// alone, which mean the same on a double and on a tensor (x - x is 0 exactly when x is finite).
// Diagnosis may still apply a refused update (a grad-norm pause found to be the model's own scale).
template <class Value>
auto refuses_update(const PauseLevels& levels, const Value& loss, const Value& grad_norm,
                    const Value& overflow, const Value& kept) {
  const auto non_finite = [](const Value& x) { return (x - x) != 0; };
  return non_finite(loss) | non_finite(grad_norm) | (overflow > 0) | (kept <= 0) |
         (grad_norm > levels.grad_norm) | (loss > levels.loss);
}

class Guard {
 public:
  // `warmup_steps`: the schedule's warmup. Signals that move by design while the lr ramps up
  // (clip rate, update ratios, activation statistics) stay silent until it is over, and the clip
  // rate until a whole window after it. `samples_per_step` sizes the per-sample baseline of the
  // screen (median_window steps' worth, within [screen.min_samples, kMaxScreenWindow]).
  // `cfg` is resolved (config::resolve_auto): recovery.steps and rollback.stuck_steps are numbers,
  // not auto; std::invalid_argument otherwise.
  // `peak_lr`: optim.lr, the schedule's peak the back-off scales (schedule_watch.h).
  Guard(const config::StabilityConfig& cfg, std::vector<std::string> layer_names,
        int64_t warmup_steps = 0, int64_t samples_per_step = 1, double peak_lr = 0.0);

  // The per-sample loss above which the screen masks a sample in step `step`; nullopt while the
  // screen is off (disabled, or its baseline holds fewer than screen.min_samples samples).
  std::optional<double> screen_threshold(int64_t step) const;
  // The per-sample loss below which a sample is low in step `step`: min(median / screen.factor²,
  // median - screen.z robust standard deviations) of the same baseline; nullopt while the screen
  // is off or when that is not above 0.
  std::optional<double> low_threshold(int64_t step) const;

  // Several ranks whose reduced gradients should be equal (every rank's global norm, in rank
  // order) disagree: a device computed a wrong result, which neither the data nor the model
  // explains. The step is skipped on every rank (nothing quarantined) with a hardware_fault event
  // naming the ranks outside the majority (without one: `stood_out`, the rank whose own part of
  // the step stood out, else none, every rank then a suspect); the device rule below applies.
  // Call it instead of observe() for that step.
  Decision replicas_disagree(const StepSignals& s, const std::vector<double>& rank_grad_norms,
                             std::optional<int64_t> stood_out = std::nullopt);
  // A replay of the step (train/replay.h) did not reproduce it on `ranks` (a transient fault: the
  // step goes on with the replay's values), or found that they compute it wrong every time
  // (`persistent`). A hardware_fault event with `detail`; the run stops as a faulty device
  // (Decision::faulty_ranks, kAbort) at once when the fault is persistent, and when a rank has
  // kDeviceFaultsToStop faults within kDeviceFaultWindow attempts. Nothing else moves: the guard
  // judges the step's replayed values afterwards, as any other step's.
  Decision device_fault(int64_t iteration, const std::vector<int64_t>& ranks, bool persistent,
                        nlohmann::json detail, const std::string& what);

  // The levels observe() pauses step `step` at (its values not yet known).
  PauseLevels pause_levels(int64_t step) const;
  Decision observe(const StepSignals& s);
  // Completes a decision that needs_diagnosis with `model_ratio`: the model's loss on the reference
  // batch over the newest stable snapshot's (NaN when unknown, which counts as worse). Above
  // kModelWorse the model is at fault; otherwise the data is.
  Decision resolve(Decision d, double model_ratio);
  // Signals too costly for every step, read at log steps (`lr`: the step's): per-layer update
  // ratios |Δw|/|w| and attention-output std per layer, compared with a slow trend of its own (an
  // EMA of its log) that follows the training trajectory; a drift warns only when it persists
  // over kDriftPersistence log steps. The same std against its value at initialisation is the
  // schedule watch's (schedule_watch.h): past its alarm level backoff_due() holds a back-off, or
  // backoffs_spent() the stop. Returns warn events.
  std::vector<GuardEvent> observe_periodic(int64_t step, const std::vector<double>& update_ratios,
                                           const std::vector<double>& attention_std,
                                           double lr = 0.0);
  // The schedule watch's baseline: a fresh run measures the attention output before its first
  // update (every rank the same values, averaged over the ranks).
  bool needs_attention_baseline() const { return schedule_.needs_baseline(); }
  void set_attention_baseline(const std::vector<double>& attention_std) {
    schedule_.set_baseline(attention_std);
  }
  // A back-off the schedule watch decided on at the last log step, for the trainer to carry out
  // (Recovery::back_off), or nullopt.
  const std::optional<Backoff>& backoff_due() const { return schedule_.pending(); }
  // The watch's alarm came with every back-off spent: the abort decision (exit 3).
  std::optional<Decision> backoffs_spent() const;
  // The trainer rolled back for the pending back-off so that `step` updates are done (the
  // snapshot's state, as for rolled_back(): its baselines): the lowered peak applies from here.
  void backed_off(int64_t step, const nlohmann::json& snapshot_state = nullptr);
  const ScheduleWatch& schedule_watch() const { return schedule_; }
  // Call after every applied update: recovery_end when the recovery overlay just ended,
  // incident_end when the open incident closed.
  std::vector<GuardEvent> after_update(int64_t completed_steps);
  // The trainer rolled back (the pause of an incident) so that `step` updates are done; recovery
  // covers the next recovery.steps updates. `snapshot_state` (the snapshot's state(), or null)
  // gives back the baselines of the model that is trained again — the running medians of the
  // abandoned timeline describe a model that no longer exists — while the incidents, alarms and
  // warning windows stay as they are.
  void rolled_back(int64_t step, const nlohmann::json& snapshot_state = nullptr);

  // Starts the recovery overlay for the recovery.steps updates after `step` without counting a
  // rollback (a resume that is a recovery).
  void start_recovery(int64_t step);
  // Multiplier on the scheduled lr for the update with index `step`: the recovery overlay times
  // the schedule watch's lowered peak (and its ramp after a back-off).
  double lr_factor(int64_t step) const;
  bool in_recovery(int64_t step) const { return step < recovery_until_; }
  bool in_incident() const { return open_.has_value(); }
  // A snapshot at `step` may become stable: no alarm within the last `window` steps (when
  // required), no open incident, not recovering, and the loss not above its running median band.
  bool promotable(int64_t step, int64_t window, bool require_no_alarms) const;

  int64_t rollbacks() const { return rollbacks_; }
  // Every incident so far (the open one last), as summaries for events and the abort message.
  nlohmann::json incidents() const;
  double grad_norm_median() const { return grad_norms_.median(); }
  double grad_norm_mean() const { return grad_norms_.mean(); }
  double grad_norm_stddev() const { return grad_norms_.stddev(); }
  bool baseline_ready() const;
  // The loss keeps its baseline when the grad-norm one restarts (accept_gradient_scale).
  bool loss_baseline_ready() const;
  double loss_median() const { return losses_.median(); }

  // Everything observe() and friends depend on, so a resumed run decides exactly as the
  // uninterrupted one would (warn suppression windows, the screen's baseline, the open incident
  // and the loss-scale watch included).
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state);

 private:
  // The levels an alarm is judged on: the gradient norm and the loss against their medians.
  struct AlarmLevels {
    double norm_median = 0.0, norm_ratio = 0.0;
    double loss_median = 0.0, loss_ratio = 0.0, loss_recent = 0.0;
  };
  bool absorb_overflow(const StepSignals& s, Decision& d);
  bool refuse_non_finite(const StepSignals& s, Decision& d);
  GuardEvent alarm_warn(const StepSignals& s, const AlarmLevels& a) const;
  struct Incident {
    int64_t id = 0;
    int64_t first_step = 0, first_iteration = 0;
    int64_t furthest_step = 0;  // the furthest step an alarm of it came at
    int64_t alarms = 0, rollbacks = 0, skipped = 0;
    int64_t quiet = 0;   // clean updates in a row since its last alarm
    std::string reason;  // the first alarm's
    nlohmann::json to_json() const;
    static Incident from_json(const nlohmann::json& j);
  };

  nlohmann::json layer_report(const StepSignals& s) const;
  void note_alarm(int64_t step) { last_alarm_step_ = step; }
  void remedy(const StepSignals& s, bool model_worse, nlohmann::json& detail, Decision& d);
  void load_baselines(const nlohmann::json& st);
  void watch_rates(const StepSignals& s, Decision& d);
  void watch_clip_rate(const StepSignals& s, Decision& d);
  void watch_loss_scale(const StepSignals& s, Decision& d);
  bool rate_may_warn(int64_t step) const;
  void rate_warn(int64_t step, Decision& d, nlohmann::json detail, std::string message);
  void watch_update_ratios(int64_t step, const std::vector<double>& update_ratios, bool may_warn,
                           std::vector<GuardEvent>& events);
  void watch_attention(int64_t step, const std::vector<double>& attention_std, bool may_warn,
                       std::vector<GuardEvent>& events);
  void watch_screen(const StepSignals& s, Decision& d);
  // Repeated data: content seen under another id, samples far below the baseline (warns), and
  // after an applied step a periodic dip in the loss.
  void watch_repeats(const StepSignals& s, Decision& d);
  void watch_repeated_ids(const StepSignals& s, Decision& d);
  void watch_low_losses(const StepSignals& s, Decision& d);
  std::string low_side_fate() const;
  void watch_periodicity(const StepSignals& s, Decision& d);
  // An alarm that calls for a rollback: opens or joins an incident and escalates.
  // An alarm: opens or joins an incident (or aborts past the rate budget); resolve() picks the
  // remedy.
  void escalate(const StepSignals& s, const std::string& reason, nlohmann::json detail,
                Decision& d);
  void abort(const std::string& reason, const std::string& message, nlohmann::json detail,
             Decision& d) const;
  // Counts a step attempt that applied nothing; past stuck_steps in a row the run stops.
  void count_unapplied(const StepSignals& s, Decision& d);
  // The pending grad-norm alarm is the model's gradient scale, not the data: apply the step and
  // restart the grad-norm baselines from it.
  void accept_gradient_scale(const StepSignals& s, Decision& d);
  // The values of an applied step join the baselines.
  void absorb(const StepSignals& s);

  config::StabilityConfig cfg_;
  std::vector<std::string> layer_names_;
  RunningWindow grad_norms_, losses_;
  // Per applied step: clipped or not. It learns the run's own clip rate after warmup.
  TailRate clip_tail_;
  std::vector<RunningWindow> layer_norms_;
  RunningWindow sample_losses_;  // kept samples' losses: the screen's baseline
  int64_t warmup_steps_;
  std::vector<double> attention_trend_;      // per layer: EMA of log(attention-output std)
  std::vector<int64_t> attention_drifting_;  // per layer: consecutive log steps off the trend
  // Per layer: |log(std) - trend| at the settled log steps that did not drift (its variability).
  std::vector<RunningWindow> attention_deviation_;
  int64_t consecutive_nan_ = 0;
  int64_t consecutive_overflow_ = 0;
  int64_t unapplied_in_a_row_ = 0;
  int64_t norm_only_skips_ = 0;  // grad-norm pauses in a row, loss normal, dropped as data
  int64_t rollbacks_ = 0;
  int64_t recovery_until_ = -1;
  bool recovery_announced_ = true;
  int64_t last_alarm_step_ = -1;
  int64_t last_rate_warn_step_ = -1;
  int64_t last_clip_warn_step_ = -1;
  int64_t last_periodic_warn_step_ = -1;
  int64_t last_screen_step_ = -1;  // the last step the screen masked a sample in
  int64_t last_screen_warn_step_ = -1;
  TailRate screen_tail_;      // per step while the screen is on: samples masked, of those seen
  bool applied_any_ = false;  // fp16 start-up: overflows before the first update calibrate
  std::optional<double> last_loss_scale_;
  RunningWindow scale_drops_;
  RunningWindow scale_log2_;  // fp16: log2 of the loss scale at every step after start-up
  TailRate low_tail_;         // per step while the screen is on: samples below the low threshold
  // Per step: samples repeating content seen under another id, of those seen. It never learns a
  // rate: past the fixed allowance, repeats are news however often they came before.
  TailRate repeat_tail_;
  LossPeriodicity periodicity_;
  int64_t last_repeat_warn_step_ = -1;
  int64_t last_low_warn_step_ = -1;
  int64_t last_period_warn_step_ = -1;
  std::optional<Incident> open_;
  std::vector<Incident> closed_;
  std::deque<int64_t> incident_starts_;  // iterations at which incidents opened (rate budget)
  // Counts a fault of `ranks` at `iteration` and stops the run in `d` when the device rule says so.
  void count_device_fault(int64_t iteration, const std::vector<int64_t>& ranks, bool persistent,
                          const nlohmann::json& detail, const std::string& who, Decision& d);
  // (iteration, rank) of the recent faults found on a device (replicas that disagree, replays)
  std::deque<std::pair<int64_t, int64_t>> device_faults_;
  StepSignals pending_;  // the step a decision awaiting diagnosis is about
  ScheduleWatch schedule_;
};

// The loss alarm also fires at a jump of kLossJumpRatio x the loss's recent level (the median of
// its last kLossRecentSteps applied steps) that lies kLossJumpZ times its step-to-step noise
// (RunningWindow::difference_sigma) above it.
inline constexpr double kLossJumpRatio = 1.5;
inline constexpr double kLossJumpZ = 10.0;
inline constexpr int64_t kLossRecentSteps = 5;
// Minimum samples in the window before an alarm can fire: a baseline of two values is no baseline.
inline constexpr int64_t kMinBaselineSteps = 10;
// A grad-norm alarm that repeats on different batches in a row, with the loss at its median and
// the model no worse on clean data, is the model's gradient scale moving, not the data, once it
// has lasted a quarter of stuck_steps (at least kGradScaleShiftSkips): long enough that a bad
// region of ordinary length is still dropped whole, short enough that the run never stops as stuck.
inline constexpr int64_t kGradScaleShiftSkips = 3;
// "The loss at its median": at most this factor above it.
inline constexpr double kNormalLossRatio = 1.2;
// Attention-output std this many times above or below its trend warns, after kDriftPersistence
// log steps in a row (a lasting change, not one noisy reading); more where the layer's own
// deviations from its trend (kDriftSamples log steps at least) put median + kDriftZ x 1.4826 x MAD
// of |log(std) - trend| higher.
inline constexpr double kAttentionDriftFactor = 3.0;
inline constexpr int64_t kDriftSamples = 10;
inline constexpr int64_t kDriftWindow = 50;
inline constexpr double kDriftZ = 4.0;
inline constexpr int64_t kDriftPersistence = 2;
// Weight of the newest reading in the attention trend (per log step): slow enough that a jump
// stands out, fast enough to follow the growth of healthy training.
inline constexpr double kAttentionTrendWeight = 0.3;
// A device that computes a wrong result once is a transient fault: the step is redone (or skipped,
// when replicas disagree) and the run goes on. A second fault of the same rank within
// kDeviceFaultWindow attempts is a device that keeps doing it: the run stops, naming its host,
// rather than skip steps until it is stuck. Silent data corruption at scale is rare per device
// (Meta's Llama 3 report: 419 interruptions in 54 days over 16k GPUs, all kinds together), so two
// on one device within 1,000 steps is no coincidence, while a real bad region of data reproduces
// on any device and never counts here.
inline constexpr int64_t kDeviceFaultsToStop = 2;
inline constexpr int64_t kDeviceFaultWindow = 1000;
// The model is at fault when its loss on the reference batch exceeds the newest stable snapshot's
// by more than this factor (a fixed batch: only the model changes it).
inline constexpr double kModelWorse = 1.1;
// The screen's per-sample baseline holds at most this many samples (the most recent).
inline constexpr int64_t kMaxScreenWindow = 4096;
// Natural text has a thin tail of samples far above the median (ASCII art, hex dumps, keyboard
// mash): the screen masks them one at a time, and that is information, not a warning. It warns
// when it masks more within median_window steps than such a tail explains: more than
// kScreenTailSamples, and more than kScreenTailShare of the samples seen in that window.
inline constexpr int64_t kScreenTailSamples = 4;
inline constexpr double kScreenTailShare = 0.005;
// An incident closes after this many updates in a row with no alarm and no sample screened out:
// training has made progress on clean data again.
inline constexpr int64_t kIncidentQuietSteps = 20;
// fp16: a loss scale at or below this, or more overflows in a row than this, is no longer the
// scaler's business: the step counts as non-finite.
inline constexpr double kMinLossScale = 1.0;
inline constexpr int64_t kMaxConsecutiveOverflows = 24;
// fp16: this many overflows (scale drops) within median_window steps after start-up warns.
inline constexpr int64_t kScaleDropsWarn = 3;
// fp16: a slow decline warns too. The least-squares slope of log2(scale) over the last
// kScaleTrendWindows x median_window steps, times that span, at or below -kScaleTrendHalvings:
// the scale fell 8x across the window without three drops ever coming close together.
inline constexpr int64_t kScaleTrendWindows = 4;
inline constexpr double kScaleTrendHalvings = 3.0;
// The screen's tail and the low side learn their own rate over up to kTailRateWindows windows
// (TailRate): a window warns past the fixed allowance and past what that rate explains. The low
// side is silent until it has learned its rate: a low tail is the corpus's own (near-duplicate
// text), and a repeated set of documents is caught by its fingerprints from the first return.
inline constexpr int64_t kTailRateWindows = 10;
// The clip rate warns above stability.clip_rate_warn by more than the binomial noise of a window
// of median_window steps (kRateZ standard deviations, one-sided: about 1e-4 when the true rate is
// the threshold), and above what the run's own clip rate since warmup explains (TailRate). It is
// silent until it has learned that rate: how often a run clips is its setup's (lr, batch,
// grad_clip, corpus); a rise from there is news.
inline constexpr double kRateZ = 3.72;

}  // namespace keel::guard
