// Checkpoint capture and restore for the trainer: what a checkpoint holds beyond the tensors
// (counters, data position, guard state, RNG) and the rules for resuming.
#include <filesystem>
#include <map>

#include "checkpoint/weight_parts.h"
#include "common/error.h"
#include "common/log.h"
#include "common/quarantine_reason.h"
#include "config/load.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;
namespace {

torch::Tensor rng_state_cpu() {
  return at::globalContext().defaultGenerator(torch::kCPU).get_state();
}

void set_rng_state(torch::Device device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);  // shares the generator impl
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

checkpoint::CheckpointData Trainer::State::capture(bool redo_step) const {
  checkpoint::CheckpointData data;
  data.model = parallel->weights();
  data.model_in_parts = parallel->weights_in_parts();
  data.optimizer = parallel->optimizer().state_dict();
  data.extra_tensors["rng.cpu"] = rng_state_cpu();
  if (device.is_cuda())
    data.extra_tensors["rng.cuda"] = at::globalContext().defaultGenerator(device).get_state();
  if (scaler)
    for (auto& [k, v] : scaler->state_dict()) data.extra_tensors["scaler." + k] = v;
  data.trainer_state = nlohmann::json::object();
  TrainCounters saved = counters;
  if (redo_step) saved.micro_taken = feed.step_start_micro;
  saved.to_json(data.trainer_state, cfg.data.micro_batch_size, comm.world_size(),
                cfg.model.seq_len);
  data.trainer_state["data"] = redo_step ? feed.step_start_data : feed.train_data->state();
  data.trainer_state["schedule"] = {{"kind", config::name_of(cfg.schedule.kind)},
                                    {"step", counters.step}};
  if (guard) data.trainer_state["guard"] = guard->state();
  if (feed.accumulation.dynamic()) data.trainer_state["grad_accum"] = feed.accumulation.state();
  if (guard && defence.screen.repeat_watch().size() >
                   0)  // (hash, id) pairs: too many for trainer_state.json
    data.extra_tensors["repeat_watch"] =
        torch::tensor(defence.screen.repeat_watch().state(), torch::kInt64);
  if (std::isfinite(defence.probe_reference))
    data.trainer_state["probe_loss"] = defence.probe_reference;
  data.config_yaml = launch.resolved_yaml;
  return data;
}

void Trainer::State::restore(const checkpoint::CheckpointData& data, bool restore_data,
                             bool restore_guard) {
  parallel->load_weights(data.model);
  parallel->load_optimizer_state(data.optimizer);
  if (scaler) {
    std::map<std::string, torch::Tensor> st;
    for (auto& [k, v] : data.extra_tensors)
      if (k.rfind("scaler.", 0) == 0) st[k.substr(7)] = v;
    if (!st.empty()) scaler->load_state_dict(st);
  }
  if (auto it = data.extra_tensors.find("rng.cpu"); it != data.extra_tensors.end())
    set_rng_state(torch::kCPU, it->second);
  if (auto it = data.extra_tensors.find("rng.cuda");
      it != data.extra_tensors.end() && device.is_cuda())
    set_rng_state(device, it->second);

  const auto& ts = data.trainer_state;
  const TrainCounters saved =
      TrainCounters::from_json(ts, cfg.data.micro_batch_size, comm.world_size());
  if (restore_data) {
    counters = saved;
    feed.train_data->load_state(ts.at("data"));
  } else {
    counters.rolled_back_to(saved.step);  // the model goes back; the data position moves on
  }
  if (restore_guard && guard && ts.contains("guard")) guard->load_state(ts.at("guard"));
  // The count goes back with the model: a rollback resumes the snapshot's accumulation.
  if (feed.accumulation.dynamic() && ts.contains("grad_accum"))
    feed.accumulation.load_state(ts.at("grad_accum"));
  // A rollback that skips keeps what it has seen (the data moved on, not back); one that replays
  // goes back with the data, or its replayed samples would read as repeats.
  if (restore_guard || restore_data) {
    const auto it = data.extra_tensors.find("repeat_watch");
    const torch::Tensor flat = it == data.extra_tensors.end()
                                   ? torch::empty({0}, torch::kInt64)
                                   : it->second.to(torch::kCPU, torch::kInt64).contiguous();
    defence.screen.repeat_watch().load_state(
        std::vector<int64_t>(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel()));
  }
  // The model is now the one that checkpoint holds: its reference measure (a checkpoint carries
  // its newest stable snapshot's, which a stable one measured itself).
  if (auto it = ts.find("probe_loss"); it != ts.end() && it->is_number())
    defence.probe_reference = it->get<double>();
  saves.last_checkpoint_step = counters.step;
}

void Trainer::State::save_checkpoint(bool stable, bool redo_step) {
  if (stable && guard) defence.probe_reference = probe_loss();
  if (redo_step) defence.replay.restore_rng(device, 0);  // the step's own, for its redo
  auto path = saves.checkpointer->save(counters.step, capture(redo_step), stable);
  saves.last_checkpoint_step = counters.step;
  saves.cadence.saved(saves.checkpointer->last_stall_seconds());
  if (stable) defence.screen.quarantine().stable_snapshot_taken();  // no rollback goes back past it
  nlohmann::json detail = {{"path", path.string()},
                           {"stall_s", saves.checkpointer->last_stall_seconds()},
                           {"async", cfg.checkpoint.async}};
  event(EventKind::kCheckpoint, detail);
  if (stable) event(EventKind::kStableSnapshot, detail);
}

void Trainer::State::maybe_checkpoint() {
  monitor::StageRange range("keel/checkpoint");
  if (saves.cadence.attempt_finished()) decide_checkpoint_cadence();
  const int64_t step = counters.step;
  if (step == saves.last_checkpoint_step || step == cfg.run.max_steps)
    return;  // the end saves anyway
  const CheckpointCadence::Due due = saves.cadence.due(step);
  const bool stable_due = guard && due.stable_candidate;
  // The replicas compare their copies every replica_check_every steps and before a save: a
  // checkpoint holds what every rank agrees on, so that a divergence can go back to it.
  const int64_t check_every = cfg.stability.enabled ? cfg.stability.replica_check_every : 0;
  if (check_every > 0 && (step % check_every == 0 || due.save || stable_due) &&
      !replicas_hold_the_same())
    return;
  if (!due.save && !stable_due) return;
  save_checkpoint(stable_due && guard->promotable(step, saves.cadence.stable_window(),
                                                  cfg.checkpoint.stable.require_no_alarms));
}

// checkpoint.every_steps: auto. The interval at which a save costs checkpoint.max_overhead of
// training time, from this run's own figures: the stall of its newest save (the step-0 snapshot,
// or a save made here to measure one) and the mean time of this process's step attempts since
// its kCadenceStartStep-th (a resumed run measures its own). Every rank takes the mean of the
// ranks' figures, so all decide the same.
void Trainer::State::decide_checkpoint_cadence() {
  const double step_s = saves.cadence.measured_step_seconds();
  if (!saves.cadence.save_stall_seconds()) save_checkpoint(/*stable=*/false);
  std::vector<torch::Tensor> figures{torch::tensor({step_s, *saves.cadence.save_stall_seconds()},
                                                   torch::TensorOptions().dtype(torch::kFloat64))
                                         .to(device)};
  comm.all_reduce_mean_(figures);
  const auto host = figures[0].to(torch::kCPU);
  const nlohmann::json decision =
      saves.cadence.decide(host[1].item<double>(), host[0].item<double>());
  event(EventKind::kCheckpointCadence, decision);
  log::info("ckpt", "{}", saves.cadence.log_line(decision));
}

// The record of a resume restored in setup: the newer part of the record dropped, the events, and
// the recovery a resume from the stable snapshot (or a crash loop) starts.
void Trainer::State::record_resume() {
  const ResumeSource& source = *launch.resume_source;
  record.files.replay_from(counters.step + 1);
  log::info("ckpt", "resumed from {} at step {}", source.path.string(), counters.step);
  event(EventKind::kResume,
        {{"path", source.path.string()}, {"from_step", counters.step}, {"mode", source.mode}});
  const config::ResumeRecovery on_resume = cfg.stability.recovery.on_resume;
  if (source.crash)
    event(EventKind::kCrashLoop, {{"died_at_step", source.crash->step},
                                  {"died_at_iteration", source.crash->iteration + 1},
                                  {"abnormal_ends", 2}});
  if (source.crash || on_resume == config::ResumeRecovery::kAlways ||
      (on_resume == config::ResumeRecovery::kStable &&
       source.pointer == checkpoint::Pointer::kStable))
    defence.recovery->begin_resume(source.path,
                                   source.crash ? std::string(name_of(QuarantineReason::kCrashLoop))
                                                : resume_reason(source.mode),
                                   source.crash, launch.options.resume_data);
  launch.resume_source.reset();  // its tensors are in the model and optimizer now
  // Retention keeps the snapshot a schedule back-off would restore from the first save on.
  if (guard) saves.checkpointer->keep_also(guard->schedule_watch().restart_snapshot(counters.step));
}

RecoveryParts Trainer::State::recovery_parts() {
  RecoveryParts p;
  p.cfg = &cfg;
  p.comm = &comm;
  p.device = device;
  p.checkpointer = saves.checkpointer.get();
  p.train_data = feed.train_data.get();
  p.quarantine = &defence.screen.quarantine();
  p.files = &record.files;
  p.counters = &counters;
  p.guard = guard.get();
  p.accumulation = &feed.accumulation;
  p.forensics = defence.forensics.get();
  p.event = [this](EventKind kind, const nlohmann::json& detail) { event(kind, detail); };
  p.guard_event = [this](const guard::GuardEvent& e) { event(e); };
  p.restore = [this](const checkpoint::CheckpointData& data, bool restore_data) {
    // The fp16 loss scale stays as the scaler has learned it: going back to an old scale would
    // replay its overflows.
    std::map<std::string, torch::Tensor> scale;
    if (scaler) scale = scaler->state_dict();
    restore(data, restore_data, /*restore_guard=*/false);
    if (scaler) scaler->load_state_dict(scale);
  };
  p.weights = [this] { return parallel->weights(); };
  p.weights_in_parts = parallel->weights_in_parts();
  return p;
}

}  // namespace keel::train
