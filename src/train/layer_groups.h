// Parameters grouped by layer ("embedding", "layers.0", …, "head") so that per-layer gradient
// norms and update ratios come out of one multi-tensor norm and one index_add, not a loop of syncs.
//
// Owns: the group names and each parameter's group (an index tensor on the device). Called by:
// setup.cpp (built from the parameters; names() for the guard and forensics), verdict.cpp
// (reduce: per-layer gradient norms), trainer.cpp (reduce: update ratios, in finish_update) and
// step_record.cpp (names). Writes: nothing. Saves: nothing: rebuilt at each start.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

namespace keel::train {

class LayerGroups {
 public:
  // `named` in the optimizer's parameter order; parameters under "layers.<i>." form group
  // "layers.<i>", embeddings "embedding", everything else "head".
  LayerGroups(const std::vector<std::pair<std::string, torch::Tensor>>& named,
              torch::Device device);
  const std::vector<std::string>& names() const { return names_; }
  // (P) per-parameter L2 norms -> (G) per-group L2 norms, on the device.
  torch::Tensor reduce(const torch::Tensor& per_param_norms) const;

 private:
  std::vector<std::string> names_;
  torch::Tensor index_;  // (P) int64: group of each parameter
};

}  // namespace keel::train
