#include "train/recovery.h"

#include <fmt/format.h>

#include <map>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/quarantine_reason.h"

namespace keel::train {
namespace fs = std::filesystem;

void Recovery::write_forensics(const StepEvidence& step) const {
  p_.forensics->write(*p_.counters, step.samples, step.verdict.layer_grad_norms,
                      step.verdict.signals, p_.weights(), p_.weights_in_parts);
}

void Recovery::set_aside(int64_t micro_batches, const std::string& reason,
                         const HostSamples& measured_now) {
  // The losses this step measured, by sample id, for the records of the samples it held.
  std::map<int64_t, double> measured;
  for (size_t i = 0; i < measured_now.ids.size(); ++i)
    measured[measured_now.ids[i]] = measured_now.losses[i];
  // Every rank skips its own part of the window; the record names every rank's samples.
  std::vector<torch::Tensor> local;
  for (int64_t n = 0; n < micro_batches; ++n)
    local.push_back(p_.train_data->next().sample_ids.to(torch::kInt64).reshape({-1}));
  if (local.empty()) return;
  const auto ids =
      p_.comm->all_gather(torch::cat(local).to(p_.device)).to(torch::kCPU).contiguous();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = ids.data_ptr<int64_t>()[i];
    const auto it = measured.find(id);
    p_.quarantine->record(id, *p_.counters, reason,
                          it != measured.end() ? std::optional<double>(it->second) : std::nullopt);
  }
}

void Recovery::drop_step(const StepEvidence& step) {
  const guard::Decision& d = step.verdict.decision;
  for (const auto& e : d.events) {
    if (e.kind != EventKind::kPause) continue;
    p_.guard_event(e);
    // Forensics of an incident's first alarm only: a long region must not fill the disk.
    if (d.alarm_in_incident == 1) write_forensics(step);
  }
  // "alarm": the model was fine and the step's data set the alarm off; "incident_skip": the
  // incident's rollbacks were spent.
  const std::string reason =
      name_of(d.skip_reason == guard::SkipReason::kData ? QuarantineReason::kAlarm
                                                        : QuarantineReason::kIncidentSkip);
  for (size_t i = 0; i < step.verdict.samples.ids.size(); ++i)
    if (step.verdict.samples.kept[i])
      p_.quarantine->record(step.verdict.samples.ids[i], *p_.counters, reason,
                            step.verdict.samples.losses[i], {{"incident", d.incident}});
  p_.counters->set_aside(p_.accumulation->steps(), 0);
}

// The window since the stable snapshot (which held the offending samples) set aside, each sample
// on record, plus the incident's skip-ahead; all count as taken, so the consumed-vs-steps
// cross-check still holds and a resumed run skips the same window. `data_at_snapshot`: the data
// position the snapshot saved. Returns the rollback event's account of it.
nlohmann::json Recovery::skip_window(const nlohmann::json& data_at_snapshot, int64_t stable_micro,
                                     int64_t skip_ahead_steps, const HostSamples& measured) {
  const config::Config& cfg = *p_.cfg;
  TrainCounters& counters = *p_.counters;
  const int64_t world = p_.comm->world_size();
  const int64_t ahead = skip_ahead_steps * cfg.data.grad_accum_steps;
  const int64_t window = counters.micro_taken - stable_micro;
  p_.train_data->load_state(data_at_snapshot);
  set_aside(window + ahead, name_of(QuarantineReason::kRollback), measured);
  counters.set_aside(window, ahead);
  const int64_t micro = counters.micro_taken - stable_micro;
  return {{"micro_batches", micro},
          {"samples", micro * cfg.data.micro_batch_size * world},
          {"first_position", stable_micro},
          {"end_position", counters.micro_taken},
          {"skipped_ahead", ahead}};
}

