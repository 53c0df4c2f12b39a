// Rehearsable accidents (config `faults:`; refused in production configs). Each fault is keyed so
// that the guard's remedies act on it the way they act on the real thing:
//   corrupt_batch  the data itself is bad: the micro-batches that a clean run would train on in
//                  optimizer steps [at_step, at_step+steps) (positions in the data order). Skipping
//                  that data (rollback.skip_data) really avoids it.
//   splice_data    the same positions, but their windows are replaced by real text: consecutive
//                  windows of the dataset at `path` (prepared by `keel prepare`, so whatever its
//                  filters let through), as if a stretch of junk documents sat in the data order.
//   repeat_data    the same region, but every `period` steps its first micro-batch is the one it
//                  held at at_step: a small set of documents coming back on a schedule (under the
//                  ids of the positions they displace), as a shard listed twice would. The set is
//                  this process's: a resumed run takes a new one at its next repeat.
//   grad_growth    the fp16 gradients grow geometrically over [at_step, at_step+steps) to
//                  `factor` times their size, as growing activations would make them: the scaled
//                  loss is multiplied and the unscaled gradients divided by the same amount, so the
//                  update is unchanged and only the loss scale has to give way.
//   corrupt_grad   this rank's gradient comes out `factor` times too large (its objective is
//                  multiplied; the data and the per-sample losses are untouched), as a device that
//                  computes wrong would make it, in iterations [at_step, at_step+steps). Once per
//                  iteration: a replay of the step (train/replay.h) computes it right, unless the
//                  fault is `persistent` (the device is wrong every time).
//   flip_bit       after the update of iteration at_step, a mantissa bit of this rank's first
//                  weight flips (2^-7 of its value), as a memory error would: a replica that no
//                  longer holds what the others hold, which only the replicas' comparison
//                  (stability.replica_check_every) sees.
//   nan_grad, lr_spike, crash, hang, slow_rank
//                  numerical or process events keyed to the iteration counter (optimizer-step
//                  attempts, which keeps counting through rollbacks), so a rollback does not replay
//                  them. hang: the rank stays alive and stops answering (`seconds`, 0: forever).
//                  slow_rank: the rank sleeps `seconds` after each backward pass of its
//                  iterations [at_step, at_step+steps), as a slower or throttled machine would:
//                  the others wait for it, and the straggler watch names it.
//   loader_stall, drop_samples live in the data loader.
//
// Owns: this rank's faults, the spliced datasets, repeat_data's documents once taken and the
// generator corrupt_batch draws from. Called by: setup.cpp (faults_for_rank, the injector),
// trainer.cpp (corrupt in next_batch, after_backward in train_step, gradient_growth in measure),
// forward_backward.cpp (gradient_growth, gradient_corruption, touches_gradients), replay.cpp
// (after_backward of a replay) and learning_rate.cpp (lr_multiplier). Writes: nothing (it changes
// tokens and gradients in place; a crash or a hang logs a warning first). Saves: nothing: rebuilt
// at each start from the config and the run's seed, so its windows (keyed to saved counters) are
// the same, but corrupt_batch's draws start again from the seed and repeat_data takes a new set.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "config/schema.h"
#include "data/batch.h"
#include "data/shard_reader.h"

namespace keel::train {

// The faults that hit `rank` on host `host` (faults[].rank: -1 for every rank; faults[].host: empty
// for every host).
std::vector<config::FaultSpec> faults_for_rank(const std::vector<config::FaultSpec>& faults,
                                               int rank, const std::string& host);

class FaultInjector {
 public:
  FaultInjector(std::vector<config::FaultSpec> faults, int64_t grad_accum_steps, int64_t vocab_size,
                uint64_t seed);
  bool empty() const { return faults_.empty(); }

  // Corrupts `batch` in place when micro-batch `position` of this rank's data order is in a
  // corrupt_batch window. Returns true when it did.
  bool corrupt(data::Batch& batch, int64_t position);
  double lr_multiplier(int64_t iteration) const;
  // grad_growth: the factor on the scaled loss of `iteration` (1 outside the fault).
  double gradient_growth(int64_t iteration) const;
  // corrupt_grad: the factor on this rank's objective in `iteration` (1 outside the fault). A
  // `replay` of the iteration sees it only when the fault is persistent.
  double gradient_corruption(int64_t iteration, bool replay) const;
  // The step's one fault hook, after the backward pass of `iteration`: a crash kills the process
  // (SIGKILL, as an OOM killer or a node failure would); a hang stops answering; a nan_grad
  // poisons the first gradient, in a `replay` of the step too (a NaN the step's own values make
  // comes back when they are computed again; a crash or a hang has happened already).
  void after_backward(int64_t iteration, const std::vector<torch::Tensor>& params,
                      bool replay = false) const;
  // flip_bit: after the update of `iteration`, flips a bit of the first of `weights`.
  void after_update(int64_t iteration, const std::vector<torch::Tensor>& weights) const;
  // after_backward changes the gradients of `iteration` (so they must not be all-reduced before
  // it runs).
  bool touches_gradients(int64_t iteration) const;

 private:
  bool active(const config::FaultSpec& f, int64_t at) const {
    return at >= f.at_step && at < f.at_step + std::max<int64_t>(f.steps, 1);
  }
  std::vector<config::FaultSpec> faults_;
  std::vector<std::unique_ptr<data::ShardSet>> splices_;  // per fault (null unless splice_data)
  std::vector<torch::Tensor> repeat_sets_;  // per fault: repeat_data's documents, once taken
  int64_t accum_, vocab_;
  torch::Generator gen_;
};

}  // namespace keel::train
