// The memory plan (model/memory_plan.h) against the peak the run measures: once per start, after
// its kMemoryCheckAttempts-th step attempt (by then the gradients, the optimizer state and the
// allocator's blocks exist), a `memory` event with the plan's parts, the measured peak (the
// largest over the ranks) and their ratio, and a console warning when they differ by more than
// kMemoryPlanTolerance.
//
// Measured: on CUDA, the caching allocator's peak of allocated bytes since the watch started,
// judged against the plan; on the CPU, the caching host allocator's peak of its blocks (1 MiB and
// more: small tensors are not in it), recorded but not judged (bench/memory and the unit tests
// check the plan on the CPU at shapes where every tensor is such a block); with
// run.host_allocator: system nothing is measured.
//
// Owns: the plan and whether this start has recorded. Called by: setup.cpp (built with the
// record; the measured peak starts there) and trainer.cpp (loop: due() after every step attempt,
// record() when it is due, on every rank: the peak is agreed over them). Reads allocator
// statistics. Writes: nothing itself (the trainer puts record()'s detail on record as a memory
// event). Saves: nothing: rebuilt at each start, and each start records its own.
#pragma once

#include <cstdint>
#include <optional>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "distributed/communicator.h"
#include "model/memory_plan.h"

namespace keel::train {

inline constexpr int64_t kMemoryCheckAttempts = 2;
inline constexpr double kMemoryPlanTolerance = 0.10;

class MemoryWatch {
 public:
  // Starts the measured peak from what is in use now.
  MemoryWatch(model::MemoryPlan plan, torch::Device device);

  bool due(int64_t attempts_this_start) const {
    return !done_ && attempts_this_start >= kMemoryCheckAttempts;
  }
  // The event's detail; logs a warning when the peak and the plan differ by more than the
  // tolerance where that is judged. Collective.
  nlohmann::json record(distributed::Communicator& comm);

 private:
  model::MemoryPlan plan_;
  torch::Device device_;
  bool done_ = false;
};

}  // namespace keel::train
