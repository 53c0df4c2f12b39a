#include "train/layer_groups.h"

#include <algorithm>

namespace keel::train {
namespace {

std::string group_of(const std::string& name) {
  if (name.rfind("layers.", 0) == 0) {
    auto dot = name.find('.', 7);
    return name.substr(0, dot);
  }
  if (name.find("emb") != std::string::npos) return "embedding";
  return "head";
}

}  // namespace

LayerGroups::LayerGroups(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                         torch::Device device) {
  std::vector<int64_t> index;
  for (const auto& [name, _] : named) {
    std::string g = group_of(name);
    auto it = std::find(names_.begin(), names_.end(), g);
    if (it == names_.end()) it = names_.insert(names_.end(), g);
    index.push_back(it - names_.begin());
  }
  index_ = torch::tensor(index, torch::kInt64).to(device);
}

torch::Tensor LayerGroups::reduce(const torch::Tensor& per_param_norms) const {
  auto squares = per_param_norms.to(torch::kFloat32).square();
  auto sums = torch::zeros({static_cast<int64_t>(names_.size())}, squares.options());
  return sums.index_add_(0, index_, squares).sqrt();
}

}  // namespace keel::train