void Recovery::rollback(const StepEvidence& step) {
  const config::Config& cfg = *p_.cfg;
  TrainCounters& counters = *p_.counters;
  const guard::Decision& d = step.verdict.decision;
  for (const auto& e : d.events)
    if (e.kind == EventKind::kPause) p_.guard_event(e);
  write_forensics(step);
  // The newest stable snapshot: the copy held in memory, or read (and so verified) once.
  const auto restore_start = Clock::now();
  auto target = p_.checkpointer->load_newest(checkpoint::Pointer::kStable);
  if (!target)
    throw RunStopped("pause at step " + std::to_string(counters.step) +
                     " but no stable snapshot exists to roll back to");

  const int64_t from_step = counters.step;
  const int64_t world = p_.comm->world_size();
  const int64_t stable_micro =
      TrainCounters::from_json(target->data.trainer_state, cfg.data.micro_batch_size, world)
          .micro_taken;
  // Data moves forward, the model goes back: with skip_data the window consumed since the stable
  // snapshot (which held the offending samples) is never trained on again.
  const bool replay = !cfg.stability.rollback.skip_data;
  p_.restore(target->data, /*restore_data=*/replay);
  const double restore_s = seconds_since(restore_start);
  const nlohmann::json set_aside_detail =
      replay ? nlohmann::json(nullptr)
             : skip_window(target->data.trainer_state.at("data"), stable_micro, d.skip_ahead_steps,
                           step.verdict.samples);
  // The new timeline must not overwrite the abandoned one's checkpoints of the same steps.
  p_.checkpointer->abandon_after(counters.step);
  p_.files->replay_from(counters.step + 1);
  const auto& saved = target->data.trainer_state;
  p_.guard->rolled_back(counters.step,
                        saved.contains("guard") ? saved.at("guard") : nlohmann::json());
  p_.event(EventKind::kRollback, {{"from_step", from_step},
                                  {"to_step", counters.step},
                                  {"incident", d.incident},
                                  {"checkpoint", target->path.string()},
                                  {"restored_from", target->from_memory ? "memory" : "disk"},
                                  {"restore_s", restore_s},
                                  {"quarantine", set_aside_detail}});
  const int64_t recovery = cfg.stability.recovery.steps;  // resolved in config
  p_.event(EventKind::kRecoveryStart, {{"steps", recovery},
                                       {"lr_factor", cfg.stability.recovery.lr_factor},
                                       {"until_step", counters.step + recovery},
                                       {"incident", d.incident}});
  // An incident's second or third rollback says so: the same line twice reads as a repeated log.
  const int64_t nth = std::max<int64_t>(d.rollback, 1);
  static const char* const kOrdinal[] = {"first", "second", "third"};
  const std::string which = nth <= 3 ? kOrdinal[nth - 1] : std::to_string(nth) + "th";
  log::warn("guard",
            "incident {}: rolled back from step {} to stable step {} ({} rollback of at most "
            "{}{}); recovering at {} x lr for {} steps",
            d.incident, from_step, counters.step, which, cfg.stability.rollback.max_rollbacks,
            d.skip_ahead_steps > 0
                ? fmt::format(", the data {} steps further ahead set aside too", d.skip_ahead_steps)
                : std::string(),
            cfg.stability.recovery.lr_factor, recovery);
}

void Recovery::back_off(const guard::Backoff& b) {
  TrainCounters& counters = *p_.counters;
  const auto restore_start = Clock::now();
  auto target = p_.checkpointer->load_newest(checkpoint::Pointer::kStable, b.restart_step);
  const bool before_trouble = target.has_value();
  if (!target) target = p_.checkpointer->load_newest(checkpoint::Pointer::kStable);
  if (!target)
    throw RunStopped(fmt::format(
        "the attention output grew past {:.0f}x its value at initialisation at step {} (lr "
        "{:.3g}): the schedule must back off, but no stable snapshot exists to restart from{}. "
        "HINT: set optim.lr to {:.3g} or lower",
        guard::kGrowthAlarm, counters.step, p_.cfg->optim.lr * b.from_scale,
        p_.cfg->stability.rollback.enabled ? "" : " (stability.rollback.enabled is false)",
        p_.cfg->optim.lr * b.to_scale));
  const int64_t from_step = counters.step;
  const int64_t iteration = counters.iteration;
  p_.restore(target->data, /*restore_data=*/true);
  const double restore_s = seconds_since(restore_start);
  counters.catch_up_iteration(iteration);  // attempts only move forward
  p_.checkpointer->abandon_after(counters.step);
  p_.files->replay_from(counters.step + 1);
  const auto& saved = target->data.trainer_state;
  p_.guard->backed_off(counters.step, saved.contains("guard") ? saved.at("guard") : nullptr);
  const double peak = p_.cfg->optim.lr;
  p_.event(EventKind::kScheduleBackoff, {{"from_step", from_step},
                                         {"to_step", counters.step},
                                         {"checkpoint", target->path.string()},
                                         {"restored_from", target->from_memory ? "memory" : "disk"},
                                         {"restore_s", restore_s},
                                         {"before_trouble", before_trouble},
                                         {"from_lr", peak * b.from_scale},
                                         {"to_lr", peak * b.to_scale},
                                         {"factor", b.to_scale / b.from_scale},
                                         {"backoff", b.number},
                                         {"max_backoffs", guard::kMaxBackoffs},
                                         {"data", "replay"},
                                         {"signals", b.signals}});
  log::warn("guard",
            "the model cannot take its lr: attention output {:.0f}x its value at initialisation "
            "at step {}; rolled back to stable step {} and lowered the schedule's peak from {:.3g} "
            "to {:.3g} (back-off {} of at most {}), warming up again; the data since is replayed",
            b.signals.value("growth", 0.0), from_step, counters.step, peak * b.from_scale,
            peak * b.to_scale, b.number, guard::kMaxBackoffs);
}

