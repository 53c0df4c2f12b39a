#include "checkpoint/weight_parts.h"

#include <algorithm>
#include <cstdlib>

#include "checkpoint/layout.h"
#include "common/error.h"

namespace keel::checkpoint {

using torch::Tensor;

namespace {

constexpr char kSeparator = '@';
constexpr const char* kShape = "shape";

// The pieces of `param`: (first element, flat tensor), in order of position.
std::vector<std::pair<int64_t, Tensor>> pieces_of(const TensorMap& weights,
                                                  const std::string& param) {
  std::vector<std::pair<int64_t, Tensor>> out;
  const std::string prefix = param + kSeparator;
  for (auto it = weights.lower_bound(prefix);
       it != weights.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    const std::string rest = it->first.substr(prefix.size());
    if (rest == kShape) continue;
    char* end = nullptr;
    const long long first = std::strtoll(rest.c_str(), &end, 10);
    if (rest.empty() || *end != '\0' || first < 0)
      throw CheckpointError("weights: '" + it->first + "' is not <parameter>@<first element>");
    out.emplace_back(first, it->second.reshape({-1}));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace

std::string piece_key(const std::string& param, int64_t first_element) {
  return param + kSeparator + std::to_string(first_element);
}

std::string shape_key(const std::string& param) { return param + kSeparator + kShape; }

bool is_shape_key(const std::string& key) {
  const size_t at = key.rfind(kSeparator);
  return at != std::string::npos && key.compare(at + 1, std::string::npos, kShape) == 0;
}

bool parse_piece_key(const std::string& key, std::string* param, int64_t* first) {
  const size_t at = key.rfind(kSeparator);
  if (at == std::string::npos || is_shape_key(key)) return false;
  const std::string rest = key.substr(at + 1);
  char* end = nullptr;
  const long long value = std::strtoll(rest.c_str(), &end, 10);
  if (rest.empty() || *end != '\0' || value < 0)
    throw CheckpointError("weights: '" + key + "' is not <parameter>@<first element>");
  *param = key.substr(0, at);
  *first = value;
  return true;
}

bool is_weight_parts(const TensorMap& weights) {
  return std::any_of(weights.begin(), weights.end(),
                     [](const auto& kv) { return kv.first.find(kSeparator) != std::string::npos; });
}

void copy_elements(const TensorMap& weights, const std::string& param, int64_t first, Tensor dst) {
  torch::NoGradGuard no_grad;
  const int64_t n = dst.numel(), last = first + n;
  Tensor flat = dst.view({-1});
  if (const auto it = weights.find(param); it != weights.end()) {
    if (it->second.numel() < last)
      throw CheckpointError("weights of " + param + ": " + std::to_string(it->second.numel()) +
                            " elements, fewer than this model's");
    flat.copy_(it->second.reshape({-1}).narrow(0, first, n));
    return;
  }
  int64_t covered = 0;
  for (const auto& [begin, piece] : pieces_of(weights, param)) {
    const int64_t from = std::max(first, begin), to = std::min(last, begin + piece.numel());
    if (from >= to) continue;
    flat.narrow(0, from - first, to - from).copy_(piece.narrow(0, from - begin, to - from));
    covered += to - from;
  }
  if (covered != n)
    throw CheckpointError("weights of " + param + ": the saved parts cover " +
                          std::to_string(covered) + " of elements [" + std::to_string(first) +
                          ", " + std::to_string(last) +
                          ") (a rank's model file is missing, or the model changed)");
}

bool covers(const TensorMap& weights, const std::string& param, int64_t first, int64_t n) {
  if (const auto it = weights.find(param); it != weights.end())
    return it->second.numel() >= first + n;
  int64_t covered = 0;
  for (const auto& [begin, piece] : pieces_of(weights, param))
    covered +=
        std::max<int64_t>(0, std::min(first + n, begin + piece.numel()) - std::max(first, begin));
  return covered == n;
}

TensorMap whole_weights(const TensorMap& weights) {
  if (!is_weight_parts(weights)) return weights;
  TensorMap out;
  for (const auto& [key, value] : weights) {
    if (!is_shape_key(key)) continue;
    const std::string param = key.substr(0, key.rfind(kSeparator));
    const Tensor shape = value.to(torch::kCPU, torch::kInt64).contiguous();
    std::vector<int64_t> sizes(shape.data_ptr<int64_t>(),
                               shape.data_ptr<int64_t>() + shape.numel());
    Tensor whole = torch::empty(sizes, torch::kFloat);
    copy_elements(weights, param, 0, whole);
    out[param] = whole;
  }
  return out;
}

std::vector<std::string> model_files(const std::vector<std::string>& files) {
  if (std::find(files.begin(), files.end(), "model.safetensors") != files.end())
    return {"model.safetensors"};
  std::vector<std::string> out;
  for (int r = 0; std::find(files.begin(), files.end(),
                            internal::rank_file("model", r, "safetensors")) != files.end();
       ++r)
    out.push_back(internal::rank_file("model", r, "safetensors"));
  return out;
}

}  // namespace keel::checkpoint
