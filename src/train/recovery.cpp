// The guard's pause: forensics of the offending step, rollback to the newest stable snapshot,
// quarantine of the data consumed since it, and the start of the recovery overlay.
#include <filesystem>
#include <fstream>

#include "checkpoint/tensor_file.h"
#include "common/error.h"
#include "common/log.h"
#include "train/trainer_state.h"

namespace keel::train {
namespace fs = std::filesystem;

void Trainer::State::write_forensics(const nlohmann::json& signals) {
  if (!comm.is_main() || step_samples.losses.empty()) return;
  fs::path dir = fs::path(run_dir) / "forensics" / checkpoint::step_dir_name(step);
  if (fs::exists(dir)) dir += "-iter" + std::to_string(iteration);
  fs::create_directories(dir);

  auto losses = torch::cat(step_samples.losses).to(torch::kCPU);
  auto ids = torch::cat(step_samples.ids).to(torch::kCPU);
  auto tokens = torch::cat(step_samples.tokens).to(torch::kCPU);
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

  std::ofstream(dir / "samples.json") << samples.dump(2) << "\n";
  std::ofstream(dir / "layers.json") << layers_json.dump(2) << "\n";
  std::ofstream(dir / "signals.json") << signals.dump(2) << "\n";
  checkpoint::TensorMap weights;
  for (const auto& [name, p] : named_params) weights[name] = p.detach();
  checkpoint::write_safetensors(dir / "model.safetensors", weights,
                                {{"step", std::to_string(step)}});
  log::warn("guard", "forensics of step {} in {} (top sample {} with loss {:.3f})", step,
            dir.string(), samples.empty() ? -1 : samples[0]["sample_id"].get<int64_t>(),
            samples.empty() ? 0.0 : samples[0]["loss"].get<double>());
}

void Trainer::State::pause_and_rollback(const guard::Decision& decision,
                                        const nlohmann::json& signals) {
  nlohmann::json detail =
      decision.events.empty() ? nlohmann::json::object() : decision.events.back().detail;
  event("pause", detail);
  write_forensics(signals);
  if (!cfg.stability.rollback.enabled) {
    log::warn("guard", "pause at step {}: rollback disabled, the update is skipped", step);
    return;
  }
  auto target = checkpointer->resolve("stable");
  if (!target)
    throw RunStopped("pause at step " + std::to_string(step) +
                     " but no stable snapshot exists to roll back to");

  const int64_t from_step = step;
  auto data = checkpointer->load(*target);
  const int64_t stable_micro = data.trainer_state.at("micro_taken").get<int64_t>();
  // Data moves forward, the model goes back: with skip_data the window consumed since the stable
  // snapshot (which held the offending samples) is never trained on again.
  const bool replay = !cfg.stability.rollback.skip_data;
  restore(data, /*restore_data=*/replay, /*restore_guard=*/false);
  nlohmann::json quarantine = nullptr;
  if (!replay) {
    // Skip-ahead: the data source moves on past the pause, counted as taken, so the
    // consumed-vs-steps cross-check still holds and a resumed run skips the same window.
    const int64_t ahead = cfg.stability.rollback.skip_ahead_steps * cfg.data.grad_accum_steps;
    for (int64_t i = 0; i < ahead; ++i) {
      (void)train_data->next();
      ++micro_taken;
    }
    int64_t micro = micro_taken - stable_micro;
    quarantined_micro += micro;
    const int64_t b = cfg.data.micro_batch_size;
    quarantine = {{"micro_batches", micro},
                  {"samples", micro * b * comm.world_size()},
                  {"first_position", stable_micro},
                  {"end_position", micro_taken},
                  {"skipped_ahead", ahead}};
  }
  nlohmann::json incident = {{"pause_step", from_step},
                             {"iteration", iteration},
                             {"reason", detail.value("reason", "")},
                             {"to_step", step}};
  event("rollback", {{"from_step", from_step},
                     {"to_step", step},
                     {"checkpoint", target->string()},
                     {"quarantine", quarantine}});
  guard->on_rollback(step, incident);  // throws RunStopped past max_rollbacks
  event("recovery_start", {{"steps", cfg.stability.recovery.steps},
                           {"lr_factor", cfg.stability.recovery.lr_factor},
                           {"until_step", step + cfg.stability.recovery.steps}});
  log::warn("guard",
            "rolled back from step {} to stable step {}; recovering at {} x lr for {} steps",
            from_step, step, cfg.stability.recovery.lr_factor, cfg.stability.recovery.steps);
}

}  // namespace keel::train
