#include "train/memory_watch.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cmath>

#include "common/host_allocator.h"
#include "common/log.h"

namespace keel::train {
namespace {

c10::DeviceIndex cuda_index(const torch::Device& device) {
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

std::optional<double> measured_peak(const torch::Device& device) {
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(device));
    return static_cast<double>(
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
            .peak);
  }
  if (!caching_host_allocator_installed()) return std::nullopt;
  return static_cast<double>(host_allocator_stats().peak_in_use_bytes);
}

}  // namespace

MemoryWatch::MemoryWatch(model::MemoryPlan plan, torch::Device device)
    : plan_(plan), device_(device) {
  if (device_.is_cuda())
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device_));
  else
    reset_host_peak_in_use();
}

nlohmann::json MemoryWatch::record(distributed::Communicator& comm) {
  done_ = true;
  const auto local = measured_peak(device_);
  std::vector<torch::Tensor> t{torch::tensor({local.value_or(-1.0)}, torch::kFloat64).to(device_)};
  comm.all_reduce_max_(t);
  const double peak = t[0].item<double>();
  const double total = plan_.total();
  nlohmann::json detail = {{"plan",
                            {{"weights", plan_.weights},
                             {"gathered", plan_.gathered},
                             {"gradients", plan_.gradients},
                             {"optimizer", plan_.optimizer},
                             {"copies", plan_.copies},
                             {"activations", plan_.activations},
                             {"logits", plan_.logits},
                             {"recompute", plan_.recompute},
                             {"snapshot", plan_.snapshot},
                             {"total", total}}},
                           {"measured_by", device_.is_cuda() ? "cuda_allocator"
                                           : local           ? "host_allocator_1mib_blocks"
                                                             : "none"}};
  if (peak < 0) return detail;
  const double ratio = peak / std::max(total, 1.0);
  // The host allocator leaves out blocks under 1 MiB (a mid-size model's smaller weights, their
  // gradients and moments): its figure is recorded, not judged.
  const bool judged = device_.is_cuda();
  detail["peak_bytes"] = peak;
  detail["peak_over_plan"] = ratio;
  detail["judged"] = judged;
  if (judged && std::abs(ratio - 1.0) > kMemoryPlanTolerance && comm.is_main())
    log::warn("memory",
              "the measured peak {:.2f} GB is {:.0f} % of the memory plan's {:.2f} GB per rank: "
              "the plan (keel validate) misjudges this run; leave more headroom than it says",
              peak / 1e9, ratio * 100, total / 1e9);
  return detail;
}

}  // namespace keel::train
