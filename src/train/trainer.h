// The training loop: wires config, data, model, optimizer, schedule and metric files together.
// It reads top to bottom: setup, eval at step 0, then for each optimizer step the micro-batches,
// the measurements, the guard's decision, the update and its record (Trainer::State::train_step);
// eval and checkpoints at intervals and at the last step.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <memory>
#include <string>

#include "config/schema.h"

namespace keel::distributed {
class Communicator;
}

namespace keel::train {

// What `--resume` asks for.
struct ResumeRequest {
  enum class Kind { kNone, kLatest, kStable, kPath };
  Kind kind = Kind::kNone;
  std::filesystem::path path;  // kPath: a checkpoint directory, or a checkpoints directory

  bool requested() const { return kind != Kind::kNone; }
  // As the record names it (starts.jsonl, events): "", "latest", "stable" or the path.
  std::string name() const;
  // --resume's value: latest, stable, or a directory that exists. Anything else is a UserError
  // naming the flag, with a did-you-mean for a near miss of latest or stable and the working
  // directory for a relative path that is not there.
  static ResumeRequest parse(const std::string& value);
};

// A resume that is a recovery: the data consumed between the snapshot resumed from and the newest
// checkpoint is set aside in quarantine.jsonl (skip) or trained on again (replay).
enum class ResumeData { kSkip, kReplay };

struct TrainOptions {
  std::string run_dir;  // empty: run.out_dir/run.name
  ResumeRequest resume;
  ResumeData resume_data = ResumeData::kSkip;
  int local_rank = 0;        // several ranks on a host: this one's GPU
  int local_world_size = 1;  // ranks on this host: they share its memory
  // A Hugging Face model directory (`keel export --format hf` writes one) whose weights replace
  // the initial ones; its config.json must match the model section. A resume that finds a
  // checkpoint loads the checkpoint's weights instead.
  std::string init_from;
  // --profile: this many optimizer steps recorded into RUN_DIR/profile/ (monitor/step_profiler.h),
  // after the first two of the start; 0: none.
  int64_t profile_steps = 0;
};

// run.device resolved: cuda (device `local_rank`) when asked for, or when auto and one is visible.
// ConfigError when cuda is asked for and there is none.
torch::Device select_device(config::Device requested, int local_rank = 0);

// Resolves the run directory for a config and options.
std::string resolve_run_dir(const config::Config& cfg, const TrainOptions& options);

class Trainer {
 public:
  // `resolved_yaml` is written to RUN_DIR/config.resolved.yaml by rank 0.
  Trainer(const config::Config& cfg, std::string resolved_yaml, TrainOptions options,
          distributed::Communicator& comm);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains to run.max_steps. Throws UserError for bad input, RunStopped when the run stops itself.
  void run();

  // Final metrics, for callers and tests.
  double last_loss() const;
  double last_val_loss() const;

  struct State;  // defined in trainer_state.h, shared by the trainer's .cpp files

 private:
  void loop();  // resume or start, the steps, evals and checkpoints, the end

  std::unique_ptr<State> s_;
};

}  // namespace keel::train
