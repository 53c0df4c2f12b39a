#include "monitor/device_window.h"

#include <limits>

namespace keel::monitor {

DeviceWindow::DeviceWindow(int64_t capacity, torch::Device device)
    : capacity_(std::max<int64_t>(capacity, 1)),
      ring_(torch::zeros({capacity_},
                         torch::TensorOptions().dtype(torch::kFloat32).device(device))) {}

void DeviceWindow::push(const torch::Tensor& value) {
  ring_.narrow(0, count_ % capacity_, 1).copy_(value.detach().reshape({1}), /*non_blocking=*/true);
  ++count_;
}

torch::Tensor DeviceWindow::values() const {
  if (count_ <= capacity_) return ring_.narrow(0, 0, count_);
  int64_t head = count_ % capacity_;
  return torch::cat({ring_.narrow(0, head, capacity_ - head), ring_.narrow(0, 0, head)});
}

double DeviceWindow::median() const {
  if (count_ == 0) return std::numeric_limits<double>::quiet_NaN();
  return values().median().item<double>();
}

}  // namespace keel::monitor
