// Internal to src/train: the trainer's live state, shared by setup.cpp (the start), trainer.cpp
// (the step loop), step_record.cpp, evaluation.cpp and snapshot.cpp (checkpoint capture/restore).
// Only what lives across steps is here (a step's own figures pass between its stages as values,
// step_values.h), grouped by what it serves: the launch, the compute, the data feed, the
// defences, the record and the saves. What has state of its own is a component with its own
// header (counters, checkpoint cadence, quarantine, step record, recovery, forensics, resume
// source, process settings, run history, the parallel plan).
#pragma once

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "common/clock.h"
#include "config/schema.h"
#include "data/batch.h"
#include "distributed/communicator.h"
#include "guard/guard.h"
#include "model/fused_ops.h"
#include "model/transformer.h"
#include "monitor/device_window.h"
#include "monitor/progress.h"
#include "monitor/run_files.h"
#include "monitor/step_profiler.h"
#include "monitor/straggler_watch.h"
#include "optim/optimizer.h"
#include "optim/precision.h"
#include "train/accumulation.h"
#include "train/checkpoint_cadence.h"
#include "train/counters.h"
#include "train/faults.h"
#include "train/layer_groups.h"
#include "train/memory_watch.h"
#include "train/micro_graph.h"
#include "train/parallel_plan.h"
#include "train/process_settings.h"
#include "train/quarantine.h"
#include "train/recovery.h"
#include "train/replay.h"
#include "train/resume_source.h"
#include "train/run_history.h"
#include "train/screen.h"
#include "train/step_record.h"
#include "train/step_values.h"
#include "train/trainer.h"

namespace keel::train {

struct Trainer::State {
  State(const config::Config& c, std::string yaml, TrainOptions o, distributed::Communicator& cm)
      : cfg(resolved_config(c)), comm(cm), launch(std::move(yaml), std::move(o)) {}
  // The config with its `auto` keys resolved (the data's vocabulary read from the shards).
  static config::Config resolved_config(const config::Config& c);

