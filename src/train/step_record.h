// The record of applied steps: one metrics.jsonl line and one progress line per logging window,
// with the seed's continuous data statistics.
//
// Owns: the logging window (the timings and counts accumulated since the previous log step) and
// the newest logged loss. Called by: setup.cpp (open_record); trainer.cpp (train_step,
// apply_unguarded), which adds each step attempt's tally (loader wait, guard and communication
// time, applied/clipped/skipped, masked and kept samples: values its stages returned);
// evaluation.cpp (exclude); step_record.cpp's record_step, which at a log step hands write() the
// step's figures; write() closes the window. Writes: metrics.jsonl (through RunFiles) and the
// progress line; reads nothing back. Saves: nothing: each start opens a new window, so the first
// metrics line after a resume covers only the steps since it. One per trainer, one thread.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "monitor/progress.h"
#include "monitor/run_files.h"
#include "monitor/straggler_watch.h"

namespace keel::train {

// Timings and counts accumulated between two log steps.
struct LogWindow {
  double loader_wait_s = 0.0;
  double guard_s = 0.0;  // host time in the guard's per-step and periodic checks
  double comm_s = 0.0;   // host time in the step's gradient and loss all-reduce (several ranks)
  int64_t steps = 0;     // applied updates
  int64_t tokens = 0;    // trained in them (all ranks)
  int64_t clipped = 0;   // of those, clipped (known when the guard reads the norm every step)
  int64_t skipped = 0;   // step attempts that applied nothing
  int64_t masked = 0;    // samples the screen masked
  // The applied steps' kept samples (guard on): their losses, the lengths of the documents their
  // windows start in and their buckets, for the window's data statistics.
  std::vector<double> kept_losses;
  std::vector<int64_t> doc_lengths, buckets;
  Clock::time_point start = Clock::now();
};

// What one step attempt adds to the logging window, from the values its stages returned.
struct StepTally {
  double loader_wait_s = 0.0, guard_s = 0.0, comm_s = 0.0;
  bool applied = false, clipped = false, skipped = false;
  int64_t tokens = 0;  // trained (all ranks), when applied
  int64_t masked = 0;  // samples the screen masked
  std::vector<double> kept_losses;
  std::vector<int64_t> doc_lengths, buckets;
};

// What the trainer measured for the step that closes a logging window.
struct StepFigures {
  int64_t step = 0;
  double loss = 0.0, lr = 0.0;
  double grad_norm = 0.0, grad_norm_median = 0.0, clip_bound = 0.0;
  double update_ratio = 0.0;
  int64_t queue_depth = 0;  // the loader's ready batches
  int64_t samples_seen = 0, tokens_seen = 0;
  std::optional<int64_t> grad_accum;  // the step's micro-batches, when dynamic
  std::optional<double> loss_scale;   // fp16
  bool several_ranks = false;         // the window's communication time goes on record
  // With the guard on (empty otherwise): per-layer update ratios and gradient norms by layer
  // name, the screen's threshold, the data statistics and whether the recovery overlay is on.
  bool guarded = false;
  std::vector<std::pair<std::string, double>> layer_update_ratios, layer_grad_norms;
  std::optional<double> screen_threshold;
  nlohmann::json data_statistics = nlohmann::json::object();
  bool in_recovery = false;
  // The std of each layer's attention output in this step's forward pass ("layers.0", ...).
  std::vector<std::pair<std::string, double>> attention_output_std;
  // The largest layer's attention-output std over its value at initialisation (the schedule
  // watch's reading), where the guard holds that baseline.
  std::optional<double> attention_growth;
  // Several ranks: the rank whose own work (its step time less its waiting for collectives) was
  // the most in the window, and how far behind the median rank (ms per step).
  std::optional<monitor::StragglerFigures> stragglers;
};

// The seed's data statistics over a logging window's applied steps: the kept samples' loss
// distribution (n, mean, p50, p99, max), the lengths of the documents their windows start in
// (mean, p50, p95, p99, max; shards) and their bucket (cluster) mix. Each part is left out when
// its input is empty.
nlohmann::json data_statistics(const std::vector<double>& kept_losses,
                               const std::vector<int64_t>& doc_lengths,
                               const std::vector<int64_t>& buckets);

class StepRecord {
 public:
  // `files` and `progress` outlive this object.
  StepRecord(monitor::RunFiles& files, monitor::Progress& progress, int64_t max_steps,
             std::optional<double> loss_floor)
      : files_(&files), progress_(&progress), max_steps_(max_steps), loss_floor_(loss_floor) {}

  const LogWindow& window() const { return window_; }
  void add(const StepTally& t);
  // Time spent outside training (an evaluation) does not count toward the window's throughput.
  void exclude(Clock::duration d) { window_.start += d; }

  // Writes the metrics line and the progress line for the window that `f` closes, then opens a
  // new window.
  void write(const StepFigures& f);

  double last_loss() const { return last_loss_; }

 private:
  monitor::RunFiles* files_;
  monitor::Progress* progress_;
  int64_t max_steps_;
  std::optional<double> loss_floor_;
  LogWindow window_;
  double last_loss_ = std::numeric_limits<double>::quiet_NaN();
};

}  // namespace keel::train
