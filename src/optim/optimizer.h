// Optimizers over parameter groups. The optimizer owns its state (fp32 moments, step counters) but
// nothing of the learning-rate schedule: the trainer passes the lr of each step.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/schema.h"

namespace keel::optim {

struct ParamGroup {
  std::vector<std::string> names;
  std::vector<torch::Tensor> params;  // fp32 master weights
  double weight_decay = 0.0;
};

// Splits named parameters into a decay group and a no-decay group: a parameter whose name contains
// one of `no_decay` patterns ("bias", "norm", "embedding" — matched against the name and its module
// kind, so "tok_emb.weight" counts as an embedding), or any 1-D parameter, gets no weight decay.
std::vector<ParamGroup> make_param_groups(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
    const config::OptimConfig& cfg);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update with learning rate `lr`. With `found_inf` (a () fp32 tensor, 1 when the gradients
  // hold inf/nan, as produced by the loss scaler) the update is skipped on the device without a
  // host synchronisation: weights and state stay bit-identical.
  virtual void step(double lr, const std::optional<torch::Tensor>& found_inf = std::nullopt) = 0;
  virtual void zero_grad();
  // Keeps the gradient tensors between steps, zeroed in place, instead of freeing them: a captured
  // backward pass (train/micro_graph.h) accumulates into the very tensors it was captured with.
  void keep_gradients(bool keep) { keep_gradients_ = keep; }

  // Fixed keys: "group{g}.param{i}.{exp_avg,exp_avg_sq,step}" etc. Loading checks every shape.
  virtual std::map<std::string, torch::Tensor> state_dict() const = 0;
  virtual void load_state_dict(const std::map<std::string, torch::Tensor>& state) = 0;
  const std::vector<ParamGroup>& groups() const { return groups_; }
  virtual std::string describe() const = 0;  // e.g. "adamw(fused)"

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  std::vector<ParamGroup> groups_;
  bool keep_gradients_ = false;
};

// adamw (fused `_fused_adamw_` when cfg.fused is auto/on and the device supports it, else a
// multi-tensor `_foreach_` implementation; the two agree to fp tolerance) or lion.
std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> groups,
                                          const config::OptimConfig& cfg);

}  // namespace keel::optim
