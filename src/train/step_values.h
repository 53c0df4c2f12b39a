// What one optimizer step measured, passed from the step's stages (forward/backward, measure,
// decide) to those that act on it (update, record, quarantine, forensics, recovery). Plain values;
// the trainer owns them for the duration of a step.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "guard/guard.h"
#include "train/host_read.h"

namespace keel::train {

// The current optimizer step's samples (one entry per micro-batch): for the screen's quarantine
// records, the top-k forensics of a pause and the data statistics.
struct StepSamples {
  std::vector<torch::Tensor> ids, losses, tokens;   // (B) int64, (B) fp32, (B, T+1) int64
  std::vector<torch::Tensor> keep;                  // (B) fp32 1/0 (screening only)
  std::vector<torch::Tensor> doc_lengths, buckets;  // (B) int64 (shards only)
  std::vector<int64_t> fingerprints;                // one per sample, in order: xxh3 of its window
  void clear() { *this = StepSamples(); }
};

// The step's micro-batches, run forward and backward: (2) on the device, the kept samples' summed
// cross-entropy and their count, and the samples (kept only when the guard is on).
struct MicroBatches {
  torch::Tensor sums;
  StepSamples samples;
  double loader_wait_s = 0.0;  // the host's wait for the data
  double comm_s = 0.0;         // the reductions finished between micro-batches (several ranks)
};

// What one step's backward pass produced, measured, up to the guard's decision.
struct StepResult {
  torch::Tensor loss;                      // () mean cross-entropy over the step's kept samples
  std::optional<torch::Tensor> found_inf;  // fp16: the scaler's overflow flag (device)
  torch::Tensor param_norms;               // (P) per-parameter gradient L2 norms
  torch::Tensor grad_norm;                 // () global L2 norm, before clipping
  double clip_bound = 0.0;                 // the bound clipping applies this step
  // Screening: the threshold the step was screened with, and () samples / kept samples, by which
  // the gradients (a sum over kept samples of 1/samples each) are scaled to a mean over the kept.
  std::optional<double> screen_threshold;
  torch::Tensor grad_scale;
  std::optional<double> low_threshold;  // the low side's (set with screen_threshold)
  torch::Tensor kept;                   // () samples kept, over every rank
  StepSamples samples;                  // this rank's (kept only when the guard is on)
  // (2) fp64: this rank's own part of the step before any reduction (host_read.h's Contribution:
  // its samples' summed losses, its gradients' summed squares); the guard on only.
  torch::Tensor contribution;
  double loader_wait_s = 0.0;  // the host's wait for the data
  double comm_s = 0.0;         // the reductions the backward passes did not hide
};

// A step's values on their way to the host (queued before the update), and under
// stability.update_gate: device the device's own verdict on the update.
struct StepReadout {
  HostRead read;
  // (1) fp32 on the device: 1 where guard::refuses_update refuses the update (undefined: no gate).
  torch::Tensor refuse;
};

// The update of one step, queued: the weights before it (log steps: the update ratios) and
// whether the device may have refused it (a gated update).
struct QueuedUpdate {
  std::vector<torch::Tensor> before;
  torch::Tensor found_inf;  // (1) the overflow or non-finite flag, without the gate's verdict
  bool gated = false;
};

// What a replay before blame (replay.h) found: the step to go on with, when a device computed it
// wrong (the replay's values), and what the replay cost.
struct ReplayOutcome {
  std::optional<StepResult> redo;
  std::optional<double> seconds;  // unset: no replay ran
};

// The host's copy of one step's per-sample values, read with the guard's signals.
struct HostSamples {
  std::vector<int64_t> ids;
  std::vector<double> losses;
  std::vector<bool> kept;
  int64_t masked = 0;
  // The low side: the id whose content each sample repeats (-1: none), and whether its loss is
  // below the low threshold. A masked sample is the low side's when it is either.
  std::vector<int64_t> duplicate_of;
  std::vector<bool> low;
  bool low_side(size_t i) const { return duplicate_of[i] >= 0 || low[i]; }
};

// The guard's decision on a step, with what it was taken on: the step's samples as the host read
// them, its norms, and the signals (for events and forensics).
struct Verdict {
  guard::Decision decision;
  HostSamples samples;
  double grad_norm = 0.0;
  std::vector<double> layer_grad_norms;
  nlohmann::json signals;
  bool refused_on_device = false;  // the gate (stability.update_gate: device) held the update back
  bool clipped = false;            // applied, and clipped
  double guard_s = 0.0;            // the host's time reading the step and deciding
  guard::Action action() const { return decision.action; }
};

}  // namespace keel::train
