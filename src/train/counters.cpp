#include "train/counters.h"

#include "common/error.h"

namespace keel::train {
namespace {

int64_t counter(const nlohmann::json& state, const char* key) {
  auto it = state.find(key);
  if (it == state.end() || !it->is_number_integer())
    throw CheckpointError(std::string("trainer_state.json: counter '") + key +
                          "' is missing or not an integer");
  return it->get<int64_t>();
}

}  // namespace

void TrainCounters::to_json(nlohmann::json& state, int64_t micro_batch_size, int64_t world_size,
                            int64_t seq_len) const {
  state["step"] = step;
  state["iteration"] = iteration;
  state["micro_taken"] = micro_taken;
  state["quarantined_micro"] = quarantined_micro;
  state["last_eval_step"] = last_eval_step;
  state["micro_batch_size"] = micro_batch_size;
  state["world_size"] = world_size;
  state["samples_seen"] = samples_seen(micro_batch_size, world_size);
  state["tokens_seen"] = samples_seen(micro_batch_size, world_size) * seq_len;
}

TrainCounters TrainCounters::from_json(const nlohmann::json& state, int64_t micro_batch_size,
                                       int64_t world_size) {
  TrainCounters c;
  c.step = counter(state, "step");
  c.iteration = counter(state, "iteration");
  c.micro_taken = counter(state, "micro_taken");
  c.quarantined_micro = counter(state, "quarantined_micro");
  c.last_eval_step = counter(state, "last_eval_step");
  if (!state.contains("micro_batch_size") || !state.contains("world_size")) return c;
  const int64_t saved = counter(state, "micro_batch_size") * counter(state, "world_size");
  const int64_t now = micro_batch_size * world_size;
  if (saved == now) return c;
  // Samples per global micro-batch changed: the same samples, counted in the new unit.
  for (int64_t* micro : {&c.micro_taken, &c.quarantined_micro}) {
    if (*micro * saved % now != 0)
      throw CheckpointError(
          "trainer_state.json: written with " + std::to_string(saved) +
          " samples per micro-batch over all ranks, after " + std::to_string(*micro * saved) +
          " samples, which is not a whole number of this run's micro-batches of " +
          std::to_string(now) + " (micro_batch_size x world size)");
    *micro = *micro * saved / now;
  }
  return c;
}

}  // namespace keel::train
