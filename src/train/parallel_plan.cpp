#include "train/parallel_plan.h"

#include "checkpoint/weight_parts.h"
#include "common/error.h"
#include "common/log.h"
#include "distributed/grad_reducer.h"
#include "distributed/sharded_parameters.h"
#include "distributed/zero_optimizer.h"
#include "optim/clip.h"

namespace keel::train {
namespace {

std::vector<torch::Tensor> tensors_of(const NamedParams& named) {
  std::vector<torch::Tensor> out;
  for (const auto& item : named) out.push_back(item.second);
  return out;
}

checkpoint::TensorMap whole_weights(const NamedParams& named) {
  checkpoint::TensorMap out;
  for (const auto& [name, p] : named) out[name] = p.detach();
  return out;
}

// Whole tensors, or a ZeRO-3 checkpoint's parts (every rank's) put together.
void load_whole_weights(const NamedParams& named, const checkpoint::TensorMap& weights) {
  torch::NoGradGuard no_grad;
  const checkpoint::TensorMap whole = checkpoint::whole_weights(weights);
  for (const auto& [name, p] : named) {
    auto it = whole.find(name);
    if (it == whole.end()) throw CheckpointError("checkpoint has no weights for " + name);
    if (it->second.sizes() != p.sizes())
      throw CheckpointError("checkpoint weight " + name + " has a different shape");
    p.copy_(it->second);
  }
}

torch::Tensor local_norms(const std::vector<torch::Tensor>& tensors) {
  return torch::stack(torch::_foreach_norm(tensors));
}

// Each tensor's fp64 sum and L2 norm, (2k) fp64: equal on ranks that hold equal tensors, and
// moved by a single flipped bit (in fp64, the change of one fp32 element is far above the
// rounding of the sum).
torch::Tensor fingerprint_of(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.is_floating_point()) continue;
    parts.push_back(t.detach().sum(torch::kFloat64).reshape({1}));
    parts.push_back(
        at::linalg_vector_norm(t.detach(), 2, c10::nullopt, false, torch::kFloat64).reshape({1}));
  }
  return torch::cat(parts);
}

// The sum of the squares of the gradients that `params` hold (() fp64).
torch::Tensor square_of_grads(const std::vector<torch::Tensor>& params) {
  distributed::LocalSquare sum;
  for (const auto& p : params)
    if (p.grad().defined()) sum.add(p.grad());
  return sum.sum().defined() ? sum.sum() : torch::zeros({}, torch::kFloat64);
}

// The plans under which every rank holds the whole weights (replicated, ZeRO-1 and 2).
class WholeWeights : public ParallelPlan {
 public:
  explicit WholeWeights(const NamedParams& named) : named_(named), params_(tensors_of(named)) {}

  const std::vector<torch::Tensor>& gradients_after_backward() override { return params_; }
  const std::vector<torch::Tensor>& updated_weights() override { return params_; }
  torch::Tensor param_norms(const std::vector<torch::Tensor>& like) override {
    return local_norms(like);
  }
  checkpoint::TensorMap weights() const override { return whole_weights(named_); }
  bool weights_covered_by(const checkpoint::TensorMap& weights) const override {
    return !checkpoint::is_weight_parts(weights);
  }
  void load_weights(const checkpoint::TensorMap& weights) override {
    load_whole_weights(named_, weights);
  }

 protected:
  NamedParams named_;
  std::vector<torch::Tensor> params_;
};

// Every rank holds everything; one process is this plan with nothing to reduce.
class Replicated final : public WholeWeights {
 public:
  Replicated(const config::Config& cfg, distributed::Communicator& comm, const NamedParams& named)
      : WholeWeights(named), cfg_(cfg), comm_(comm) {
    if (comm.is_process_group() && cfg.distributed.overlap)
      reducer_ =
          std::make_unique<distributed::GradReducer>(comm, params_, cfg.distributed.bucket_mb,
                                                     /*shard=*/false,
                                                     /*release_grads=*/false);
    optimizer_ = optim::make_optimizer(optim::make_param_groups(named, cfg.optim), cfg.optim);
  }

  // distributed.overlap: the last micro-step's buckets start as they fill in the backward pass.
  void arm(int64_t micro, int64_t micro_steps, bool fault_after_backward) override {
    if (reducer_ && micro == 0) reducer_->begin_step();
    if (reducer_ && micro == micro_steps - 1 && !fault_after_backward)
      reducer_->arm(/*start_in_backward=*/true, /*accumulate=*/micro > 0);
  }
  void after_backward(int64_t, int64_t) override {}
  void reduce() override {
    if (reducer_ && reducer_->armed()) {
      reducer_->finish();
      local_square_ = reducer_->local_square().sum();
      if (!reported_ && comm_.is_main()) {  // once: did the overlap happen?
        reported_ = true;
        log::info("dist",
                  "gradients all-reduced in {} buckets; {} of them started during the "
                  "backward pass",
                  reducer_->buckets(), reducer_->started_in_backward());
      }
      return;
    }
    local_square_ = square_of_grads(params_);
    if (!comm_.is_process_group()) return;
    std::vector<torch::Tensor> grads;
    for (auto& p : params_)
      if (p.grad().defined()) grads.push_back(p.grad());
    comm_.all_reduce_mean_(grads);
  }
  const std::vector<torch::Tensor>& gradients() override { return params_; }
  torch::Tensor param_grad_norms() override { return optim::per_param_grad_norms(params_); }

