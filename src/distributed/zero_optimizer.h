// ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", 2020): the optimizer state sharded across ranks. The gradient buckets are
// reduce-scattered (GradReducer, sharded), so each rank receives the mean gradient of the elements
// it owns — part r of every bucket — keeps the AdamW (or Lion) moments of those elements only,
// updates them, and one all-gather gives every rank the whole updated model. Per rank, AdamW's
// moments (2x the fp32 weights) shrink to 1/world, and the traffic is that of an all-reduce.
//
// The saved state names its elements by parameter and position ("zero.pieces"), not by rank or
// bucket, so a checkpoint written at one world size (or bucket size) loads at another, and at
// zero: 1 on one process.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/schema.h"
#include "distributed/communicator.h"
#include "distributed/shard_owner.h"
#include "optim/optimizer.h"

namespace keel::distributed {

class ZeroOptimizer final : public optim::Optimizer {
 public:
  // `named_params`: the model's parameters (fp32, one device), in the order the trainer keeps
  // them. `owner`: what this rank owns of them and where their reduced gradients are (the sharded
  // GradReducer of ZeRO-1/2, ShardedParameters of ZeRO-3); null: one process owns everything and
  // its gradients are the parameters' own.
  ZeroOptimizer(const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
                const config::OptimConfig& cfg, Communicator& comm, ShardOwner* owner);

  // Points the owned pieces' .grad at their reduced gradients and returns the pieces (views of
  // the weights): what unscaling and clipping act on after the reduction. Until the step or
  // zero_grad, later calls return the same pieces without pointing them again.
  const std::vector<torch::Tensor>& attach_grads();
  // The norm of every parameter's whole reduced gradient, in named_params order (zero where it
  // has none): each rank's pieces' squares, summed over the ranks. Call after attach_grads().
  torch::Tensor param_grad_norms();
  // The weights this rank updates, one view per owned piece (what attach_grads gives gradients).
  const std::vector<torch::Tensor>& owned_weights() const { return views_; }
  // The norm of every parameter from per-piece tensors (of owned_weights' shapes): each rank's
  // squares summed over the ranks; zero for a parameter no rank holds a piece of.
  torch::Tensor param_norms(const std::vector<torch::Tensor>& per_piece);

  // Updates the owned pieces (with the gradients attach_grads attached, or attaches them), then
  // publishes them (ZeRO-1/2: one all-gather of every rank's pieces; ZeRO-3: the next forward
  // pass gathers them).
  void step(double lr, const std::optional<torch::Tensor>& found_inf = std::nullopt) override;
  // The model's gradients and the pieces' (a step the guard refused leaves them attached).
  void zero_grad() override;

  // "zero.pieces" (int64 [k, 3]: parameter index, first, end element), "zero.param_numel" (int64
  // per parameter), one flat tensor per kind of per-element state ("zero.exp_avg", ...) with the
  // pieces back to back, and the inner optimizer's per-group entries (step counters).
  std::map<std::string, torch::Tensor> state_dict() const override;
  // This rank's own state_dict, or the states of every rank of a checkpoint keyed "rank{r}/..."
  // (load_checkpoint gives that when the world size changed): each owned element is taken from
  // whichever saved piece holds it. A plain optimizer's state (distributed.zero: 0) loads too.
  void load_state_dict(const std::map<std::string, torch::Tensor>& state) override;
  std::string describe() const override;
  // Whether `state` (this rank's saved part, as load_checkpoint gives it at the same world size)
  // holds every element this rank owns now; false when the pieces were cut otherwise (another
  // zero level, another bucket size): every rank's parts are needed then. True for every rank's
  // parts.
  bool covered_by(const std::map<std::string, torch::Tensor>& state) const;
  // One process owning everything: the state as the plain optimizer over the same parameters
  // keeps it (its keys, the parameters' shapes).
  std::map<std::string, torch::Tensor> whole_state() const;

 private:
  struct Piece {
    int64_t param = 0, begin = 0, end = 0;  // elements [begin, end) of params_[param], flattened
    size_t group = 0, index = 0;            // its place in the inner optimizer
    OwnedPiece owned;                       // where the owner holds it
    torch::Tensor view;                     // of the weights; its .grad is set for each step
  };
  const Piece* piece_of(const std::string& key, std::string* what) const;
  void detach_grads();

  Communicator& comm_;
  ShardOwner* owner_;
  std::vector<torch::Tensor> params_;  // all of named_params
  std::vector<std::string> names_;
  config::OptimConfig cfg_;
  std::vector<Piece> pieces_;
  std::vector<torch::Tensor> views_;  // pieces_[i].view
  bool attached_ = false;
  std::unique_ptr<optim::Optimizer> inner_;
};

// True when `optimizer_state` (an Optimizer::state_dict, or load_checkpoint's parts) is ZeRO's.
bool is_sharded_state(const std::map<std::string, torch::Tensor>& optimizer_state);

// The state of the plain optimizer over `named_params` (optim::make_optimizer's, as
// distributed.zero: 0 keeps it) from a sharded state that covers every element: one process's,
// or every rank's parts keyed "rank{r}/" (load_checkpoint at another world size).
// CheckpointError when parts are missing.
std::map<std::string, torch::Tensor> unsharded_state(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
    const config::OptimConfig& cfg, const std::map<std::string, torch::Tensor>& sharded_state);

}  // namespace keel::distributed
