// The parameter-holding layers keel's model is built from. Unlike torch::nn::Linear and Embedding
// they draw no random numbers when built: the model initializes every parameter itself, in one
// order (model/transformer.h: initialize_parameter), so its weights do not depend on how it was
// built. Their parameters can be deferred: shaped, but holding no memory until given values,
// which ZeRO-3 does unit by unit so that no rank ever holds the whole model.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace keel::model {

// An fp32 CPU tensor of `shape`: allocated (contents undefined until initialized) or, deferred,
// holding no memory (its storage empty; reading it is an error) until set_data gives it some.
inline torch::Tensor new_parameter(const std::vector<int64_t>& shape, bool deferred) {
  if (!deferred) return torch::empty(shape);
  torch::Tensor t = torch::empty({0});
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}

// Whether `t` holds memory for its elements (not a deferred parameter).
inline bool holds_memory(const torch::Tensor& t) {
  return t.storage().nbytes() >= static_cast<size_t>(t.numel() * t.element_size());
}

// weight (out, in), bias (out) when `bias`; model::linear (fused_ops.h) computes with them.
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, bool bias, bool deferred) {
    weight = register_parameter("weight", new_parameter({out, in}, deferred));
    if (bias) this->bias = register_parameter("bias", new_parameter({out}, deferred));
  }
  torch::Tensor weight, bias;  // bias undefined without one
};
TORCH_MODULE(Linear);

// weight (count, dim): row i is token (or position) i's vector.
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t count, int64_t dim, bool deferred) {
    weight = register_parameter("weight", new_parameter({count, dim}, deferred));
  }
  torch::Tensor forward(const torch::Tensor& ids) { return torch::embedding(weight, ids); }
  torch::Tensor weight;
};
TORCH_MODULE(Embedding);

}  // namespace keel::model
