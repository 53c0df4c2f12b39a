// Checkpoint capture and restore for the trainer: what a checkpoint holds beyond the tensors
// (counters, data position, guard state, RNG) and the rules for resuming.
#include <filesystem>

#include "common/error.h"
#include "common/log.h"
#include "config/load.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;
namespace {

// Flattens a config into key -> printed value, to name exactly which keys differ.
struct Flatten {
  std::map<std::string, std::string> out;
  std::string prefix;
  template <class T>
  void field(const char* key, T& value) {
    std::ostringstream s;
    if constexpr (std::is_same_v<T, std::vector<double>> ||
                  std::is_same_v<T, std::vector<std::string>>) {
      for (auto& v : value) s << v << ",";
    } else if constexpr (config::Choice<T>) {
      s << config::name_of(value);
    } else {
      s << value;
    }
    out[prefix + key] = s.str();
  }
  void field(const char* key, int64_t& value, config::AutoAllowed) { field(key, value); }
  template <class S>
  void section(const char* key, S& sub) {
    std::string saved = prefix;
    prefix += std::string(key) + ".";
    config::visit(*this, sub);
    prefix = saved;
  }
  template <class S>
  void list(const char*, std::vector<S>&) {}
};

std::map<std::string, std::string> flatten(config::Config c) {
  Flatten f;
  config::visit(f, c);
  return f.out;
}

// Keys a resumed run cannot change: the model's shape and the identity of its data stream.
// The micro-batch size may change (with the world size, say): the data position and the counters
// are mapped onto the new layout, and the data source refuses one they do not map onto evenly.
bool must_match(const std::string& key) {
  static const std::vector<std::string> kExact = {
      "data.source", "data.path", "data.synthetic_branching", "data.synthetic_zipf", "run.seed"};
  return key.rfind("model.", 0) == 0 ||
         std::find(kExact.begin(), kExact.end(), key) != kExact.end();
}

torch::Tensor rng_state_cpu() {
  return at::globalContext().defaultGenerator(torch::kCPU).get_state();
}

void set_rng_state(torch::Device device, const torch::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);  // shares the generator impl
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

checkpoint::CheckpointData Trainer::State::capture() const {
  checkpoint::CheckpointData data;
  for (const auto& [name, p] : named_params) data.model[name] = p.detach();
  data.optimizer = optimizer->state_dict();
  data.extra_tensors["rng.cpu"] = rng_state_cpu();
  if (device.is_cuda())
    data.extra_tensors["rng.cuda"] = at::globalContext().defaultGenerator(device).get_state();
  if (scaler)
    for (auto& [k, v] : scaler->state_dict()) data.extra_tensors["scaler." + k] = v;
  data.trainer_state = nlohmann::json::object();
  counters.to_json(data.trainer_state, cfg.data.micro_batch_size, comm.world_size(),
                   cfg.model.seq_len);
  data.trainer_state["data"] = train_data->state();
  data.trainer_state["schedule"] = {{"kind", config::name_of(cfg.schedule.kind)},
                                    {"step", counters.step}};
  if (guard) data.trainer_state["guard"] = guard->state();
  if (std::isfinite(probe_reference)) data.trainer_state["probe_loss"] = probe_reference;
  data.config_yaml = resolved_yaml;
  return data;
}

void Trainer::State::restore(const checkpoint::CheckpointData& data, bool restore_data,
                             bool restore_guard) {
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : named_params) {
      auto it = data.model.find(name);
      if (it == data.model.end()) throw CheckpointError("checkpoint has no weights for " + name);
      if (it->second.sizes() != p.sizes())
        throw CheckpointError("checkpoint weight " + name + " has a different shape");
      p.copy_(it->second);
    }
  }
  if (cfg.distributed.zero == 0 && dist::is_sharded_state(data.optimizer))
    throw CheckpointError(
        "the checkpoint's optimizer state is sharded across ranks (written with distributed.zero: "
        "1)\nHINT: resume with --set distributed.zero=1 (at any world size)");
  optimizer->load_state_dict(data.optimizer);
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
    train_data->load_state(ts.at("data"));
  } else {
    counters.step = saved.step;  // the model goes back; the data position moves on
  }
  if (restore_guard && guard && ts.contains("guard")) guard->load_state(ts.at("guard"));
  // The model is now the one that checkpoint holds: its reference measure (a checkpoint carries
  // its newest stable snapshot's, which a stable one measured itself).
  if (auto it = ts.find("probe_loss"); it != ts.end() && it->is_number())
    probe_reference = it->get<double>();
  last_checkpoint_step = counters.step;
}