  torch::Tensor replica_fingerprint() const override {
    if (!comm_.is_process_group()) return {};
    std::vector<torch::Tensor> held = params_;
    for (const auto& [name, t] : optimizer_->state_dict())
      held.push_back(t.to(params_[0].device()));
    return fingerprint_of(held);
  }

  // A sharded state's own part covers this rank's whole state only when it is the one rank.
  bool optimizer_state_covered_by(const checkpoint::TensorMap&) const override {
    return comm_.world_size() == 1;
  }
  // Every rank needs the whole state: the parts of every rank (resume reads them all), or one
  // process's whole state.
  void load_optimizer_state(const checkpoint::TensorMap& state) override {
    if (distributed::is_sharded_state(state))
      optimizer_->load_state_dict(distributed::unsharded_state(named_, cfg_.optim, state));
    else
      optimizer_->load_state_dict(state);
  }

 private:
  const config::Config& cfg_;
  distributed::Communicator& comm_;
  std::unique_ptr<distributed::GradReducer> reducer_;  // several ranks with distributed.overlap
  bool reported_ = false;
};

// ZeRO-1 and 2: the gradient buckets reduce-scattered, whether or not they overlap the backward
// pass (ZeRO-2 in every micro-step, releasing each gradient once it is in its bucket); each rank
// updates its own elements. On one process every level keeps the whole state as ZeRO-1 does (the
// same checkpoint format), with nothing to reduce.
class ShardedOptimizer final : public WholeWeights {
 public:
  ShardedOptimizer(const config::Config& cfg, distributed::Communicator& comm,
                   const NamedParams& named)
      : WholeWeights(named), cfg_(cfg), comm_(comm) {
    if (comm.is_process_group())
      reducer_ = std::make_unique<distributed::GradReducer>(
          comm, params_, cfg.distributed.bucket_mb, /*shard=*/true,
          /*release_grads=*/cfg.distributed.zero >= 2);
    auto zero =
        std::make_unique<distributed::ZeroOptimizer>(named, cfg.optim, comm, reducer_.get());
    zero_ = zero.get();
    optimizer_ = std::move(zero);
  }

  void arm(int64_t micro, int64_t micro_steps, bool fault_after_backward) override {
    if (reducer_ && micro == 0) reducer_->begin_step();
    const bool last = micro == micro_steps - 1;
    if (!reducer_ || !(last || reducer_->releases_grads())) return;
    const bool in_backward = cfg_.distributed.overlap && !(last && fault_after_backward);
    reducer_->arm(in_backward, /*accumulate=*/micro > 0);
  }
  void after_backward(int64_t micro, int64_t micro_steps) override {
    if (reducer_ && reducer_->armed() && micro < micro_steps - 1) reducer_->finish();
  }
  void reduce() override {
    if (!reducer_) local_square_ = square_of_grads(params_);  // one process: nothing to reduce
    if (!reducer_ || !reducer_->armed()) return;
    reducer_->finish();
    local_square_ = reducer_->local_square().sum();
    if (!reported_ && comm_.is_main()) {
      reported_ = true;
      log::info("dist",
                "gradients reduce-scattered in {} buckets; {} of them started during the "
                "backward pass",
                reducer_->buckets(), reducer_->started_in_backward());
    }
  }
  const std::vector<torch::Tensor>& gradients() override { return zero_->attach_grads(); }
  torch::Tensor param_grad_norms() override { return zero_->param_grad_norms(); }
  torch::Tensor agree_overflow(const torch::Tensor& found_inf) override {
    if (!comm_.is_process_group()) return found_inf;
    std::vector<torch::Tensor> flag{found_inf};
    comm_.all_reduce_max_(flag);
    return flag[0];
  }

  bool optimizer_state_covered_by(const checkpoint::TensorMap& state) const override {
    return zero_->covered_by(state);
  }
  void load_optimizer_state(const checkpoint::TensorMap& state) override {
    optimizer_->load_state_dict(state);
  }
  // The weights alone: each rank's optimizer state is its own part.
  torch::Tensor replica_fingerprint() const override {
    return reducer_ ? fingerprint_of(params_) : torch::Tensor();
  }

 private:
  const config::Config& cfg_;
  distributed::Communicator& comm_;
  std::unique_ptr<distributed::GradReducer> reducer_;  // several ranks
  distributed::ZeroOptimizer* zero_;                   // optimizer_
  bool reported_ = false;
};

