// This rank's own gradients of one step as they go into the reductions: the sum of their squares.
// Healthy replicas that recompute a step on the same weights and data give the same figure (to the
// bit where the run is deterministic); a device that computed wrong does not. The replay before
// blame (train/replay.h) compares it rank by rank to name the rank at fault.
//
// Owned by: the gradient reducers (GradReducer, ShardedParameters), which add each flat buffer
// before its collective starts. Saves nothing.
#pragma once

#include <torch/torch.h>

namespace keel::distributed {

class LocalSquare {
 public:
  // A new step: nothing added yet.
  void reset() { sum_ = torch::Tensor(); }
  // One flat buffer of this rank's gradients, before its reduction.
  void add(const torch::Tensor& flat) {
    auto s = at::linalg_vector_norm(flat, 2, c10::nullopt, false, torch::kFloat64).square();
    sum_ = sum_.defined() ? sum_ + s : s;
  }
  // () fp64 on the gradients' device (undefined: nothing added since reset()).
  const torch::Tensor& sum() const { return sum_; }

 private:
  torch::Tensor sum_;
};

}  // namespace keel::distributed
