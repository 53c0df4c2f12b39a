#include "monitor/step_profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/error.h"

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define KEEL_HAS_NVTX 1
#endif

namespace keel::monitor {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> out{ActivityType::CPU};
  if (cuda) out.insert(ActivityType::CUDA);
  return out;
}

}  // namespace

StepProfiler::StepProfiler(int64_t steps, int64_t skip, std::string dir, int rank, bool cuda)
    : steps_(steps), skip_(skip), dir_(std::move(dir)), rank_(rank), cuda_(cuda) {
  // On a CPU run Kineto still asks CUDA for its devices and logs "gpuGetDeviceCount failed with
  // code 35" (no driver) once per rank, a false alarm for a profile that needs no GPU: its log
  // is kept to fatal errors there, unless the user set KINETO_LOG_LEVEL.
  if (!cuda_) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  // Kineto's start-up (CUPTI on a GPU) happens here, outside the steps it records.
  profiler::prepareProfiler(ProfilerConfig(ProfilerState::KINETO), activities(cuda_));
}

StepProfiler::~StepProfiler() {
  if (recording_) profiler::disableProfiler();
}

void StepProfiler::before(int64_t next_step) {
  if (taken_ != skip_ || recording_ || steps_ <= 0) return;
  profiler::enableProfiler(ProfilerConfig(ProfilerState::KINETO, /*report_input_shapes=*/true),
                           activities(cuda_),
                           {at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE});
  recording_ = true;
  first_step_ = next_step;
}

std::string StepProfiler::after(int64_t step, bool last) {
  ++taken_;
  if (!recording_ || (taken_ < skip_ + steps_ && !last)) return "";
  recording_ = false;
  const std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  const std::string path = dir_ + "/rank" + std::to_string(rank_) + "_steps_" +
                           std::to_string(first_step_) + "-" + std::to_string(step) + ".json";
  try {
    result->save(path);
  } catch (const std::exception& e) {
    throw RecordError(path + ": the profile could not be written (" + e.what() + ")");
  }
  return path;
}

StageRange::StageRange(const char* name) : record_(at::RecordScope::USER_SCOPE) {
  if (record_.isActive()) record_.before(name, c10::ArrayRef<const c10::IValue>{});
#ifdef KEEL_HAS_NVTX
  nvtxRangePushA(name);
#endif
}

StageRange::~StageRange() {
#ifdef KEEL_HAS_NVTX
  nvtxRangePop();
#endif
}

}  // namespace keel::monitor
