// ZeRO stage 3 (Rajbhandari et al., "ZeRO", 2020; PyTorch FSDP, Zhao et al., 2023): the weights
// themselves sharded across the ranks, unit by unit (model/unit_gate.h: the embedding, each
// transformer block, the final norm with the head).
//
// Each unit's parameters are views of one flat buffer, in the compute dtype (bf16 or fp16 under
// autocast, so that autocast makes no copies of its own), whose memory exists only while the
// unit computes. Before the unit runs, every rank's part is all-gathered into it (the next unit's
// gather already in flight, overlapping this unit's compute); after it the memory is released.
// The parameters keep their shapes, and the tensors autograd saved keep pointing at the buffer,
// which is gathered again before the unit's backward pass (a hook on the gradient of the unit's
// output). Once every parameter of the unit has its gradient, the unit's gradients are
// reduce-scattered (in distributed.reduce_dtype; summed, then divided by the world size) into
// this rank's fp32 part, and released; at most two units are in flight. Every micro-step of
// gradient accumulation is reduced, its mean added to the part. The head unit stays gathered from
// its forward to its backward pass (the loss needs it at once). The optimizer (ZeroOptimizer)
// steps this rank's fp32 part, the one place the weights live between forward passes.
//
// Per rank: weights, gradients and AdamW's moments take 1/world of the model's fp32 bytes each,
// plus the units gathered at once (the one computing, the next one, the head unit; in the compute
// dtype) and the gradients of the units in flight.
//
// Every rank issues the same collectives in the same order: the forward and backward passes of
// one model visit the units in the same order on every rank.
#pragma once

#include <torch/torch.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "config/schema.h"
#include "distributed/communicator.h"
#include "distributed/local_square.h"
#include "distributed/shard_owner.h"
#include "model/unit_gate.h"

namespace keel::distributed {

class ShardedParameters final : public model::UnitGate, public ShardOwner {
 public:
  // The values a unit's deferred parameters start from (model/layers.h): `value` is an fp32 CPU
  // tensor of parameter `name`'s shape, to fill (the model's initialization, or weights read
  // from a file). Called unit by unit, in unit order, one unit's parameters at a time.
  using InitialValues = std::function<void(const std::string& name, torch::Tensor& value)>;

  // `named_params`: the model's parameters (fp32, contiguous, the same values on every rank), in
  // the trainer's order; every one of them in exactly one of `units`. Each is either on `device`
  // with its values, or deferred, holding no memory: then `initial_values` gives it values, one
  // unit at a time, so that no rank holds more of the model whole than its largest unit. From
  // here on the parameters are views of their unit's buffer on `device`, which holds no memory
  // until a unit runs, in `compute_type` (fp32, or the autocast dtype: the master weights stay
  // fp32 in the parts).
  ShardedParameters(Communicator& comm,
                    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
                    const model::ParameterUnits& units, config::ReduceDtype reduce_dtype,
                    torch::ScalarType compute_type, torch::Device device,
                    const InitialValues& initial_values = {});
  ~ShardedParameters() override;
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  void enter(int64_t unit) override;
  torch::Tensor leave(int64_t unit, const torch::Tensor& output) override;

  // The gradient reduction of the next backward pass, as GradReducer's: units are reduced as
  // their gradients complete; `accumulate`: added to this step's earlier micro-steps.
  void arm(bool accumulate);
  bool armed() const { return armed_; }
  // Reduces every unit not yet reduced (a parameter without a gradient counts as zeros), waits
  // for the reductions and releases every gathered unit. Disarms.
  void finish();
  // Waits out what is in flight and releases every gathered unit: after a forward pass that no
  // backward pass followed.
  void release_all();

  const std::vector<OwnedPiece>& owned_pieces() const override { return owned_; }
  torch::Tensor reduced_grad(const OwnedPiece& piece) const override;
  torch::Tensor owned_weights(const OwnedPiece& piece) const override;
  void publish_update() override {}  // the next forward pass gathers the updated parts
  int zero_level() const override { return 3; }

  const std::string& name_of(int64_t param) const { return names_[param]; }
  const std::vector<int64_t>& shape_of(int64_t param) const { return shapes_[param]; }

  int64_t units() const { return static_cast<int64_t>(units_.size()); }
  // Units whose buffer holds memory now, and the most at once since construction.
  int64_t gathered_units() const;
  int64_t peak_gathered_units() const { return peak_gathered_; }
  // Units whose gradients were reduced from the backward pass's hooks at the last finish.
  int64_t reduced_in_backward() const { return reduced_in_backward_; }
  // This rank's own gradients as they went into the reductions since the step began.
  void begin_step() { local_.reset(); }
  const LocalSquare& local_square() const { return local_; }

 private:
  struct Unit {
    std::vector<int64_t> params;   // indices into params_
    std::vector<int64_t> offsets;  // of each in `flat`
    int64_t numel = 0, part = 0;   // part: ceil(numel / world)
    torch::Tensor flat;            // world x part, compute dtype; memory only while gathered
    torch::Tensor gather_input;    // the shard in the compute dtype, while a gather is in flight
    torch::Tensor shard;           // part fp32: this rank's weights
    torch::Tensor grad_shard;      // part fp32: this rank's reduced gradient
    torch::Tensor grad_flat, incoming;  // in reduce_dtype, while a reduction is in flight
    std::unique_ptr<PendingWork> gathering, reducing;
    bool gathered = false;
    bool read_in_backward = true;  // an embedding's backward pass needs its indices only
    bool reduced = false;          // in this backward pass
    int64_t pending = 0;           // gradients not yet ready in this backward pass
  };
  class GradHook;

  static constexpr size_t kUnitsInFlight = 2;
  void gather(Unit& u);  // starts it (memory allocated); nothing when gathered
  void wait_gathered(Unit& u);
  void release(Unit& u);
  void before_backward(int64_t unit);
  void on_grad_ready(int64_t param);
  void reduce(Unit& u);     // starts the reduce-scatter of its gradients and releases them
  void complete(Unit& u);   // waits for it and puts the mean into grad_shard
  void reset_reduction();   // waits out reductions in flight; the step's reduction state anew
  void release_gathered();  // waits out gathers in flight; every unit's memory released
  int64_t last_block() const;
  int64_t next_in_forward(int64_t unit) const;
  int64_t next_in_backward(int64_t unit) const;
  void note_gathered();

  Communicator& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<int64_t> unit_of_;  // per parameter
  std::vector<Unit> units_;
  int64_t head_ = 0;
  int64_t entered_ = -1;  // the unit the forward pass entered last
  std::vector<OwnedPiece> owned_;
  std::vector<bool> ready_;
  std::deque<int64_t> in_flight_;  // units being reduced, oldest first
  torch::ScalarType reduce_type_ = torch::kFloat;
  LocalSquare local_;  // guarded by mutex_: the backward pass's hooks add to it
  torch::ScalarType compute_type_ = torch::kFloat;
  std::mutex mutex_;  // the hooks run on autograd's threads
  bool armed_ = false;
  bool accumulate_ = false;
  int64_t reduced_in_backward_ = 0;
  int64_t peak_gathered_ = 0;
};

}  // namespace keel::distributed
