// Internal to src/train: the trainer's live state, shared by trainer.cpp (the loop),
// recovery.cpp (pause, forensics, rollback) and snapshot.cpp (checkpoint capture/restore).
#pragma once

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "config/schema.h"
#include "data/batch.h"
#include "dist/communicator.h"
#include "guard/guard.h"
#include "model/transformer.h"
#include "monitor/device_window.h"
#include "monitor/progress.h"
#include "monitor/run_files.h"
#include "optim/optimizer.h"
#include "optim/precision.h"
#include "train/faults.h"
#include "train/layer_groups.h"
#include "train/trainer.h"

namespace keel::train {

using Clock = std::chrono::steady_clock;

// Per-sample losses of the current optimizer step, for the top-k forensics of a pause.
struct StepSamples {
  std::vector<torch::Tensor> ids, losses, tokens;  // one entry per micro-batch
  void clear() {
    ids.clear();
    losses.clear();
    tokens.clear();
  }
};

struct Trainer::State {
  State(const config::Config& c, std::string yaml, TrainOptions o, dist::Communicator& cm)
      : cfg(c), resolved_yaml(std::move(yaml)), options(std::move(o)), comm(cm) {}

  // ---- setup (trainer.cpp)
  void setup();
  void train_step();
  void apply_update(const torch::Tensor& grad_norm, const std::optional<torch::Tensor>& found_inf,
                    double lr, bool is_log_step, const torch::Tensor& loss);
  void log_step(const torch::Tensor& loss, const torch::Tensor& grad_norm, double lr,
                const std::vector<double>& update_ratios, double update_ratio);
  double evaluate();
  void event(const std::string& kind, const nlohmann::json& detail = nlohmann::json::object());
  void check_consumed();
  data::Batch next_batch();

  // ---- checkpoints (snapshot.cpp)
  checkpoint::CheckpointData capture() const;
  // Restores model/optimizer/scaler/counters; the data position and guard only when asked.
  void restore(const checkpoint::CheckpointData& data, bool restore_data, bool restore_guard);
  void save_checkpoint(bool stable);
  void maybe_checkpoint();
  bool resume();  // true when a checkpoint was loaded

  // ---- pause and rollback (recovery.cpp)
  void pause_and_rollback(const guard::Decision& decision, const nlohmann::json& signals);
  void write_forensics(const nlohmann::json& signals);

  config::Config cfg;
  std::string resolved_yaml;
  TrainOptions options;
  dist::Communicator& comm;

  std::string run_dir;
  torch::Device device = torch::kCPU;
  optim::Precision precision = optim::Precision::kFp32;
  model::Transformer model{nullptr};
  std::vector<std::pair<std::string, torch::Tensor>> named_params;
  std::vector<torch::Tensor> params;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::optional<optim::DynamicLossScaler> scaler;
  std::unique_ptr<data::BatchSource> train_data;
  std::optional<double> loss_floor;
  monitor::RunFiles files;
  std::unique_ptr<monitor::Progress> progress;
  std::unique_ptr<monitor::DeviceWindow> grad_norm_window;
  std::unique_ptr<guard::Guard> guard;
  std::unique_ptr<FaultInjector> faults;
  std::unique_ptr<LayerGroups> layers;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer;
  StepSamples step_samples;

  // Counters. `step` is the number of updates in the current model lineage (rolls back);
  // `iteration` counts step attempts and `micro_taken` micro-batches taken from this rank's data
  // order — both only move forward.
  int64_t step = 0;
  int64_t iteration = 0;
  int64_t micro_taken = 0;
  int64_t quarantined_micro = 0;
  int64_t tokens_per_step = 0;
  int64_t samples_per_step = 0;
  int64_t last_checkpoint_step = -1;
  int64_t last_eval_step = -1;
  double last_loss = std::numeric_limits<double>::quiet_NaN();
  double last_val_loss = std::numeric_limits<double>::quiet_NaN();
  double last_grad_norm_host = std::numeric_limits<double>::quiet_NaN();

  // Accumulated between log steps.
  double loader_wait_s = 0.0;
  double guard_s = 0.0;  // host time in the guard's per-step and periodic checks
  int64_t steps_since_log = 0;
  int64_t clipped_since_log = 0;
  Clock::time_point log_window_start = Clock::now();
};

// Set by the SIGTERM/SIGINT handler; the loop checks it between steps.
extern std::atomic<int> g_stop_signal;

}  // namespace keel::train
