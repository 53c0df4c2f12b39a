// Gradient all-reduce that overlaps the backward pass, as DDP's reducer does: the parameters are
// cut into flat buckets of about `bucket_mb` in reverse order (the order autograd finishes them),
// a hook after each parameter's gradient accumulation marks it ready, and a bucket whose
// gradients are all ready starts its all-reduce at once while autograd goes on with the layers
// below. Buckets start strictly in index order, so every rank issues the same collectives in the
// same order whatever its autograd thread does.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/local_square.h"
#include "distributed/shard_owner.h"

namespace keel::distributed {

// Sharded (ZeRO-1): each bucket is reduce-scattered instead of all-reduced. Rank r of W receives
// the mean of part r of every bucket (ceil(n/W) elements of its flat buffer) and owns those
// elements: it updates them, and all_gather_params() gives every rank the others' parts. The
// parameters' own .grad then keep this rank's unreduced gradients; shard(b) holds the mean.
//
// Sharded gradients (ZeRO-2, `release_grads`): no whole gradient outlives its bucket. A bucket's
// flat buffer exists only while it is being reduced, the parameters' .grad are released as soon
// as they are copied into it, and every micro-step of gradient accumulation is reduced (arm it
// for each backward pass), its mean added into shard(b). Per rank the gradients then take
// 2/world of the weights' bytes (shard and an incoming part) plus the buckets in flight.
class GradReducer final : public ShardOwner {
 public:
  // `params` are the trainable parameters (leaves); their hooks stay until the reducer goes.
  GradReducer(Communicator& comm, std::vector<torch::Tensor> params, double bucket_mb,
              bool sharded = false, bool release_grads = false);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass reduces: the step's last without release_grads (ZeRO-0/1: only the
  // final micro-step of gradient accumulation communicates), every one with it (ZeRO-2). Buckets
  // start as they fill, unless `start_in_backward` is false (then all start in finish(), after
  // whatever changes the gradients after the backward pass).
  // `accumulate` (releasing gradients): add this backward pass's mean into shard(b), not replace
  // it: every micro-step of a step but its first, under release_grads.
  void arm(bool start_in_backward = true, bool accumulate = false);
  bool armed() const { return armed_; }
  // Starts every bucket not yet started (a parameter without a gradient this step counts as
  // zeros), waits for all of them and writes the mean over ranks back into each .grad (sharded:
  // into shard(b)). Disarms.
  void finish();

  bool sharded() const { return sharded_; }
  bool releases_grads() const { return release_grads_; }
  // Sharded: the elements this rank owns, as pieces of parameters (OwnedPiece::part is the
  // bucket): its part of every bucket.
  const std::vector<OwnedPiece>& owned_pieces() const override { return owned_; }
  torch::Tensor reduced_grad(const OwnedPiece& piece) const override;
  torch::Tensor owned_weights(const OwnedPiece& piece) const override;
  void publish_update() override { all_gather_params(); }
  int zero_level() const override { return release_grads_ ? 2 : 1; }
  const torch::Tensor& shard(int64_t bucket) const { return buckets_[bucket].shard; }
  // Sharded: every rank's owned elements of the parameters (as they are now) to every rank, one
  // all-gather per bucket.
  void all_gather_params();

  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // This rank's own gradients as they went into the buckets since the step began (begin_step()).
  void begin_step() { local_.reset(); }
  const LocalSquare& local_square() const { return local_; }
  // Buckets started from the backward pass's hooks (not by finish) at the last finish: how much
  // of the communication had a chance to overlap.
  int64_t started_in_backward() const { return started_in_backward_; }

 private:
  struct Bucket {
    std::vector<int64_t> params;  // indices into params_
    std::vector<int64_t> offsets;
    torch::Tensor flat;      // sharded: padded to world x part
    torch::Tensor shard;     // sharded: this rank's part of the mean, `part` elements
    torch::Tensor incoming;  // accumulating: this backward pass's part, added into `shard`
    int64_t numel = 0;       // of the parameters, without padding
    int64_t part = 0;
    int64_t pending = 0;  // gradients not yet ready in this backward
    std::unique_ptr<PendingWork> work;
  };
  class Hook;

  static constexpr size_t kBucketsInFlight = 2;  // releasing gradients
  void on_ready(int64_t param);
  // Sharded: waits for the bucket's reduction and puts its mean into shard(b) (added when
  // accumulating); releasing gradients, drops its flat buffer. Nothing when it is not in flight.
  void complete(Bucket& b);
  void start(Bucket& bucket);
  void start_ready_buckets();  // in index order, from next_
  void abandon();              // wait out what is in flight and reset the step's state
  std::vector<OwnedPiece> find_owned_pieces() const;

  Communicator& comm_;
  std::vector<torch::Tensor> params_;
  std::vector<int64_t> bucket_of_;  // per parameter
  std::vector<Bucket> buckets_;
  std::vector<OwnedPiece>
      owned_;  // sharded: what this rank owns (fixed by the buckets and the rank)
  std::vector<bool> ready_;
  std::mutex mutex_;  // the hooks run on autograd's threads
  bool sharded_ = false;
  bool release_grads_ = false;
  bool accumulate_ = false;
  bool armed_ = false;
  bool start_in_backward_ = true;
  size_t next_ = 0;  // the first bucket not yet started
  int64_t started_in_backward_ = 0;
  LocalSquare local_;  // guarded by mutex_: the backward pass's hooks add to it
};

}  // namespace keel::distributed
