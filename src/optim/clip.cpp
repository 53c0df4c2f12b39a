// Global-L2 gradient clipping on the device: multi-tensor norms, a tensor coefficient, no .item().
#include "optim/clip.h"

namespace keel::optim {
namespace {

std::vector<torch::Tensor> defined_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params) {
  const auto grads = defined_grads(params);
  if (grads.empty()) {
    const auto device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
    return torch::zeros({}, torch::dtype(torch::kFloat).device(device));
  }
  // One () norm per gradient, accumulated in fp32 even for bf16/fp16 gradients; then the norm of
  // the (P) vector of norms is the global norm.
  const auto norms = at::_foreach_norm(grads, 2, at::kFloat);
  return at::stack(norms).norm();
}

torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm) {
  auto norm = global_grad_norm(params);
  clip_grad_norm_(params, max_norm, norm);
  return norm;
}

void clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm,
                     const torch::Tensor& norm, const torch::Tensor& prescale) {
  auto grads = defined_grads(params);
  if (grads.empty()) return;
  // () fp32 coefficient min(1, max_norm / (norm + 1e-6)); multiplying by 1 leaves small gradients
  // unchanged bit for bit, so there is no need for a host-side branch.
  auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (prescale.defined()) coef = coef * prescale;
  at::_foreach_mul_(grads, coef);
}

torch::Tensor per_param_grad_norms(const std::vector<torch::Tensor>& params) {
  const auto grads = defined_grads(params);
  const auto device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  const auto opts = torch::dtype(torch::kFloat).device(device);
  if (grads.empty()) return torch::zeros({static_cast<int64_t>(params.size())}, opts);
  auto norms = at::_foreach_norm(grads, 2, at::kFloat);
  if (grads.size() == params.size()) return at::stack(norms);
  // Interleave zeros for the parameters that have no gradient, keeping params' order.
  std::vector<torch::Tensor> all;
  all.reserve(params.size());
  const auto zero = torch::zeros({}, opts);
  size_t next = 0;
  for (const auto& p : params) all.push_back(p.grad().defined() ? norms[next++] : zero);
  return at::stack(all);
}

}  // namespace keel::optim
