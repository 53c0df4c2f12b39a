// The memory a training run needs on each rank, planned from the config before launch (`keel
// validate` prints it and refuses a config that does not fit the device) and recorded by `keel
// train` beside the peak it measures.
//
// What is counted, per rank, in bytes:
//   weights      fp32 master weights; ZeRO-3 keeps this rank's part
//   gathered     ZeRO-3: the units gathered at once (two blocks and the head unit, or the
//                embedding and a block), in the compute dtype
//   gradients    fp32 gradients (.grad), plus the reducer's flat buckets with several ranks;
//                ZeRO-2 keeps this rank's part and the buckets in flight only
//   optimizer    AdamW's two moments (Lion's one), fp32; ZeRO-1 and 2 keep this rank's part
//   copies       autocast's low-precision copies of the weights (bf16/fp16 runs; none under
//                ZeRO-3, which gathers the weights in the compute dtype)
//   activations  what the forward pass keeps for the backward pass, for one micro-batch: each
//                block's tensors (fewer with model.activation_checkpointing)
//   logits       the loss's fp32 tensors at their peak, at the start of the backward pass: the
//                (tokens x vocabulary) log-probabilities and two gradients of their size
//                (model.chunked_loss: one chunk's)
//   recompute    full checkpointing: one block rebuilt with its gradients, later in the pass
//   snapshot     at a logged step, the copy of the weights (this rank's part under ZeRO-3) the
//                update/weight ratios are taken against, while the optimizer steps: after the
//                backward pass, so it competes with the activations for the peak, not with them
// The figures follow the tensors keel's own kernels keep; they were checked against the measured
// peak (bench/memory, docs/benchmarks.md). Allocator fragmentation, the CUDA context and
// communication buffers are not in them: leave headroom.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "config/schema.h"

namespace keel::model {

struct MemoryPlanOptions {
  int64_t world_size = 1;
  bool cuda = true;  // the kernels differ: the CPU's fused attention keeps its probabilities
  // run.cuda_graphs captures the micro-batch (train/micro_graph.h): its activations stay reserved
  // in the graph's pool through the update.
  bool cuda_graphs = false;
};

struct MemoryPlan {
  int64_t parameters = 0;
  int64_t world_size = 1;
  int64_t tokens = 0;  // per micro-batch on this rank
  double weights = 0, gradients = 0, optimizer = 0, copies = 0, activations = 0, logits = 0;
  double gathered = 0;   // ZeRO-3
  double recompute = 0;  // full checkpointing: one block rebuilt late in the backward pass
  double snapshot = 0;   // a logged step's copy of the weights, during the optimizer step
  bool graphs = false;   // MemoryPlanOptions::cuda_graphs on CUDA
  double model_states() const { return weights + gathered + gradients + optimizer + copies; }
  // The peak comes at the start of the backward pass (every activation, the loss's tensors) or,
  // with full checkpointing, while a block is rebuilt, or during a logged step's update; under a
  // CUDA graph the pass's memory stays reserved, and the update's snapshot comes on top of it.
  double transient() const { return std::max(logits, recompute); }
  double total() const {
    const double pass = activations + transient();
    return model_states() + (graphs ? pass + snapshot : std::max(pass, snapshot));
  }
};

MemoryPlan plan_memory(const config::Config& cfg, const MemoryPlanOptions& options);

// "memory plan per rank (...): weights 1.2 GB, ..., total 9.8 GB" for `keel validate`.
std::string format_memory_plan(const MemoryPlan& plan, const config::Config& cfg);

// The host memory a rank keeps for rollbacks (checkpoint.stable.memory_mb): up to two copies of
// its checkpoint part (fp32 weights and optimizer state), the newest stable snapshot and the
// newest checkpoint, as far as the limit holds them. `limit_bytes`: the resolved limit.
double rollback_copies_bytes(const MemoryPlan& plan, double limit_bytes);
// checkpoint.stable.memory_mb in bytes; auto: a quarter of this host's physical memory shared
// among `local_ranks`.
double rollback_memory_limit(const config::Config& cfg, int local_ranks);
std::string format_rollback_memory(const MemoryPlan& plan, const config::Config& cfg,
                                   double limit_bytes);

// The cheapest change to `cfg` that makes the plan fit `budget` bytes per rank, as a sentence
// naming the keys to set; nullopt when none of the changes keel knows fits. In order: the
// chunked loss, selective then full activation checkpointing, ZeRO-1, 2 then 3 (several ranks),
// then halving the micro-batch with twice the accumulation (the global batch kept).
std::optional<std::string> cheapest_fit(const config::Config& cfg, const MemoryPlanOptions& options,
                                        double budget);

}  // namespace keel::model
