// How the ranks share a step: one interface, four implementations chosen once at setup.
//
//   replicated   every rank holds the whole model and optimizer state; the gradients are averaged
//                by one all-reduce after the backward pass, or (distributed.overlap) in buckets
//                during it. One process is this plan with nothing to reduce.
//   zero 1, 2    the optimizer state sharded: the gradient buckets are reduce-scattered (ZeRO-2:
//                in every micro-step, releasing each whole gradient once it is in its bucket)
//                and each rank updates its own elements, then gathers the weights.
//   zero 3       the weights sharded by unit too, gathered as the model runs; each unit's
//                gradients are reduce-scattered in every backward pass.
//
// Owns: the optimizer and whatever reduces and shards (the gradient reducer, the sharded weights).
// Called by: setup.cpp (make_parallel_plan), the step (trainer.cpp, forward_backward.cpp) and the
// checkpoint (snapshot.cpp, setup.cpp's resume). Writes: nothing. Saves: the weights and the
// optimizer state as this rank holds them (whole, or its parts).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "checkpoint/tensor_file.h"
#include "config/schema.h"
#include "distributed/communicator.h"
#include "model/transformer.h"
#include "optim/optimizer.h"
#include "optim/precision.h"

namespace keel::train {

using NamedParams = std::vector<std::pair<std::string, torch::Tensor>>;

class ParallelPlan {
 public:
  virtual ~ParallelPlan() = default;

  optim::Optimizer& optimizer() { return *optimizer_; }
  const optim::Optimizer& optimizer() const { return *optimizer_; }

  // ---- the step
  // Before micro-step `micro` (of `micro_steps`) runs backward: arms the reduction that backward
  // pass starts, if any. `fault_after_backward`: a fault will change this step's gradients after
  // the backward pass, so the last micro-step's reduction must not start inside it.
  virtual void arm(int64_t micro, int64_t micro_steps, bool fault_after_backward) = 0;
  // After micro-step `micro`'s backward pass: finishes the reduction it started where it must
  // end there (the last one's ends in reduce(), after the fault hook, unless every one's ends
  // in its own micro-step).
  virtual void after_backward(int64_t micro, int64_t micro_steps) = 0;
  // The tensors whose .grad a fault after the backward pass changes: this rank's gradients,
  // reduced already (ZeRO-3) or not yet.
  virtual const std::vector<torch::Tensor>& gradients_after_backward() = 0;
  // The step's gradients averaged over the ranks: whatever the backward passes did not do.
  virtual void reduce() = 0;
  // This rank's own gradients of the step, before any reduction: the sum of their squares (()
  // fp64 on the device), valid after reduce(). Healthy ranks that compute the step again get it
  // again; a replay (train/replay.h) compares it rank by rank to name a device that computed wrong.
  const torch::Tensor& local_square() const { return local_square_; }
  // The tensors whose .grad hold this rank's reduced gradients: what unscaling and clipping act
  // on.
  virtual const std::vector<torch::Tensor>& gradients() = 0;
  // (P) per-parameter gradient norms over every rank's part; an fp16 overflow flag made the same
  // on every rank.
  virtual torch::Tensor param_grad_norms() = 0;
  virtual torch::Tensor agree_overflow(const torch::Tensor& found_inf) { return found_inf; }
  // The weights this rank updates, and (P) per-parameter norms of tensors shaped like them (their
  // differences for the update ratio), over every rank's part.
  virtual const std::vector<torch::Tensor>& updated_weights() = 0;
  virtual torch::Tensor param_norms(const std::vector<torch::Tensor>& like_weights) = 0;

  // ---- replicas
  // What this rank holds that every rank holds the same (the weights, replicated or under
  // ZeRO-1/2, and a replicated optimizer state): each tensor's fp64 sum and L2 norm, (2k) fp64 on
  // the device. Undefined where nothing is replicated (one process, ZeRO-3).
  virtual torch::Tensor replica_fingerprint() const { return {}; }

  // ---- checkpoints
  // The weights as this rank holds them: whole by name, or its parts by name and position
  // (checkpoint/weight_parts.h).
  virtual checkpoint::TensorMap weights() const = 0;
  virtual bool weights_in_parts() const { return false; }
  // Whether `weights` hold every element this rank loads (its own parts, or whole tensors).
  virtual bool weights_covered_by(const checkpoint::TensorMap& weights) const = 0;
  virtual void load_weights(const checkpoint::TensorMap& weights) = 0;
  // Whether `state` (an optimizer state, possibly one rank's part) covers what this rank holds.
  virtual bool optimizer_state_covered_by(const checkpoint::TensorMap& state) const = 0;
  virtual void load_optimizer_state(const checkpoint::TensorMap& state) = 0;

 protected:
  std::unique_ptr<optim::Optimizer> optimizer_;
  torch::Tensor local_square_;  // set by reduce()
};

// Builds the plan `cfg.distributed` and the number of ranks call for, the model's parameters in
// `named` (ZeRO-3: deferred, each unit given its values by `initial_values` as it is sharded).
std::unique_ptr<ParallelPlan> make_parallel_plan(
    const config::Config& cfg, distributed::Communicator& comm, model::Transformer& model,
    const NamedParams& named, optim::Precision precision, torch::Device device,
    const std::function<void(const std::string&, torch::Tensor&)>& initial_values);

// Whether the plan for `cfg` on these ranks shards the weights (the model is then built deferred).
bool shards_weights(const config::Config& cfg, const distributed::Communicator& comm);

}  // namespace keel::train
