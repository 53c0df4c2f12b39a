// The guard's pause: forensics of the offending step, rollback to the newest stable snapshot,
// quarantine of the data consumed since it, and the start of the recovery overlay.
#include <filesystem>
#include <fstream>
#include <map>

#include "checkpoint/tensor_file.h"
#include "common/error.h"
#include "common/log.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;

void Trainer::State::write_forensics(const nlohmann::json& signals) {
  if (step_samples.losses.empty()) return;
  // The top-k over every rank's samples (collectives: every rank takes part, rank 0 writes).
  auto losses = comm.all_gather(torch::cat(step_samples.losses).to(device)).to(torch::kCPU);
  auto ids =
      comm.all_gather(torch::cat(step_samples.ids).to(device, torch::kInt64)).to(torch::kCPU);
  auto tokens = comm.all_gather(torch::cat(step_samples.tokens).to(device)).to(torch::kCPU);
  if (!comm.is_main()) return;
  fs::path dir = fs::path(run_dir) / "forensics" / checkpoint::step_dir_name(counters.step);
  std::error_code ec;
  if (fs::exists(dir, ec)) dir += "-iter" + std::to_string(counters.iteration);
  fs::create_directories(dir, ec);
  if (ec) throw RecordError("cannot create " + dir.string() + ": " + ec.message());

  int64_t k = std::min<int64_t>(cfg.stability.top_k_samples, losses.numel());
  auto [top_losses, top_index] = losses.topk(k);
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t i = 0; i < k; ++i) {
    int64_t row = top_index[i].item<int64_t>();
    samples.push_back({{"sample_id", ids[row].item<int64_t>()},
                       {"loss", top_losses[i].item<double>()},
                       {"text", train_data->decode(tokens[row])}});
  }
  nlohmann::json layers_json = nlohmann::json::object();
  if (signals.contains("layer_grad_norms"))
    for (size_t i = 0; i < layers->names().size(); ++i)
      layers_json[layers->names()[i]] = signals["layer_grad_norms"][i];

  // Decoded text need not be UTF-8 (byte-level data): invalid bytes are written as U+FFFD.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  monitor::write_record_file((dir / "samples.json").string(),
                             samples.dump(2, ' ', false, kReplace) + "\n");
  monitor::write_record_file((dir / "layers.json").string(), layers_json.dump(2) + "\n");
  monitor::write_record_file((dir / "signals.json").string(), signals.dump(2) + "\n");
  checkpoint::TensorMap weights;
  for (const auto& [name, p] : named_params) weights[name] = p.detach();
  try {
    checkpoint::write_safetensors(dir / "model.safetensors", weights,
                                  {{"step", std::to_string(counters.step)}});
  } catch (const CheckpointError& e) {
    throw RecordError(std::string("forensics: ") + e.what());
  }
  log::warn("guard", "forensics of step {} in {} (top sample {} with loss {:.3f})", counters.step,
            dir.string(), samples.empty() ? -1 : samples[0]["sample_id"].get<int64_t>(),
            samples.empty() ? 0.0 : samples[0]["loss"].get<double>());
}

void Trainer::State::set_aside(int64_t micro_batches, const std::string& reason) {
  // The losses this step measured, by sample id, for the records of the samples it held.
  std::map<int64_t, double> measured;
  for (size_t i = 0; i < host_samples.ids.size(); ++i)
    measured[host_samples.ids[i]] = host_samples.losses[i];
  // Every rank skips its own part of the window; the record names every rank's samples.
  std::vector<torch::Tensor> local;
  for (int64_t n = 0; n < micro_batches; ++n)
    local.push_back(train_data->next().sample_ids.to(torch::kInt64).reshape({-1}));
  if (local.empty()) return;
  const auto ids = comm.all_gather(torch::cat(local).to(device)).to(torch::kCPU).contiguous();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    const int64_t id = ids.data_ptr<int64_t>()[i];
    const auto it = measured.find(id);
    quarantine.record(id, counters, reason,
                      it != measured.end() ? std::optional<double>(it->second) : std::nullopt);
  }
}

// Within an incident whose rollbacks are spent, an alarming step is dropped: the update was never
// applied, and its samples (those the screen kept; the masked ones are on record already) are set
// aside so that a person can look at them.
void Trainer::State::drop_step(const Verdict& v) {
  for (const auto& e : v.decision.events) {
    if (e.kind != EventKind::kPause) continue;
    event(EventKind::kPause, e.detail);
    // Forensics of an incident's first alarm only: a long region must not fill the disk.
    if (e.detail.value("alarm_in_incident", int64_t{0}) == 1) write_forensics(v.signals);
  }
  // "alarm": the model was fine and the step's data set the alarm off; "incident_skip": the
  // incident's rollbacks were spent.
  const std::string reason =
      v.decision.skip_reason == guard::SkipReason::kData ? "alarm" : "incident_skip";
  for (size_t i = 0; i < host_samples.ids.size(); ++i)
    if (host_samples.kept[i])
      quarantine.record(host_samples.ids[i], counters, reason, host_samples.losses[i],
                        {{"incident", v.decision.incident}});
  counters.set_aside(cfg.data.grad_accum_steps, 0);
}

