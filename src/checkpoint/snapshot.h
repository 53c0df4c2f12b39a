// Internal to src/checkpoint: deep CPU copies of checkpoint tensors (held_snapshots.cpp), for an
// async save's writer and the stable snapshot held in memory.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

namespace keel::checkpoint::internal {

// A deep CPU copy of `in`, taken on the caller's thread, so training may modify the originals.
std::map<std::string, torch::Tensor> snapshot(const std::map<std::string, torch::Tensor>& in);

}  // namespace keel::checkpoint::internal
