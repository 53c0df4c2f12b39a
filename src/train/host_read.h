// One step's figures on their way from the device to the host: packed into one fp64 tensor (and
// every rank's (id, fingerprint) pairs), copied without waiting (train/step_read.h), and unpacked
// by name. The layout of the packed tensor is known here alone.
//
// Owns: the copies in flight. Called by: verdict.cpp (queue_read, decide). Writes: nothing.
// Saves: nothing (it lives for one step).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/torch.h>

#include "train/step_read.h"

namespace keel::train {

// One rank's own part of a step, before any reduction: the sum of its samples' losses and of its
// gradients' squares. Ranks that recompute the step get the same (train/replay.h).
struct Contribution {
  double loss_sum = 0.0, grad_square = 0.0;
};

// The figures on the device, as the step measured them (every rank's samples gathered already).
struct DeviceFigures {
  torch::Tensor loss;              // () mean cross-entropy over the kept samples
  torch::Tensor grad_norm;         // () global L2 norm, before clipping
  torch::Tensor overflow;          // (1) fp16's overflow flag (undefined: no scaler)
  torch::Tensor refused;           // (1) the device gate's verdict (undefined: no gate)
  torch::Tensor loss_scale;        // () fp16's loss scale (undefined: no scaler)
  torch::Tensor layer_grad_norms;  // (L) per layer group
  torch::Tensor sample_losses;     // (n) every rank's, in rank order
  torch::Tensor kept;              // (n) 1/0 (undefined: the step was not screened)
  torch::Tensor pairs;             // (n, 2) int64 (id, fingerprint), on the host or the device
  torch::Tensor rank_grad_norms;   // (world) every rank's global norm (undefined: one rank)
  torch::Tensor contributions;     // (world, 2) every rank's Contribution (undefined: none)
};

// The same figures on the host.
struct HostFigures {
  double loss = 0.0;
  double grad_norm = 0.0;
  bool overflow = false;
  bool refused_on_device = false;
  std::optional<double> loss_scale;
  std::vector<double> layer_grad_norms;
  std::vector<double> sample_losses;
  std::vector<bool> kept;  // every sample's (all true when the step was not screened)
  std::vector<int64_t> ids, fingerprints;
  std::vector<double> rank_grad_norms;      // every rank's, in rank order (empty: one rank)
  std::vector<Contribution> contributions;  // every rank's, in rank order (empty: not measured)
};

class HostRead {
 public:
  // Queues the copy of `f`; the host may go on queueing work (the update) behind it.
  explicit HostRead(const DeviceFigures& f);
  // Blocks until the copies are done and returns them by name.
  HostFigures wait();

 private:
  StepRead read_;
  size_t values_ = 0, pairs_ = 0;  // their indices in read_
  int64_t layers_ = 0, ranks_ = 0, contributions_ = 0;
  bool screened_ = false, scaled_ = false;
};

}  // namespace keel::train
