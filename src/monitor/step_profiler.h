// Where a training step's time goes. `keel train --profile STEPS` records STEPS steps with
// LibTorch's Kineto profiler (every operator on the CPU; CUDA kernels and memcpys too on a GPU) and
// writes them as a Chrome trace (chrome://tracing, https://ui.perfetto.dev) to
// RUN_DIR/profile/rank<R>_steps_<A>-<B>.json, A and B the first and last step recorded. The trainer
// marks its stages (data, forward, backward, guard, optimizer, ...) with StageRange: a user range
// in that trace and, on every run, an NVTX range, so that Nsight Systems (`nsys profile keel train
// ...`) shows the same stages.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <memory>
#include <string>

namespace keel::monitor {

class StepProfiler {
 public:
  // Records `steps` optimizer steps of this rank after `skip` more (the first steps of a start
  // allocate and warm caches); `cuda`: the CUDA activities as well.
  StepProfiler(int64_t steps, int64_t skip, std::string dir, int rank, bool cuda);
  ~StepProfiler();  // stops a recording still running, without writing it
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around every optimizer step: before(the step about to be taken, 1-based), after(the step
  // reached; `last`: no step follows). The after() that ends the recording writes the trace and
  // returns its path ("" otherwise).
  void before(int64_t next_step);
  std::string after(int64_t step, bool last);

 private:
  int64_t steps_, skip_;
  std::string dir_;
  int rank_;
  bool cuda_;
  int64_t taken_ = 0;       // steps seen so far
  int64_t first_step_ = 0;  // of the recording
  bool recording_ = false;
};

// A named stage of a training step ("keel/forward"), for as long as the object lives.
class StageRange {
 public:
  explicit StageRange(const char* name);
  ~StageRange();
  StageRange(const StageRange&) = delete;
  StageRange& operator=(const StageRange&) = delete;

 private:
  at::RecordFunction record_;
};

}  // namespace keel::monitor
