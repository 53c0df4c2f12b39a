// What a rank owns under ZeRO: pieces of parameters, each with its reduced gradient and the
// weights the optimizer updates. ZeRO-1/2 own pieces of the gradient buckets (GradReducer) and
// update the model's own weights; ZeRO-3 owns pieces of each unit's flat weights
// (ShardedParameters) and updates its fp32 shard, the only place those weights live between
// forward passes. ZeroOptimizer steps either.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace keel::distributed {

// Elements [begin, end) of parameter `param` (flattened) are elements [offset, offset + end -
// begin) of the owner's flat part number `part` (a bucket, or a unit).
struct OwnedPiece {
  int64_t param = 0, begin = 0, end = 0;
  int64_t part = 0, offset = 0;
  int64_t numel() const { return end - begin; }
};

class ShardOwner {
 public:
  virtual ~ShardOwner() = default;
  virtual const std::vector<OwnedPiece>& owned_pieces() const = 0;
  // The mean over ranks of the piece's gradient (valid after the step's reduction finished).
  virtual torch::Tensor reduced_grad(const OwnedPiece& piece) const = 0;
  // The fp32 weights of the piece, a view the optimizer updates in place.
  virtual torch::Tensor owned_weights(const OwnedPiece& piece) const = 0;
  // After the optimizer updated the pieces: what makes every rank see the new weights.
  virtual void publish_update() = 0;
  // ZeRO level this owner implements (1, 2 or 3), for what the optimizer reports.
  virtual int zero_level() const = 0;
};

}  // namespace keel::distributed
