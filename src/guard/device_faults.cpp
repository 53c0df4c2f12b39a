// The guard's count of devices that computed wrong (a replay's finding, or replicas that
// disagree): a persistent fault, or a rank's second within kDeviceFaultWindow attempts, stops the
// run as a faulty device.
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "guard/guard.h"

namespace keel::guard {

Decision Guard::device_fault(int64_t iteration, const std::vector<int64_t>& ranks, bool persistent,
                             nlohmann::json detail, const std::string& what) {
  Decision d;
  detail["ranks"] = ranks;
  detail["persistent"] = persistent;
  d.events.push_back({EventKind::kHardwareFault, detail, what});
  count_device_fault(
      iteration, ranks, persistent, detail,
      fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", ")), d);
  return d;
}

void Guard::count_device_fault(int64_t iteration, const std::vector<int64_t>& ranks,
                               bool persistent, const nlohmann::json& detail,
                               const std::string& who, Decision& d) {
  while (!device_faults_.empty() && iteration - device_faults_.front().first >= kDeviceFaultWindow)
    device_faults_.pop_front();
  for (int64_t r : ranks) device_faults_.emplace_back(iteration, r);
  std::vector<int64_t> faulty;
  for (int64_t r : ranks) {
    const auto n = std::count_if(device_faults_.begin(), device_faults_.end(),
                                 [&](const auto& f) { return f.second == r; });
    if (persistent || n >= kDeviceFaultsToStop) faulty.push_back(r);
  }
  d.events.back().detail.update(
      {{"recent", device_faults_.size()}, {"window", kDeviceFaultWindow}});
  if (faulty.empty()) return;
  const std::string why =
      persistent ? "computes the step wrong every time, and the same data computes right on "
                   "another rank"
                 : fmt::format("computed a wrong result {} times within {} attempts",
                               kDeviceFaultsToStop, kDeviceFaultWindow);
  abort("faulty_device", fmt::format("a faulty device: {} {}", who, why), detail, d);
  d.faulty_ranks = faulty;
  // The job starts again without these devices: their rank numbers go to sound ones, which must
  // not inherit the count (the checkpoint the stop saves holds this state).
  std::erase_if(device_faults_, [&](const auto& f) {
    return std::find(faulty.begin(), faulty.end(), f.second) != faulty.end();
  });
}

}  // namespace keel::guard
