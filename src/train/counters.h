// The trainer's counters: the one place they live, and the one way they go to and come from a
// checkpoint's trainer_state.json (as torchtitan's TrainState). Nothing else reads them by key.
//
// Owns: step, iteration, micro_taken, quarantined_micro, last_eval_step. Called by: the step
// (trainer.cpp: took_micro_batch, applied; verdict.cpp: rejected), evaluation.cpp (evaluated),
// recovery.cpp (set_aside, catch_up_iteration; from_json of the checkpoints it moves between) and
// snapshot.cpp (to_json, from_json, rolled_back_to); read by most of src/train. Writes: nothing.
// Saves: trainer_state.json's top-level "step", "iteration", "micro_taken", "quarantined_micro"
// and "last_eval_step", with "micro_batch_size" and "world_size" (the unit of the micro-batch
// counts) and "samples_seen", "tokens_seen" (for people; not read back).
#pragma once

#include <algorithm>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace keel::train {

struct TrainCounters {
  // Updates applied in the current model lineage: a rollback moves it back.
  int64_t step = 0;
  // Step attempts (applied, skipped or rolled back); faults are keyed to it. Only moves forward.
  int64_t iteration = 0;
  // Micro-batches this rank has taken from its data order, trained on or not. Only moves forward.
  int64_t micro_taken = 0;
  // Of those, the micro-batches a rollback set aside (never trained on in this lineage).
  int64_t quarantined_micro = 0;
  // The step of the newest evaluation, so a resumed run does not evaluate the same step twice.
  int64_t last_eval_step = -1;

  // The transitions: every change of a counter is one of these.
  void took_micro_batch() { ++micro_taken; }  // from the data order, to train on
  void applied() {                            // an update was applied
    ++step;
    ++iteration;
  }
  void rejected() { ++iteration; }  // a step attempt applied nothing
  // Micro-batches set aside: `taken` already taken from the data order, `skipped` taken now
  // without training on them; all of them on record as quarantined.
  void set_aside(int64_t taken, int64_t skipped) {
    micro_taken += skipped;
    quarantined_micro += taken + skipped;
  }
  void rolled_back_to(int64_t snapshot_step) { step = snapshot_step; }  // the data moves on
  void catch_up_iteration(int64_t reached) { iteration = std::max(iteration, reached); }
  void evaluated() { last_eval_step = step; }

  // Samples (and tokens) taken from the data order by all ranks together.
  int64_t samples_seen(int64_t micro_batch_size, int64_t world_size) const {
    return micro_taken * micro_batch_size * world_size;
  }

  // Writes the counters into `state` (a trainer_state object), with samples_seen and tokens_seen
  // for people reading the file.
  void to_json(nlohmann::json& state, int64_t micro_batch_size, int64_t world_size,
               int64_t seq_len) const;
  // Reads what to_json wrote, in this run's layout: counters of micro-batches written by another
  // micro-batch size x world size (a resume at another world size) are mapped onto
  // `micro_batch_size` x `world_size` samples per micro-batch, and CheckpointError says so when
  // they do not map evenly. CheckpointError also names a missing or mistyped counter.
  static TrainCounters from_json(const nlohmann::json& state, int64_t micro_batch_size,
                                 int64_t world_size);
};

}  // namespace keel::train