  // ---- setup and the step (trainer.cpp)
  void setup();
  void build();  // everything a start checks and builds before it writes anything
  void configure_process();
  void build_model();
  // Every rank refuses together: `refused` (this rank's refusal, if any) or another rank's.
  void agree_to_start(std::exception_ptr refused);
  void open_record();
  void train_step();
  bool is_log_step() const;
  void apply_unguarded(const StepResult& result, double lr, bool log_step, StepTally& tally);
  void guarded_update(StepResult result, double lr, bool log_step, StepTally& tally);
  StepTally& tally_applied(StepTally& t) const;
  void tally_samples(StepTally& t, const Verdict& v, const StepResult& r) const;
  void adjust_accumulation(const Verdict& v);
  // The screen's bounds for one step: high masks samples above it; low (screen.low quarantine)
  // masks samples below it and those that repeat content seen under another id.
  MicroBatches forward_backward(bool keep_samples, std::optional<double> screen_threshold,
                                std::optional<double> low_threshold);
  MicroOutput run_micro(const data::Batch& batch, int64_t micro,
                        const std::vector<int64_t>& fingerprints,
                        std::optional<double> screen_threshold, std::optional<double> low_threshold,
                        double growth);
  // The low side of the screen for one micro-batch: its kept mask from its per-sample losses.
  using LowKeep = std::function<torch::Tensor(const torch::Tensor& per_sample_loss)>;
  // One micro-batch forward, screened, and backward (forward_backward.cpp; a CUDA graph's body).
  MicroOutput micro_step(const torch::Tensor& tokens, const torch::Tensor& threshold,
                         const torch::Tensor& divisor, const LowKeep& low_keep, double growth,
                         int64_t micro);
  // logging.sample_ids: the step's sample ids (every rank's, in rank order) into samples.jsonl.
  void write_sample_ids(std::vector<int64_t> sample_ids, int64_t position);
  StepResult measure(MicroBatches micro, std::optional<double> screen_threshold,
                     std::optional<double> low_threshold);
  double clip_bound() const;
  // ---- the guard's verdict (verdict.cpp)
  // Queues the step's values for the host (and, gate on, the device's verdict on the update).
  StepReadout queue_read(const StepResult& r);
  // The guard's verdict on the step, from its values once they are on the host; writes nothing.
  Verdict decide(const StepResult& r, const HostFigures& h, double lr);
  void record_verdict(Verdict& v);
  // ---- replay before blame (replay.cpp)
  // Whether the step, as the host read it, is an alarm that would blame its data.
  bool replay_due(const HostFigures& h) const;
  // The first guarded step of this start, computed again: the run's own noise.
  void calibrate_replay(const StepResult& r);
  torch::Tensor parts_of_step(const StepResult& r);
  // Replays the step and acts on what it finds: a machine fault is on record, and the step goes
  // on with the replay's values (ReplayOutcome::redo), or the run stops as a faulty device.
  ReplayOutcome replay_before_blame(const StepResult& r, const HostFigures& h);
  // The step's micro-batches forward and backward again (rank r computing rank r-`shift`'s),
  // measured; the samples are this rank's own, with the losses the replay gave them.
  StepResult replay_step(const StepResult& r, int64_t shift);
  // `in_step`: the step in progress is not applied, and its data is kept for the resumed run.
  [[noreturn]] void stop_faulty_device(const guard::Decision& d, bool in_step);
  // stability.replica_check_every: whether the ranks' copies agree (when not: on record, and the
  // newest checkpoint restored on every rank).
  bool replicas_hold_the_same();
  void reject(const Verdict& v, const StepResult& r);
  // Clips and queues the update; `refuse` (the device's verdict) gates it.
  QueuedUpdate queue_update(const StepResult& r, double lr, bool log_step,
                            const torch::Tensor& refuse);
  // The update is applied: the update a gate held back is queued again without it, the loss
  // scale and the counters move. At log steps it returns the per-layer update/parameter ratios
  // |dw|/|w| (empty otherwise).
  std::vector<double> finish_update(const StepResult& r, double lr, bool log_step,
                                    const QueuedUpdate& u, bool refused_on_device);
  // The attention-output std per layer of the last forward pass, averaged over the ranks (so
  // every rank's guard judges the same values).
  std::vector<double> attention_std_agreed();
  std::vector<double> ranks_work_ms(const LogWindow& window);  // all ranks take part
  guard::GuardEvent straggler_warning(const monitor::StragglerFigures& f) const;
  void act_on_schedule();
  // `v`: the guard's verdict (null when the guard is off).
  void record_step(const StepResult& r, double lr, const std::vector<double>& update_ratios,
                   const Verdict* v);
  // The newest logged training loss (NaN before the first log step).
  double loss_logged() const {
    return record.step_record ? record.step_record->last_loss()
                              : std::numeric_limits<double>::quiet_NaN();
  }
  // checkpoint.every_steps: auto, decided once the run has measured a save and some steps: the
  // figures agreed over the ranks, the decision on record.
  void decide_checkpoint_cadence();
  double evaluate();
  // The model's mean loss on the reference batch (no gradient): the measure that tells a broken
  // model from bad data when the guard alarms.
  double probe_loss();
  void event(EventKind kind, const nlohmann::json& detail = nlohmann::json::object());
  void event(const guard::GuardEvent& e);  // with a warn's message on the console
  void record_events(const guard::Decision& d);
  [[noreturn]] void stop(const guard::Decision& d);
  void check_consumed();
  data::Batch next_batch();

  // ---- checkpoints (snapshot.cpp)
  // `redo_step`: the data position (and random state) the step in progress began with, so that
  // the resumed run computes that step again.
  checkpoint::CheckpointData capture(bool redo_step = false) const;
  // Restores model/optimizer/scaler/RNG and the step; the other counters, the data position and
  // the guard only when asked.
  void restore(const checkpoint::CheckpointData& data, bool restore_data, bool restore_guard);
  void save_checkpoint(bool stable, bool redo_step = false);
  uint64_t snapshot_memory_limit() const;  // checkpoint.stable.memory_mb, resolved
  void maybe_checkpoint();
  // The record of the resume setup restored: events, the newer record dropped, a recovery.
  void record_resume();
  // --profile: the recorder of this start's steps (after its first two, when enough remain), and
  // the end of each step for it (`last`: no step follows), which logs where the trace went.
  void start_profiler();
  void finish_profile(bool last);
  // The collaborators recovery moves and writes (built with the record).
  RecoveryParts recovery_parts();

  // ---- what lives across steps: at most fifteen members, each a component or a group of them

  config::Config cfg;  // with its `auto` keys resolved
  distributed::Communicator& comm;

