#include "train/step_read.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace keel::train {

size_t StepRead::add(const torch::Tensor& values) {
  if (!values.is_cuda()) {
    host_.push_back(values.contiguous());
    return host_.size() - 1;
  }
  auto host =
      torch::empty(values.sizes(), values.options().device(torch::kCPU).pinned_memory(true));
  host.copy_(values, /*non_blocking=*/true);
  host_.push_back(std::move(host));
  device_ = values.device();
  return host_.size() - 1;
}

void StepRead::queued() {
  if (!device_) return;
  done_.emplace(device_->type());
  done_->record(c10::impl::VirtualGuardImpl(device_->type()).getStream(*device_));
}

void StepRead::wait() {
  if (done_) done_->synchronize();
  done_.reset();
  device_.reset();
}

}  // namespace keel::train