std::string Recovery::restore_replicas() {
  TrainCounters& counters = *p_.counters;
  auto target = p_.checkpointer->load_newest(checkpoint::Pointer::kLatest);
  if (!target)
    throw RunStopped(fmt::format(
        "at step {} the ranks' copies of the weights differ, and no checkpoint exists to restore "
        "them from",
        counters.step));
  const int64_t iteration = counters.iteration;
  p_.restore(target->data, /*restore_data=*/true);
  counters.catch_up_iteration(iteration);  // attempts only move forward
  p_.checkpointer->abandon_after(counters.step);
  p_.files->replay_from(counters.step + 1);
  return target->path.string();
}

void Recovery::begin_resume(const fs::path& snapshot, const std::string& reason,
                            const std::optional<Heartbeat>& crash, ResumeData data) {
  const config::Config& cfg = *p_.cfg;
  TrainCounters& counters = *p_.counters;
  const TrainCounters resumed = counters;
  // Where the abandoned timeline got to: the newest checkpoint, or the crash if it got further.
  TrainCounters reached = resumed;
  std::string newest_name;
  if (auto newest = p_.checkpointer->newest_written(); newest && *newest != snapshot) {
    reached = TrainCounters::from_json(checkpoint::read_trainer_state(*newest),
                                       cfg.data.micro_batch_size, p_.comm->world_size());
    newest_name = newest->string();
  }
  if (crash && crash->micro_taken >= reached.micro_taken) {
    // The step in flight when it died is set aside too: its data may be what kills the process.
    reached.step = crash->step;
    reached.iteration = crash->iteration + 1;
    reached.micro_taken = crash->micro_taken + p_.accumulation->most();
  }
  const int64_t discarded = std::max<int64_t>(reached.step - resumed.step, 0);
  const int64_t window = std::max<int64_t>(reached.micro_taken - resumed.micro_taken, 0);
  const bool skip = data == ResumeData::kSkip;
  if (skip && window > 0) {
    set_aside(window, reason, HostSamples());
    counters.set_aside(0, window);
  }
  // Attempts only move forward: faults keyed to them are not replayed.
  counters.catch_up_iteration(reached.iteration);
  const auto moved = p_.checkpointer->abandon_after(resumed.step);
  const int64_t quarantined = skip ? window * cfg.data.micro_batch_size * p_.comm->world_size() : 0;
  nlohmann::json detail = {{"reason", reason},
                           {"checkpoint", snapshot.string()},
                           {"abandoned_from_step", reached.step},
                           {"discarded_steps", discarded},
                           {"data", skip ? "skip" : "replay"},
                           {"quarantined_samples", quarantined},
                           {"steps", cfg.stability.recovery.steps},
                           {"lr_factor", cfg.stability.recovery.lr_factor},
                           {"until_step", resumed.step + cfg.stability.recovery.steps}};
  if (!newest_name.empty()) detail["newest_checkpoint"] = newest_name;
  if (!moved.empty()) detail["abandoned_timeline"] = moved.string();
  if (!p_.guard) {
    log::warn("ckpt", "{}: stability.enabled is false, so there is no recovery overlay", reason);
    return;
  }
  p_.guard->start_recovery(resumed.step);
  p_.event(EventKind::kRecoveryStart, detail);
  log::warn("ckpt",
            "{}: resumed at step {} (abandoning {} step(s) up to {}), {} the data in between, "
            "recovering at {} x lr for {} steps",
            reason, resumed.step, discarded, reached.step, skip ? "skipping" : "replaying",
            cfg.stability.recovery.lr_factor, cfg.stability.recovery.steps);
}

}  // namespace keel::train
