// The host's copy of a step's values, queued without waiting. On a GPU the copies go to pinned
// host memory on the current stream, and wait() blocks until they are done, not until the work
// queued after them is (the step's update): the host reads the step while the device updates.
// On the CPU a copy is done when it is queued.
//
// Owns: the host copies and the event that marks them done. Called by: host_read.cpp (HostRead:
// the step's figures) and trainer.cpp (StopAgreement: the stop signal the ranks agreed on, read
// one step later). Writes: nothing. Saves: nothing (it lives for one step).
#pragma once

#include <optional>
#include <vector>

#include <c10/core/Event.h>
#include <torch/torch.h>

namespace keel::train {

class StepRead {
 public:
  StepRead() = default;
  // Queues the copy of `values` and returns its index for host().
  size_t add(const torch::Tensor& values);
  // Marks where the copies end in the stream: call after the last add(), before queueing more.
  void queued();
  // Blocks until the copies are on the host.
  void wait();
  const torch::Tensor& host(size_t i) const { return host_.at(i); }

 private:
  std::vector<torch::Tensor> host_;
  std::optional<c10::Device> device_;  // of the copies still to be marked (GPU only)
  std::optional<c10::Event> done_;
};

}  // namespace keel::train