  // What this start was asked and found: options, directories, the resume, process settings.
  struct Launch {
    Launch(std::string yaml, TrainOptions o)
        : resolved_yaml(std::move(yaml)), options(std::move(o)) {}
    std::string resolved_yaml;
    TrainOptions options;
    std::string run_dir;
    std::unique_ptr<ProcessSettings> process_settings;  // restored when the trainer ends
    std::unique_ptr<StopSignals> stop_signals;          // after process_settings: gone before it
    RunHistory history;                                 // starts.jsonl and the heartbeat (rank 0)
    // The checkpoint this start resumes from (found, checked and restored in build()).
    std::optional<ResumeSource> resume_source;
    bool resumed = false;
    int64_t start_iteration = 0;            // counters.iteration when this start began
    std::unique_ptr<FaultInjector> faults;  // the config's injected faults (tests, rehearsals)
    std::vector<std::string> rank_hosts;    // every rank's "host device", in rank order
  } launch;

  // The model and what computes it.
  torch::Device device = torch::kCPU;
  model::Transformer model{nullptr};
  // How the ranks share the step (replicated, ZeRO-1/2/3), with the optimizer.
  std::unique_ptr<ParallelPlan> parallel;
  std::optional<optim::DynamicLossScaler> scaler;  // fp16
  struct Compute {
    optim::Precision precision = optim::Precision::kFp32;
    std::vector<std::pair<std::string, torch::Tensor>> named_params;
    std::vector<torch::Tensor> params;
    std::unique_ptr<LayerGroups> layers;
    // run.cuda_graphs: the micro-batches replayed from a CUDA graph (null: eager).
    std::unique_ptr<MicroGraph> micro_graph;
  } compute;

  // The data the steps take.
  struct Feed {
    explicit Feed(const config::Config& c) : accumulation{c.data, c.schedule.warmup_steps} {}
    std::unique_ptr<data::BatchSource> train_data;
    std::unique_ptr<data::BatchSource> val_data;  // built once, rewound for every evaluation
    nlohmann::json val_start;                     // val_data's state before its first batch
    int64_t samples_per_step = 0;                 // at grad_accum_steps micro-batches
    int64_t tokens_per_step = 0;
    // Micro-batches per step (fixed, or dynamic on the guard's gradient norms).
    Accumulation accumulation;
    // Where the step in progress began in the data (guard on): a faulty device's stop saves this
    // position, so that the step is trained on where the run resumes, not skipped.
    nlohmann::json step_start_data;
    int64_t step_start_micro = 0;
  } feed{cfg};

  // The defences besides the guard itself.
  std::unique_ptr<guard::Guard> guard;
  struct Defence {
    Screen screen;  // the per-sample screen: its bounds, masks, repeat watch and quarantine
    std::unique_ptr<monitor::DeviceWindow> grad_norm_window;  // the median when the guard is off
    std::unique_ptr<Forensics> forensics;                     // forensics/ (opened with the record)
    std::unique_ptr<Recovery> recovery;  // rollback, dropped steps, a resume's recovery
    ReplayCheck replay;                  // replay before blame: the step's random state, the noise
    // The reference batch: the first sequences of the validation data, and the model's loss on
    // it when the newest stable snapshot was taken (NaN before there is one).
    torch::Tensor probe_tokens;  // (P, T+1) int64
    double probe_reference = std::numeric_limits<double>::quiet_NaN();
  } defence;

  // The record.
  struct Record {
    monitor::RunFiles files;
    std::unique_ptr<monitor::Progress> progress;
    std::unique_ptr<monitor::StepProfiler> profiler;  // --profile
    std::unique_ptr<StepRecord> step_record;          // metrics.jsonl (opened with the record)
    std::unique_ptr<MemoryWatch> memory_watch;        // the plan against the measured peak
    std::optional<double> loss_floor;                 // synthetic data: the chain's entropy rate
    double last_val_loss = std::numeric_limits<double>::quiet_NaN();
    monitor::StragglerWatch stragglers;  // rank 0: which rank the others wait for
    double waited_s = 0.0;               // this rank's collective waiting when the window opened
  } record;

  // Checkpoints.
  struct Saves {
    explicit Saves(const config::Config& c) : cadence{c.checkpoint, c.run.max_steps} {}
    std::unique_ptr<checkpoint::Checkpointer> checkpointer;
    CheckpointCadence cadence;
    int64_t last_checkpoint_step = -1;
  } saves{cfg};

  TrainCounters counters;
};

// Set by the SIGTERM/SIGINT handler; the loop checks it between steps.
extern std::atomic<int> g_stop_signal;

}  // namespace keel::train