// ZeRO-3 over several ranks: the weights sharded by unit and gathered as the model runs (the
// model's unit gate); each unit's gradients reduce-scattered in every backward pass.
class ShardedModel final : public ParallelPlan {
 public:
  ShardedModel(const config::Config& cfg, distributed::Communicator& comm,
               model::Transformer& model, const NamedParams& named, optim::Precision precision,
               torch::Device device,
               const distributed::ShardedParameters::InitialValues& initial_values)
      : comm_(comm) {
    const auto compute = precision == optim::Precision::kBf16   ? torch::kBFloat16
                         : precision == optim::Precision::kFp16 ? torch::kHalf
                                                                : torch::kFloat;
    sharded_ = std::make_unique<distributed::ShardedParameters>(
        comm, named, model->parameter_units(), cfg.distributed.reduce_dtype, compute, device,
        initial_values);
    model->set_unit_gate(sharded_.get());
    model->to(device);  // the buffers; the parameters are on it already
    auto zero =
        std::make_unique<distributed::ZeroOptimizer>(named, cfg.optim, comm, sharded_.get());
    zero_ = zero.get();
    optimizer_ = std::move(zero);
  }

  // Every micro-step, in the backward pass: the ranks' collectives interleave.
  void arm(int64_t micro, int64_t, bool) override {
    if (micro == 0) sharded_->begin_step();
    sharded_->arm(/*accumulate=*/micro > 0);
  }
  void after_backward(int64_t, int64_t) override { sharded_->finish(); }
  const std::vector<torch::Tensor>& gradients_after_backward() override {
    return zero_->attach_grads();
  }
  void reduce() override {
    local_square_ = sharded_->local_square().sum();
    if (reported_ || !comm_.is_main()) return;
    reported_ = true;
    log::info("dist",
              "zero 3: {} units; {} of them reduced during the last backward pass; at most {} "
              "gathered at once",
              sharded_->units(), sharded_->reduced_in_backward(), sharded_->peak_gathered_units());
  }
  const std::vector<torch::Tensor>& gradients() override { return zero_->attach_grads(); }
  torch::Tensor param_grad_norms() override { return zero_->param_grad_norms(); }
  torch::Tensor agree_overflow(const torch::Tensor& found_inf) override {
    std::vector<torch::Tensor> flag{found_inf};
    comm_.all_reduce_max_(flag);
    return flag[0];
  }
  // This rank's parts, their norms summed over the ranks.
  const std::vector<torch::Tensor>& updated_weights() override { return zero_->owned_weights(); }
  torch::Tensor param_norms(const std::vector<torch::Tensor>& like) override {
    return zero_->param_norms(like);
  }

  checkpoint::TensorMap weights() const override {
    checkpoint::TensorMap out;
    for (const auto& piece : sharded_->owned_pieces()) {
      const std::string& name = sharded_->name_of(piece.param);
      out[checkpoint::piece_key(name, piece.begin)] = sharded_->owned_weights(piece);
      if (piece.begin == 0)
        out[checkpoint::shape_key(name)] =
            torch::tensor(sharded_->shape_of(piece.param), torch::kInt64);
    }
    return out;
  }
  bool weights_in_parts() const override { return true; }
  bool weights_covered_by(const checkpoint::TensorMap& weights) const override {
    for (const auto& piece : sharded_->owned_pieces())
      if (!checkpoint::covers(weights, sharded_->name_of(piece.param), piece.begin, piece.numel()))
        return false;
    return true;
  }
  void load_weights(const checkpoint::TensorMap& weights) override {
    torch::NoGradGuard no_grad;
    for (const auto& piece : sharded_->owned_pieces())
      checkpoint::copy_elements(weights, sharded_->name_of(piece.param), piece.begin,
                                sharded_->owned_weights(piece));
  }
  bool optimizer_state_covered_by(const checkpoint::TensorMap& state) const override {
    return zero_->covered_by(state);
  }
  void load_optimizer_state(const checkpoint::TensorMap& state) override {
    optimizer_->load_state_dict(state);
  }

 private:
  distributed::Communicator& comm_;
  std::unique_ptr<distributed::ShardedParameters> sharded_;
  distributed::ZeroOptimizer* zero_;  // optimizer_
  bool reported_ = false;
};

}  // namespace

bool shards_weights(const config::Config& cfg, const distributed::Communicator& comm) {
  return comm.is_process_group() && cfg.distributed.zero >= 3;
}

std::unique_ptr<ParallelPlan> make_parallel_plan(
    const config::Config& cfg, distributed::Communicator& comm, model::Transformer& model,
    const NamedParams& named, optim::Precision precision, torch::Device device,
    const std::function<void(const std::string&, torch::Tensor&)>& initial_values) {
  if (shards_weights(cfg, comm))
    return std::make_unique<ShardedModel>(cfg, comm, model, named, precision, device,
                                          initial_values);
  if (cfg.distributed.zero >= 1) return std::make_unique<ShardedOptimizer>(cfg, comm, named);
  return std::make_unique<Replicated>(cfg, comm, named);
}

}  // namespace keel::train
