#include "distributed/communicator.h"

namespace keel::distributed {

void wait_quietly(std::unique_ptr<PendingWork>& work) {
  if (!work) return;
  try {
    work->wait();
  } catch (const std::exception&) {
    // The failed step's own error is the one that matters.
  }
  work.reset();
}

void Communicator::all_reduce_mean_(std::vector<torch::Tensor>& tensors) {
  if (world_size() == 1) return;
  all_reduce_sum_(tensors);
  torch::_foreach_div_(tensors, static_cast<double>(world_size()));
}

namespace {
struct DoneWork final : PendingWork {
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingWork> Communicator::all_reduce_sum_async_(torch::Tensor flat) {
  std::vector<torch::Tensor> one{std::move(flat)};
  all_reduce_sum_(one);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<PendingWork> Communicator::reduce_scatter_sum_async_(torch::Tensor input,
                                                                     torch::Tensor output) {
  all_reduce_sum_async_(input)->wait();
  const int64_t n = output.numel();
  output.copy_(input.narrow(0, rank() * n, n));
  return std::make_unique<DoneWork>();
}

std::unique_ptr<PendingWork> Communicator::all_gather_async_(torch::Tensor input,
                                                             torch::Tensor output) {
  output.view({-1}).copy_(all_gather(input.reshape({-1})));
  return std::make_unique<DoneWork>();
}

}  // namespace keel::distributed
