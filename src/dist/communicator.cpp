#include "dist/communicator.h"

namespace keel::dist {

void Communicator::all_reduce_mean_(std::vector<torch::Tensor>& tensors) {
  if (world_size() == 1) return;
  all_reduce_sum_(tensors);
  torch::_foreach_div_(tensors, static_cast<double>(world_size()));
}

}  // namespace keel::dist