void Trainer::State::save_checkpoint(bool stable) {
  if (stable && guard) probe_reference = probe_loss();
  auto path = checkpointer->save(counters.step, capture(), stable);
  last_checkpoint_step = counters.step;
  save_stall_s = checkpointer->last_stall_seconds();
  if (stable) quarantined_since_stable.clear();  // no rollback goes back past it
  nlohmann::json detail = {{"path", path.string()},
                           {"stall_s", checkpointer->last_stall_seconds()},
                           {"async", cfg.checkpoint.async}};
  event("checkpoint", detail);
  if (stable) event("stable_snapshot", detail);
}

void Trainer::State::maybe_checkpoint() {
  decide_checkpoint_cadence();
  const int64_t step = counters.step;
  if (step == last_checkpoint_step || step == cfg.run.max_steps) return;  // the end saves anyway
  const bool due = checkpoint_every > 0 && step % checkpoint_every == 0;
  const bool stable_due = guard && stable_every > 0 && step % stable_every == 0;
  if (!due && !stable_due) return;
  save_checkpoint(stable_due &&
                  guard->promotable(step, stable_window, cfg.checkpoint.stable.require_no_alarms));
}

// checkpoint.every_steps: auto. The interval at which a save costs checkpoint.max_overhead of
// training time, from this run's own figures: the stall of its newest save (the step-0 snapshot,
// or a save made here to measure one) and the mean time of this process's step attempts since
// its kCadenceStartStep-th (a resumed run measures its own). Every rank
// takes the mean of the ranks' figures, so all decide the same.
void Trainer::State::decide_checkpoint_cadence() {
  if (cadence_decided) return;
  ++cadence_attempts;
  if (cadence_attempts == kCadenceStartStep) cadence_start = Clock::now();
  if (cadence_attempts < kCadenceProbeStep) return;
  const double step_s =
      seconds_since(cadence_start) / static_cast<double>(kCadenceProbeStep - kCadenceStartStep);
  if (!save_stall_s) save_checkpoint(/*stable=*/false);
  std::vector<torch::Tensor> figures{
      torch::tensor({step_s, *save_stall_s}, torch::TensorOptions().dtype(torch::kFloat64))
          .to(device)};
  comm.all_reduce_mean_(figures);
  const auto host = figures[0].to(torch::kCPU);
  const double step_mean = host[0].item<double>(), stall = host[1].item<double>();
  checkpoint_every =
      checkpoint::auto_interval(stall, step_mean, cfg.checkpoint.max_overhead, cfg.run.max_steps);
  stable_every = checkpoint::stable_interval(cfg.checkpoint, checkpoint_every);
  stable_window = checkpoint::stable_window(cfg.checkpoint, checkpoint_every);
  cadence_decided = true;
  event("checkpoint_cadence", {{"every_steps", checkpoint_every},
                               {"stable_every_steps", stable_every},
                               {"stable_window", stable_window},
                               {"save_stall_s", stall},
                               {"step_s", step_mean},
                               {"max_overhead", cfg.checkpoint.max_overhead}});
  log::info("ckpt",
            "checkpoint.every_steps auto: every {} steps, stable snapshots every {} (a save stalls "
            "{:.3f} s, a step takes {:.3f} s: at most {:.1f} % of training time)",
            checkpoint_every, stable_every, stall, step_mean, cfg.checkpoint.max_overhead * 100);
}

