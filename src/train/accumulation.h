// Gradient accumulation: how many micro-batches the next step takes, and the lr factor that goes
// with it. Fixed (data.grad_accum: fixed) it is grad_accum_steps every step. Dynamic (the seed's
// §4.3, experimental) it follows the gradient norm against its median: fewer micro-batches while
// the norm runs high (more frequent, smaller updates), more while it runs low, within
// [grad_accum_min, grad_accum_max]; lr follows the effective batch by the sqrt rule of §4.2.
//
// The norm of a mean over k micro-batches falls as 1/sqrt(k) where noise dominates it, so each
// norm is compared as norm x sqrt(k / k0) (k0 = grad_accum_steps). Where the signal dominates this
// over-corrects, which pushes k back toward k0: a change of k never feeds on itself. The count
// moves by one micro-batch at a time, at most once per `hold` steps, only after warmup and outside
// a recovery. Every rank sees the same (all-reduced) norms, so every rank takes the same count.
//
// Owns: the count, the step of its newest change and the window of normalized norms. Called by:
// the step (trainer.cpp: observe() in adjust_accumulation, steps(), lr_factor();
// forward_backward.cpp and step_record.cpp: steps()), recovery.cpp (steps(), most()) and
// snapshot.cpp (state, load_state). Writes: nothing (the trainer puts each change on record as a
// grad_accum event). Saves: trainer_state.json's "grad_accum" when dynamic (the count, its newest
// change and the norms): a resume is bit-exact, and a rollback takes the snapshot's count back.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include "config/schema.h"
#include "guard/running_stats.h"

namespace keel::train {

class Accumulation {
 public:
  struct Change {
    int64_t from = 0, to = 0;
    double ratio = 0.0;  // the recent normalized norm over its median, which moved the count
  };
  // How the dynamic count decides; the defaults are the documented behaviour.
  struct Rule {
    int64_t window = 100;  // normalized norms after warmup whose median is the baseline
    int64_t recent = 10;   // the newest ones, whose median is compared with it
    int64_t hold = 20;     // steps between two changes (and before the first)
    double high = 1.25;    // recent / baseline above this: one micro-batch fewer
    double low = 0.8;      // below this: one more
  };

  Accumulation(const config::DataConfig& data, int64_t warmup_steps, Rule rule);
  explicit Accumulation(const config::DataConfig& data, int64_t warmup_steps = 0)
      : Accumulation(data, warmup_steps, Rule()) {}

  bool dynamic() const { return dynamic_; }
  int64_t steps() const { return steps_; }  // micro-batches the next step takes
  int64_t nominal() const { return nominal_; }
  int64_t most() const { return dynamic_ ? max_ : nominal_; }  // the most one step can take
  double lr_factor() const;  // sqrt(steps / nominal): 1 when fixed

  // An applied update: `step` updates done (this one included) and its global gradient norm
  // before clipping. `recovering`: the lr overlay of a rollback is on, so the count holds.
  // Returns the change of the count it made, if any.
  std::optional<Change> observe(int64_t step, double grad_norm, bool recovering);

  nlohmann::json state() const;
  // CheckpointError when the saved count lies outside this run's [grad_accum_min, grad_accum_max].
  void load_state(const nlohmann::json& state);

 private:
  bool dynamic_;
  int64_t nominal_, min_, max_, warmup_steps_;
  Rule rule_;
  int64_t steps_;
  int64_t last_change_step_;  // the step of the newest change (warmup's end before the first)
  guard::RunningWindow norms_;
};

}  // namespace keel::train
