#include "guard/guard.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"

namespace keel::guard {
namespace {

// A layer whose norm rose by more than this share of warn_factor counts as "risen" for the verdict.
constexpr double kRisenShare = 0.5;
// A stable snapshot needs its latest loss within this factor of the running loss median.
constexpr double kStableLossBand = 1.25;
// 1.4826 x MAD estimates the standard deviation of normal data.
constexpr double kMadToSigma = 1.4826;

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

nlohmann::json GuardEvent::record() const {
  nlohmann::json out = detail;
  if (!message.empty()) out["message"] = message;
  return out;
}

Guard::Guard(const config::StabilityConfig& cfg, std::vector<std::string> layer_names,
             int64_t warmup_steps, int64_t samples_per_step, double peak_lr)
    : cfg_(cfg),
      layer_names_(std::move(layer_names)),
      grad_norms_(cfg.median_window),
      losses_(cfg.median_window),
      clip_tail_(cfg.median_window, kTailRateWindows),
      layer_norms_(layer_names_.size(), RunningWindow(cfg.median_window)),
      sample_losses_(std::clamp<int64_t>(cfg.median_window * std::max<int64_t>(samples_per_step, 1),
                                         std::min(cfg.screen.min_samples, kMaxScreenWindow),
                                         kMaxScreenWindow)),
      warmup_steps_(std::max<int64_t>(warmup_steps, 0)),
      screen_tail_(cfg.median_window, kTailRateWindows),
      scale_drops_(cfg.median_window),
      scale_log2_(kScaleTrendWindows * cfg.median_window),
      low_tail_(cfg.median_window, kTailRateWindows),
      repeat_tail_(cfg.median_window, 1),
      schedule_(warmup_steps, peak_lr) {
  if (cfg_.recovery.steps == config::kAuto || cfg_.rollback.stuck_steps == config::kAuto)
    throw std::invalid_argument(
        "guard::Guard: the stability config has auto keys left (config::resolve_auto first)");
}

nlohmann::json Guard::layer_report(const StepSignals& s) const {
  // Each layer against its own baseline: which modules moved, and did they move together?
  std::vector<std::pair<double, size_t>> ratios;
  for (size_t i = 0; i < s.layer_grad_norms.size() && i < layer_norms_.size(); ++i) {
    double median = layer_norms_[i].median();
    if (std::isfinite(median) && median > 0) ratios.emplace_back(s.layer_grad_norms[i] / median, i);
  }
  std::sort(ratios.rbegin(), ratios.rend());
  nlohmann::json top = nlohmann::json::array();
  for (size_t k = 0; k < std::min<size_t>(3, ratios.size()); ++k)
    top.push_back({{"layer", layer_names_[ratios[k].second]}, {"ratio", ratios[k].first}});
  size_t risen = std::count_if(ratios.begin(), ratios.end(),
                               [&](auto& r) { return r.first > cfg_.warn_factor * kRisenShare; });
  // All layers rising together points at the data or the learning rate; a few at one module.
  std::string verdict =
      ratios.empty() ? "unknown" : (2 * risen >= ratios.size() ? "global" : "local");
  return {{"top_layers", top},
          {"verdict", verdict},
          {"layers_risen", risen},
          {"layers", ratios.size()}};
}

std::optional<double> Guard::screen_threshold(int64_t step) const {
  if (!cfg_.screen.enabled || sample_losses_.size() < cfg_.screen.min_samples ||
      step < kMinBaselineSteps)
    return std::nullopt;
  const double median = sample_losses_.median();
  if (!(median > 0)) return std::nullopt;
  const double sigma = kMadToSigma * sample_losses_.mad();
  return std::max(cfg_.screen.factor * median, median + cfg_.screen.z * sigma);
}

std::optional<double> Guard::low_threshold(int64_t step) const {
  if (!screen_threshold(step)) return std::nullopt;
  const double median = sample_losses_.median();
  const double sigma = kMadToSigma * sample_losses_.mad();
  // factor squared: a natural text holds predictable windows at half the median (measured on
  // fortunes: 0.6 % of samples); a memorised one falls far lower (0.1 against a median of 2.2).
  const double low =
      std::min(median / (cfg_.screen.factor * cfg_.screen.factor), median - cfg_.screen.z * sigma);
  return low > 0 ? std::optional<double>(low) : std::nullopt;
}

void Guard::abort(const std::string& reason, const std::string& message, nlohmann::json detail,
                  Decision& d) const {
  detail["reason"] = reason;
  detail["incidents"] = incidents();
  std::string summary;
  for (const auto& i : detail["incidents"]) summary += "\n  " + i.dump();
  d.action = Action::kAbort;
  d.events.push_back({EventKind::kAbort, std::move(detail)});
  d.stop_message = message + (summary.empty() ? "" : "; incidents:" + summary);
}

void Guard::count_unapplied(const StepSignals& s, Decision& d) {
  if (++unapplied_in_a_row_ < cfg_.rollback.stuck_steps || d.action == Action::kAbort) return;
  abort("stuck",
        fmt::format("{} step attempts in a row without an applied update (iteration {}, step {}): "
                    "the run is stuck (stability.rollback.stuck_steps={}); look at the incidents "
                    "and the data they set aside in quarantine.jsonl",
                    unapplied_in_a_row_, s.iteration, s.step, cfg_.rollback.stuck_steps),
        {{"attempts_without_update", unapplied_in_a_row_},
         {"stuck_steps", cfg_.rollback.stuck_steps}},
        d);
}

void Guard::escalate(const StepSignals& s, const std::string& reason, nlohmann::json detail,
                     Decision& d) {
  note_alarm(s.step);
  if (!open_) {
    // A new incident: within the rate budget?
    while (!incident_starts_.empty() &&
           incident_starts_.front() <= s.iteration - cfg_.rollback.incident_window_steps)
      incident_starts_.pop_front();
    incident_starts_.push_back(s.iteration);
    Incident fresh;
    fresh.id = static_cast<int64_t>(closed_.size()) + 1;
    fresh.first_step = fresh.furthest_step = s.step;
    fresh.first_iteration = s.iteration;
    fresh.reason = reason;
    open_ = fresh;
    if (static_cast<int64_t>(incident_starts_.size()) > cfg_.rollback.max_incidents) {
      ++open_->alarms;
      abort("max_incidents",
            fmt::format("{} incidents within {} step attempts (stability.rollback.max_incidents="
                        "{}, incident_window_steps={}): the run keeps meeting trouble",
                        incident_starts_.size(), cfg_.rollback.incident_window_steps,
                        cfg_.rollback.max_incidents, cfg_.rollback.incident_window_steps),
            {{"incidents_in_window", incident_starts_.size()},
             {"max_incidents", cfg_.rollback.max_incidents},
             {"window_steps", cfg_.rollback.incident_window_steps}},
            d);
      return;
    }
  }
  Incident& incident = *open_;
  ++incident.alarms;
  incident.quiet = 0;
  incident.furthest_step = std::max(incident.furthest_step, s.step);
  d.incident = incident.id;
  detail["reason"] = reason;
  detail["incident"] = incident.id;
  detail["alarm_in_incident"] = incident.alarms;
  d.alarm_in_incident = incident.alarms;
  d.events.push_back({EventKind::kPause, std::move(detail)});
  d.action = Action::kPause;
  d.needs_diagnosis = true;
  pending_ = s;
}

Decision Guard::resolve(Decision d, double model_ratio) {
  if (!d.needs_diagnosis) return d;
  d.needs_diagnosis = false;
  const StepSignals& s = pending_;
  const bool model_worse = !(model_ratio <= kModelWorse);
  if (d.skip_reason == SkipReason::kScreenedOut) {
    if (!model_worse) {  // the data: the screen was right to mask it all
      count_unapplied(s, d);
      return d;
    }
    // Every sample far above the baseline, and the model worse on clean data too: the model.
    escalate(s, "model",
             {{"loss", s.loss}, {"masked", s.masked_losses.size()}, {"samples", s.samples}}, d);
    if (d.action == Action::kAbort) return d;
    d.skip_reason = SkipReason::kNone;
  }
  GuardEvent* pause = nullptr;
  for (auto& e : d.events)
    if (e.kind == EventKind::kPause) pause = &e;
  if (!pause || !open_) return d;
  nlohmann::json& detail = pause->detail;
  detail["model_vs_snapshot"] =
      std::isfinite(model_ratio) ? nlohmann::json(model_ratio) : nlohmann::json(nullptr);
  detail["diagnosis"] = model_worse ? "model" : "data";
  const double loss_median = losses_.median();
  const bool norm_only = detail.value("reason", "") == "grad_norm" && loss_median > 0 &&
                         s.loss <= kNormalLossRatio * loss_median;
  norm_only_skips_ = !model_worse && norm_only ? norm_only_skips_ + 1 : 0;
  if (norm_only_skips_ >= std::max(kGradScaleShiftSkips, cfg_.rollback.stuck_steps / 4)) {
    accept_gradient_scale(s, d);
    return d;
  }
  remedy(s, model_worse, detail, d);
  count_unapplied(s, d);
  return d;
}

// The remedy of an incident's alarm once diagnosed: a rollback while the model is at fault and
// the incident has rollbacks left, the offending step dropped otherwise.
void Guard::remedy(const StepSignals& s, bool model_worse, nlohmann::json& detail, Decision& d) {
  Incident& incident = *open_;
  if (!model_worse) {
    // The model is no worse than the snapshot a rollback would restore: drop the step instead.
    ++incident.skipped;
    detail["skipped"] = true;
    d.action = Action::kSkip;
    d.skip_reason = SkipReason::kData;
  } else if (cfg_.rollback.enabled && incident.rollbacks < cfg_.rollback.max_rollbacks) {
    // Each further rollback skips further ahead: at least as far as the incident has lasted,
    // doubled per rollback already spent on it.
    int64_t ahead = cfg_.rollback.skip_ahead_steps;
    if (incident.rollbacks > 0) {
      const int64_t lasted = std::max<int64_t>(s.iteration - incident.first_iteration, 1);
      ahead = std::max(ahead, lasted) << std::min<int64_t>(incident.rollbacks - 1, 20);
    }
    d.skip_ahead_steps = ahead;
    detail["rollback"] = incident.rollbacks + 1;
    d.rollback = incident.rollbacks + 1;
    detail["skip_ahead_steps"] = ahead;
    d.action = Action::kPause;
  } else {
    // The incident's rollbacks are spent (or rollbacks are off): the offending step is dropped.
    ++incident.skipped;
    detail["skipped"] = true;
    d.action = Action::kSkip;
    d.skip_reason = SkipReason::kIncident;
  }
}

// Dropping the batch did not help: the next ones, different data, raised the same alarm on the
// same weights while the loss stayed at its median. Skipping more data would stall the run
// (and end it as stuck); the step is applied, clipping bounding it, and the grad-norm medians
// restart from it, since the level they held is no longer the model's.
void Guard::accept_gradient_scale(const StepSignals& s, Decision& d) {
  const double norm_median = grad_norms_.median();
  std::erase_if(d.events, [](const GuardEvent& e) { return e.kind == EventKind::kPause; });
  d.events.push_back(
      {EventKind::kWarn,
       {{"signal", "grad_scale"},
        {"grad_norm", s.grad_norm},
        {"grad_norm_median", norm_median},
        {"batches", norm_only_skips_},
        {"loss", s.loss},
        {"loss_median", losses_.median()},
        {"incident", open_ ? nlohmann::json(open_->id) : nlohmann::json(nullptr)}},
       fmt::format("the gradient norm stayed above {:.0f}x its median {:.3g} on {} different "
                   "batches in a row while the loss stayed at its median and the model was no "
                   "worse on clean data: the model's gradient scale moved, not the data. This "
                   "step is applied (clipped) and the grad-norm median restarts from {:.3g}; "
                   "if this recurs, look at the lr schedule (warmup length, peak lr)",
                   cfg_.pause_factor, norm_median, norm_only_skips_, s.grad_norm)});
  d.action = Action::kApply;
  d.skip_reason = SkipReason::kNone;
  d.skip_ahead_steps = 0;
  norm_only_skips_ = 0;
  grad_norms_.clear();
  for (auto& w : layer_norms_) w.clear();
  absorb(s);
}

void Guard::absorb(const StepSignals& s) {
  unapplied_in_a_row_ = 0;
  applied_any_ = true;
  grad_norms_.push(s.grad_norm);
  losses_.push(s.loss);
  const bool clip_quiet =
      last_clip_warn_step_ < 0 || s.step - last_clip_warn_step_ > cfg_.median_window;
  clip_tail_.push(s.clipped ? 1.0 : 0.0, 1.0,
                  /*learn=*/s.step >= warmup_steps_ && !open_ && clip_quiet);
  for (size_t i = 0; i < s.layer_grad_norms.size() && i < layer_norms_.size(); ++i)
    layer_norms_[i].push(s.layer_grad_norms[i]);
  for (double v : s.kept_losses)  // low ones (repeated, memorised) would drag the baseline down
    if (std::isfinite(v) && !(s.low_threshold && v < *s.low_threshold)) sample_losses_.push(v);
  periodicity_.push(s.loss);
  if (open_) open_->quiet = s.masked_losses.empty() ? open_->quiet + 1 : 0;
  if (s.loss_scale) scale_drops_.push(0.0);
}

// fp16: an overflow of the scaled gradients is the scaler's business while it can still help.
// True when the step is decided (skipped as an overflow).
bool Guard::absorb_overflow(const StepSignals& s, Decision& d) {
  if (!s.overflow || !std::isfinite(s.loss)) return false;
  ++consecutive_overflow_;
  if (applied_any_) scale_drops_.push(1.0);
  const bool collapsed = s.loss_scale && *s.loss_scale <= kMinLossScale;
  if (collapsed || consecutive_overflow_ > kMaxConsecutiveOverflows) return false;
  d.events.push_back({EventKind::kOverflow,
                      {{"loss_scale", s.loss_scale ? nlohmann::json(*s.loss_scale) : nullptr},
                       {"consecutive", consecutive_overflow_}}});
  d.action = Action::kSkip;
  d.skip_reason = SkipReason::kOverflow;
  watch_rates(s, d);
  count_unapplied(s, d);
  return true;
}

// A non-finite loss or gradient: skipped, escalated to a pause after max_consecutive_nan in a row
// (at once under nan_policy pause), or the end of the run under nan_policy abort. True when the
// step is decided.
bool Guard::refuse_non_finite(const StepSignals& s, Decision& d) {
  if (std::isfinite(s.loss) && std::isfinite(s.grad_norm)) return false;
  ++consecutive_nan_;
  note_alarm(s.step);
  nlohmann::json detail = {{"loss", finite_or_null(s.loss)},
                           {"grad_norm", finite_or_null(s.grad_norm)},
                           {"consecutive", consecutive_nan_}};
  if (s.overflow) detail["overflow"] = true;
  if (s.loss_scale) detail["loss_scale"] = *s.loss_scale;
  if (cfg_.nan_policy == config::NanPolicy::kAbort) {
    abort("non_finite",
          "non-finite loss or gradient at step " + std::to_string(s.step) +
              " and stability.nan_policy is abort",
          detail, d);
    return true;
  }
  d.events.push_back({EventKind::kSkipNan, detail});
  if (cfg_.nan_policy == config::NanPolicy::kPause ||
      consecutive_nan_ >= cfg_.max_consecutive_nan) {
    consecutive_nan_ = 0;
    escalate(s, "non_finite", detail, d);
    return true;
  }
  d.action = Action::kSkip;
  d.skip_reason = SkipReason::kNonFinite;
  count_unapplied(s, d);
  return true;
}

// The warn that precedes every pause and carries its diagnosis (top layers, global or local), in
// words a person reads in the log.
GuardEvent Guard::alarm_warn(const StepSignals& s, const AlarmLevels& a) const {
  auto detail = layer_report(s);
  const bool norm_alarm = a.norm_ratio > cfg_.warn_factor;
  detail["alarm"] = norm_alarm ? "grad_norm" : "loss";
  detail["grad_norm"] = s.grad_norm;
  detail["grad_norm_median"] = a.norm_median;
  detail["ratio"] = a.norm_ratio;
  detail["loss"] = s.loss;
  detail["loss_median"] = a.loss_median;
  detail["loss_ratio"] = a.loss_ratio;
  if (open_) detail["incident"] = open_->id;
  std::string layers;
  for (const auto& l : detail["top_layers"])
    layers += fmt::format("{}{} {:.1f}x", layers.empty() ? "" : ", ", l["layer"].get<std::string>(),
                          l["ratio"].get<double>());
  const std::string where =
      detail["verdict"] == "global"
          ? "most layers rose together: look at this step's data (forensics, quarantine.jsonl) "
            "or the lr"
          : "a few layers rose: look at those modules";
  std::string message =
      norm_alarm ? fmt::format(
                       "gradient norm {:.3g} is {:.1f}x its running median {:.3g} (warns above "
                       "{:.0f}x, pauses above {:.0f}x{}; loss {:.3f} against its median "
                       "{:.3f}); top layers: {}; {}",
                       s.grad_norm, a.norm_ratio, a.norm_median, cfg_.warn_factor,
                       cfg_.pause_factor, s.step < warmup_steps_ ? " after the warmup" : "", s.loss,
                       a.loss_median, layers.empty() ? "n/a" : layers, where)
                 : fmt::format(
                       "loss {:.3f} is {:.2f}x its running median {:.3f} (recent level "
                       "{:.3f}); gradient norm {:.3g} against its median {:.3g}; top layers: "
                       "{}; {}",
                       s.loss, a.loss_ratio, a.loss_median, a.loss_recent, s.grad_norm,
                       a.norm_median, layers.empty() ? "n/a" : layers, where);
  return {EventKind::kWarn, std::move(detail), std::move(message)};
}

Decision Guard::observe(const StepSignals& s) {
  Decision d;
  const PauseLevels levels = pause_levels(s.step);
  // A step without samples (the guard's own tests) has nothing the screen could have masked.
  const double kept = s.samples > 0 ? static_cast<double>(s.kept_losses.size()) : 1.0;
  const bool refused = refuses_update(levels, s.loss, s.grad_norm, s.overflow ? 1.0 : 0.0, kept);
  if (absorb_overflow(s, d) || refuse_non_finite(s, d)) return d;
  consecutive_nan_ = 0;
  consecutive_overflow_ = 0;

  watch_screen(s, d);
  watch_repeats(s, d);
  if (s.kept_losses.empty() && s.samples > 0) {  // the screen masked the whole step
    d.action = Action::kSkip;
    d.skip_reason = SkipReason::kScreenedOut;
    d.needs_diagnosis = true;  // bad data, or a broken model that makes every sample look bad?
    pending_ = s;
    return d;
  }

  const bool baseline = loss_baseline_ready();
  AlarmLevels a;
  a.norm_median = grad_norms_.median();
  a.loss_median = losses_.median();
  a.norm_ratio = baseline_ready() && a.norm_median > 0 ? s.grad_norm / a.norm_median : 0.0;
  a.loss_ratio = baseline && a.loss_median > 0 ? s.loss / a.loss_median : 0.0;
  a.loss_recent = losses_.median_of_last(kLossRecentSteps);
  const bool loss_jump = s.loss > levels.loss_jump;  // warns in warmup too
  const bool norm_pause = levels.norm_pause(s.grad_norm);
  const bool loss_pause = levels.loss_pause(s.loss);
  // Every pause is preceded by a warn that carries the diagnosis, also when only the loss
  // alarmed: garbage data can raise the loss far more than the clipped-scale gradient norm.
  if (a.norm_ratio > cfg_.warn_factor || loss_pause || loss_jump) {
    note_alarm(s.step);
    d.events.push_back(alarm_warn(s, a));
  }
  if (refused) {  // past a level (or an fp16 overflow the scaler no longer absorbs)
    escalate(s,
             norm_pause   ? "grad_norm"
             : loss_pause ? "loss"
                          : "overflow",
             {{"grad_norm", s.grad_norm},
              {"grad_norm_median", a.norm_median},
              {"loss", s.loss},
              {"loss_median", a.loss_median}},
             d);
    return d;
  }

  norm_only_skips_ = 0;
  absorb(s);
  watch_rates(s, d);
  watch_periodicity(s, d);
  return d;
}

namespace {

// Healthy replicas' reduced gradients are the same to the bit, so their norms are compared bit for
// bit (a NaN equals the same NaN).
bool same(double a, double b) { return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b); }

// The ranks whose value differs from the one more than half of them hold; empty when no value has
// a majority.
std::vector<int64_t> minority_ranks(const std::vector<double>& values) {
  for (double candidate : values) {
    const auto holders =
        std::count_if(values.begin(), values.end(), [&](double v) { return same(v, candidate); });
    if (2 * static_cast<size_t>(holders) <= values.size()) continue;
    std::vector<int64_t> out;
    for (size_t r = 0; r < values.size(); ++r)
      if (!same(values[r], candidate)) out.push_back(static_cast<int64_t>(r));
    return out;
  }
  return {};
}

}  // namespace

bool replicas_agree(const std::vector<double>& rank_grad_norms) {
  return std::all_of(rank_grad_norms.begin(), rank_grad_norms.end(),
                     [&](double v) { return same(v, rank_grad_norms.front()); });
}

Decision Guard::replicas_disagree(const StepSignals& s, const std::vector<double>& rank_grad_norms,
                                  std::optional<int64_t> stood_out) {
  Decision d;
  std::vector<int64_t> odd = minority_ranks(rank_grad_norms);
  const bool by_part = odd.empty() && stood_out;  // no majority: the part that stood out
  if (by_part) odd = {*stood_out};
  nlohmann::json norms = nlohmann::json::array();
  for (double v : rank_grad_norms) norms.push_back(finite_or_null(v));
  nlohmann::json detail = {{"rank_grad_norms", norms}, {"ranks", odd}};
  const std::string who =
      odd.empty() ? fmt::format("the {} ranks disagree with no majority, so none can be named",
                                rank_grad_norms.size())
      : by_part   ? fmt::format("no majority; rank {}'s own part of the step stood out", odd[0])
                  : fmt::format("rank(s) {} differ from the others", nlohmann::json(odd).dump());
  d.events.push_back(
      {EventKind::kHardwareFault, detail,
       fmt::format("the ranks' reduced gradients should be equal and are not (global norms {}); "
                   "{}: a device computed a wrong result. The step is skipped on every rank; its "
                   "data is not blamed",
                   norms.dump(), who)});
  d.action = Action::kSkip;
  d.skip_reason = SkipReason::kHardware;
  std::vector<int64_t> all(rank_grad_norms.size());  // none named: every rank a suspect
  std::iota(all.begin(), all.end(), 0);
  count_device_fault(s.iteration, odd.empty() ? all : odd, false, detail, who, d);
  return d;
}

PauseLevels Guard::pause_levels(int64_t step) const {
  PauseLevels levels;
  const bool settled = step >= warmup_steps_;
  // While the lr ramps up the gradient norm moves by design, by an order of magnitude when the
  // model leaves its first plateau: against a median of a few warmup steps that is a warning, not
  // grounds to stop (clipping bounds the update). The loss alarm, the screen and non-finite
  // values act in warmup as after it.
  const double norm_median = grad_norms_.median();
  if (settled && baseline_ready() && norm_median > 0)
    levels.grad_norm = cfg_.pause_factor * norm_median;
  if (!loss_baseline_ready()) return levels;
  const double loss_median = losses_.median();
  if (cfg_.loss_alarm_factor > 0 && loss_median > 0)
    levels.loss = cfg_.loss_alarm_factor * loss_median;
  // A jump that the steadiness of the loss makes unmistakable: kLossJumpRatio x its recent level
  // and kLossJumpZ times its step-to-step noise above it (a broken update can double the loss
  // while the clipped gradient norm barely moves). In warmup it only warns. Measured on clean
  // text: Adam's young second moments let one update raise the loss 1.7x, and the next (clipped)
  // update takes it back; an unprotected run recovers in one step and ends better than one
  // rolled back.
  const double recent = losses_.median_of_last(kLossRecentSteps);
  if (recent > 0)
    levels.loss_jump =
        std::max(kLossJumpRatio * recent, recent + kLossJumpZ * losses_.difference_sigma());
  if (settled) levels.loss = std::min(levels.loss, levels.loss_jump);
  return levels;
}

bool Guard::loss_baseline_ready() const {
  return static_cast<int64_t>(losses_.size()) >= std::min(kMinBaselineSteps, cfg_.median_window);
}

bool Guard::baseline_ready() const {
  return grad_norms_.size() >= std::min(kMinBaselineSteps, cfg_.median_window);
}

std::vector<GuardEvent> Guard::after_update(int64_t completed_steps) {
  std::vector<GuardEvent> events;
  if (!recovery_announced_ && completed_steps >= recovery_until_) {
    recovery_announced_ = true;
    events.push_back({EventKind::kRecoveryEnd, {{"lr_factor", 1.0}}});
  }
  if (open_ && open_->quiet >= kIncidentQuietSteps) {
    events.push_back({EventKind::kIncidentEnd, open_->to_json()});
    closed_.push_back(*open_);
    open_.reset();
  }
  return events;
}

void Guard::rolled_back(int64_t step, const nlohmann::json& snapshot_state) {
  if (snapshot_state.is_object()) load_baselines(snapshot_state);
  ++rollbacks_;
  if (open_) ++open_->rollbacks;
  start_recovery(step);
}

void Guard::start_recovery(int64_t step) {
  recovery_until_ = step + cfg_.recovery.steps;
  recovery_announced_ = cfg_.recovery.steps == 0;
  consecutive_nan_ = 0;
}

double Guard::lr_factor(int64_t step) const {
  return (step < recovery_until_ ? cfg_.recovery.lr_factor : 1.0) * schedule_.lr_factor(step);
}

bool Guard::promotable(int64_t step, int64_t window, bool require_no_alarms) const {
  if (require_no_alarms && last_alarm_step_ >= 0 && step - last_alarm_step_ <= window) return false;
  if (in_recovery(step) || open_) return false;
  if (losses_.empty()) return true;
  double median = losses_.median();
  return !(median > 0) || losses_.last() <= kStableLossBand * median;
}

}  // namespace keel::guard