bool Trainer::State::resume() {
  if (options.resume.empty()) return false;
  std::string which = options.resume;
  // A restart loop that meets the same crash again: twice dead at one step since the newest
  // checkpoint means resuming from it would die a third time.
  std::optional<Heartbeat> crash;
  if (which == "latest") {
    if (auto newest = checkpointer->newest_written()) {
      const int64_t newest_step = checkpoint::read_manifest(*newest).step;
      crash = history.crash_loop_after(newest_step);
      if (crash && !checkpoint::resolve_checkpoint(checkpointer->dir(), "stable")) {
        log::warn("ckpt",
                  "the run ended abnormally twice at step {} since checkpoint step {}, but there "
                  "is no stable snapshot to fall back to: resuming from the newest checkpoint",
                  crash->step, newest_step);
        crash.reset();
      }
      if (crash) {
        log::warn("ckpt",
                  "the run ended abnormally twice at step {} since checkpoint step {}: resuming "
                  "from the newest stable snapshot instead, as a recovery",
                  crash->step, newest_step);
        which = "stable";
      }
    }
  }
  std::optional<fs::path> path;
  checkpoint::CheckpointData data;
  if (which == "latest" || which == "stable") {
    auto loaded = checkpointer->load_newest(which);  // read and verified once
    if (!loaded) {
      log::info("ckpt", "no {} checkpoint in {} yet: starting fresh", which,
                checkpointer->dir().string());
      return false;
    }
    path = loaded->path;
    data = std::move(loaded->data);
  } else {
    path = checkpointer->resolve(which);
    if (!path) throw CheckpointError("--resume " + which + ": no such checkpoint");
    data = checkpointer->load(*path);
  }

  auto stored = config::load_config_from_string(data.config_yaml, (*path / "config.yaml").string());
  auto before = flatten(stored.config), now = flatten(cfg);
  std::vector<std::string> differing;
  for (const auto& [key, value] : now)
    if (must_match(key) && before[key] != value)
      differing.push_back(key + " (checkpoint: " + before[key] + ", now: " + value + ")");
  if (!differing.empty()) {
    std::string list;
    for (auto& d : differing) list += "\n  " + d;
    throw ConfigError("cannot resume from " + path->string() +
                      ": the config changes what a resume cannot honour:" + list);
  }
  restore(data, /*restore_data=*/true, /*restore_guard=*/true);
  files.replay_from(counters.step + 1);
  log::info("ckpt", "resumed from {} at step {}", path->string(), counters.step);
  event("resume", {{"path", path->string()}, {"from_step", counters.step}, {"mode", which}});
  const config::ResumeRecovery on_resume = cfg.stability.recovery.on_resume;
  if (crash)
    event("crash_loop", {{"died_at_step", crash->step},
                         {"died_at_iteration", crash->iteration + 1},
                         {"abnormal_ends", 2}});
  if (crash || on_resume == config::ResumeRecovery::kAlways ||
      (on_resume == config::ResumeRecovery::kStable && which == "stable"))
    begin_resume_recovery(*path, crash ? "crash_loop" : "resume_" + which, crash);
  return true;
}

void Trainer::State::begin_resume_recovery(const fs::path& snapshot, const std::string& reason,
                                           const std::optional<Heartbeat>& crash) {
  const TrainCounters resumed = counters;
  // Where the abandoned timeline got to: the newest checkpoint, or the crash if it got further.
  TrainCounters reached = resumed;
  std::string newest_name;
  if (auto newest = checkpointer->newest_written(); newest && *newest != snapshot) {
    reached = TrainCounters::from_json(checkpoint::read_trainer_state(*newest),
                                       cfg.data.micro_batch_size, comm.world_size());
    newest_name = newest->string();
  }
  if (crash && crash->micro_taken >= reached.micro_taken) {
    // The step in flight when it died is set aside too: its data may be what kills the process.
    reached.step = crash->step;
    reached.iteration = crash->iteration + 1;
    reached.micro_taken = crash->micro_taken + cfg.data.grad_accum_steps;
  }
  const int64_t discarded = std::max<int64_t>(reached.step - resumed.step, 0);
  const int64_t window = std::max<int64_t>(reached.micro_taken - resumed.micro_taken, 0);
  const bool skip = options.resume_data == "skip";
  if (skip && window > 0) {
    set_aside(window, reason);
    counters.micro_taken += window;
    counters.quarantined_micro += window;
  }
  // Attempts only move forward: faults keyed to them are not replayed.
  counters.iteration = std::max(counters.iteration, reached.iteration);
  const auto moved = checkpointer->abandon_after(resumed.step);
  nlohmann::json detail = {
      {"reason", reason},
      {"checkpoint", snapshot.string()},
      {"abandoned_from_step", reached.step},
      {"discarded_steps", discarded},
      {"data", skip ? "skip" : "replay"},
      {"quarantined_samples", skip ? window * cfg.data.micro_batch_size * comm.world_size() : 0},
      {"steps", cfg.stability.recovery.steps},
      {"lr_factor", cfg.stability.recovery.lr_factor},
      {"until_step", resumed.step + cfg.stability.recovery.steps}};
  if (!newest_name.empty()) detail["newest_checkpoint"] = newest_name;
  if (!moved.empty()) detail["abandoned_timeline"] = moved.string();
  if (!guard) {
    log::warn("ckpt", "{}: stability.enabled is false, so there is no recovery overlay", reason);
    return;
  }
  guard->start_recovery(resumed.step);
  event("recovery_start", detail);
  log::warn("ckpt",
            "{}: resumed at step {} (abandoning {} step(s) up to {}), {} the data in between, "
            "recovering at {} x lr for {} steps",
            reason, resumed.step, discarded, reached.step, skip ? "skipping" : "replaying",
            cfg.stability.recovery.lr_factor, cfg.stability.recovery.steps);
}

}  // namespace keel::train