void Trainer::State::pause_and_rollback(const Verdict& verdict) {
  const auto& events = verdict.decision.events;
  nlohmann::json detail = nlohmann::json::object();
  for (const auto& e : events)
    if (e.kind == EventKind::kPause) detail = e.detail;
  event(EventKind::kPause, detail);
  write_forensics(verdict.signals);
  // Read (and so verified) once: the newest stable snapshot that loads.
  auto target = checkpointer->load_newest("stable");
  if (!target)
    throw RunStopped("pause at step " + std::to_string(counters.step) +
                     " but no stable snapshot exists to roll back to");

  const int64_t from_step = counters.step;
  const int64_t stable_micro =
      TrainCounters::from_json(target->data.trainer_state, cfg.data.micro_batch_size,
                               comm.world_size())
          .micro_taken;
  // Data moves forward, the model goes back: with skip_data the window consumed since the stable
  // snapshot (which held the offending samples) is never trained on again. The fp16 loss scale
  // stays as the scaler has learned it: going back to an old scale would replay its overflows.
  const bool replay = !cfg.stability.rollback.skip_data;
  std::map<std::string, torch::Tensor> scale;
  if (scaler) scale = scaler->state_dict();
  restore(target->data, /*restore_data=*/replay, /*restore_guard=*/false);
  if (scaler) scaler->load_state_dict(scale);
  nlohmann::json set_aside_detail = nullptr;
  if (!replay) {
    // The window since the stable snapshot (which held the offending samples) is set aside, each
    // sample on record, plus the incident's skip-ahead; all count as taken, so the consumed-vs-
    // steps cross-check still holds and a resumed run skips the same window.
    const int64_t ahead = verdict.decision.skip_ahead_steps * cfg.data.grad_accum_steps;
    const int64_t window = counters.micro_taken - stable_micro;
    train_data->load_state(target->data.trainer_state.at("data"));
    set_aside(window + ahead, "rollback");
    counters.set_aside(window, ahead);
    const int64_t micro = counters.micro_taken - stable_micro;
    set_aside_detail = {{"micro_batches", micro},
                        {"samples", micro * cfg.data.micro_batch_size * comm.world_size()},
                        {"first_position", stable_micro},
                        {"end_position", counters.micro_taken},
                        {"skipped_ahead", ahead}};
  }
  // The new timeline must not overwrite the abandoned one's checkpoints of the same steps.
  checkpointer->abandon_after(counters.step);
  files.replay_from(counters.step + 1);
  const auto& saved = target->data.trainer_state;
  guard->rolled_back(counters.step, saved.contains("guard") ? saved.at("guard") : nlohmann::json());
  event(EventKind::kRollback, {{"from_step", from_step},
                               {"to_step", counters.step},
                               {"incident", verdict.decision.incident},
                               {"checkpoint", target->path.string()},
                               {"quarantine", set_aside_detail}});
  const int64_t recovery = cfg.stability.recovery.steps;  // resolved in config
  event(EventKind::kRecoveryStart, {{"steps", recovery},
                                    {"lr_factor", cfg.stability.recovery.lr_factor},
                                    {"until_step", counters.step + recovery},
                                    {"incident", verdict.decision.incident}});
  // An incident's second or third rollback says so: the same line twice reads as a repeated log.
  const int64_t nth = detail.value("rollback", int64_t{1});
  static const char* const kOrdinal[] = {"first", "second", "third"};
  const std::string which = nth >= 1 && nth <= 3 ? kOrdinal[nth - 1] : std::to_string(nth) + "th";
  log::warn(
      "guard",
      "incident {}: rolled back from step {} to stable step {} ({} rollback of at most {}{}); "
      "recovering at {} x lr for {} steps",
      verdict.decision.incident, from_step, counters.step, which,
      cfg.stability.rollback.max_rollbacks,
      verdict.decision.skip_ahead_steps > 0
          ? fmt::format(", the data {} steps further ahead set aside too",
                        verdict.decision.skip_ahead_steps)
          : std::string(),
      cfg.stability.recovery.lr_factor, recovery);
}

}  // namespace keel::train
