#include "train/forensics.h"

#include "checkpoint/checkpointer.h"
#include "checkpoint/tensor_file.h"
#include "common/error.h"
#include "common/log.h"
#include "monitor/run_files.h"

namespace keel::train {
namespace fs = std::filesystem;

namespace {

void write_weights(const fs::path& path, const checkpoint::TensorMap& weights, int64_t step) {
  try {
    checkpoint::write_safetensors(path, weights, {{"step", std::to_string(step)}});
  } catch (const CheckpointError& e) {
    throw RecordError(std::string("forensics: ") + e.what());
  }
}

}  // namespace

void Forensics::write(const TrainCounters& at, const StepSamples& step,
                      const std::vector<double>& layer_grad_norms, const nlohmann::json& signals,
                      const checkpoint::TensorMap& weights, bool parts) const {
  if (step.losses.empty()) return;
  // The top-k over every rank's samples (collectives: every rank takes part, rank 0 writes).
  auto losses = comm_->all_gather(torch::cat(step.losses).to(device_)).to(torch::kCPU);
  auto ids = comm_->all_gather(torch::cat(step.ids).to(device_, torch::kInt64)).to(torch::kCPU);
  auto tokens = comm_->all_gather(torch::cat(step.tokens).to(device_)).to(torch::kCPU);
  // Every rank names the folder before rank 0 makes it (the run directory is shared).
  fs::path dir = run_dir_ / "forensics" / checkpoint::step_dir_name(at.step);
  std::error_code ec;
  if (fs::exists(dir, ec)) dir += "-iter" + std::to_string(at.iteration);
  if (parts) comm_->barrier();
  if (comm_->is_main()) {
    fs::create_directories(dir, ec);
    if (ec) throw RecordError("cannot create " + dir.string() + ": " + ec.message());
  }
  if (parts) {  // ZeRO-3: each rank its part of the weights
    comm_->barrier();
    write_weights(dir / ("model.rank" + std::to_string(comm_->rank()) + ".safetensors"), weights,
                  at.step);
  }
  if (!comm_->is_main()) return;

  int64_t k = std::min<int64_t>(top_k_, losses.numel());
  auto [top_losses, top_index] = losses.topk(k);
  nlohmann::json samples = nlohmann::json::array();
  for (int64_t i = 0; i < k; ++i) {
    int64_t row = top_index[i].item<int64_t>();
    const int64_t id = ids[row].item<int64_t>();
    nlohmann::json sample = {{"sample_id", id},
                             {"loss", top_losses[i].item<double>()},
                             {"text", data_->decode(tokens[row])}};
    // Where it lies in the data (shard, offset) and where it came from (input file, line, id).
    if (auto where = data_->locate(id); !where.empty()) sample["where"] = std::move(where);
    samples.push_back(std::move(sample));
  }
  nlohmann::json layers_json = nlohmann::json::object();
  for (size_t i = 0; i < layer_names_.size() && i < layer_grad_norms.size(); ++i)
    layers_json[layer_names_[i]] = layer_grad_norms[i];

  // Decoded text need not be UTF-8 (byte-level data): invalid bytes are written as U+FFFD.
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  monitor::write_record_file((dir / "samples.json").string(),
                             samples.dump(2, ' ', false, kReplace) + "\n");
  monitor::write_record_file((dir / "layers.json").string(), layers_json.dump(2) + "\n");
  monitor::write_record_file((dir / "signals.json").string(), signals.dump(2) + "\n");
  if (!parts) write_weights(dir / "model.safetensors", weights, at.step);
  log::warn("guard", "forensics of step {} in {} (top sample {} with loss {:.3f})", at.step,
            dir.string(), samples.empty() ? -1 : samples[0]["sample_id"].get<int64_t>(),
            samples.empty() ? 0.0 : samples[0]["loss"].get<double>());
}

}  // namespace keel::train
