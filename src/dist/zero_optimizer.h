// ZeRO stage 1 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", 2020): the optimizer state sharded across ranks. Each rank keeps the AdamW (or Lion)
// moments of one contiguous part of the parameters' flat order, updates only that part of the
// weights, and an all-gather gives every rank the whole updated model. The moments, 2x the fp32
// weights for AdamW, shrink to 1/world per rank; the weights and gradients stay whole on every
// rank, so the guard's per-layer gradient norms, clipping and update ratios are unchanged.
//
// The flat order (every trainable parameter in model order, flattened and concatenated) does not
// depend on the world size, and a shard's state is saved as flat tensors with its range: a
// checkpoint written at one world size loads at another (and at zero: 1 on one rank).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/schema.h"
#include "dist/communicator.h"
#include "optim/optimizer.h"

namespace keel::dist {

// The part [begin, end) of a flat order of `numel` elements that rank `rank` of `world` owns:
// consecutive parts of ceil(numel / world) elements, the last ones shorter (or empty).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange shard_range(int64_t numel, int rank, int world);

// The optimizer `cfg` asks for, over this rank's shard of `named_params` (the model's trainable
// parameters, fp32, on one device). Its state_dict holds "zero.range" (int64 [begin, end, numel])
// and one flat tensor per kind of per-parameter state ("zero.exp_avg", ...) besides the inner
// optimizer's per-group entries. load_state_dict takes that form (this rank's own shard), or the
// shards of every rank of a checkpoint, keyed "rank{r}/..." (load_checkpoint gives that when the
// world size changed), and takes from them the range this rank owns now.
std::unique_ptr<optim::Optimizer> make_zero_optimizer(
    const std::vector<std::pair<std::string, torch::Tensor>>& named_params,
    const config::OptimConfig& cfg, Communicator& comm);

// True when `optimizer_state` (an Optimizer::state_dict, or load_checkpoint's shards) is ZeRO's.
bool is_sharded_state(const std::map<std::string, torch::Tensor>& optimizer_state);

}  // namespace keel::dist
