// A fixed-size ring of the last N values of a per-step scalar (grad norm, loss), kept on the
// training device so that recording a value never synchronises with the host. Statistics are read
// at log steps, when the host synchronises anyway.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace keel::monitor {

class DeviceWindow {
 public:
  DeviceWindow(int64_t capacity, torch::Device device);
  void push(const torch::Tensor& value);  // () tensor on the device; no host sync
  int64_t size() const { return std::min(count_, capacity_); }
  // Median of the values held (lower median for even counts, as torch.median); NaN when empty.
  double median() const;
  torch::Tensor values() const;  // (size) fp32, oldest first

 private:
  int64_t capacity_;
  int64_t count_ = 0;
  torch::Tensor ring_;  // (capacity) fp32
};

}  // namespace keel::monitor
