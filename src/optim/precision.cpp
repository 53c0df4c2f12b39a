// Mixed precision: autocast scopes over fp32 master weights and a device-resident dynamic loss
// scaler (GradScaler semantics via the _amp_* kernels, which have CPU and CUDA implementations).
#include "optim/precision.h"

#include <ATen/autocast_mode.h>

#include "common/error.h"

namespace keel::optim {

AutocastScope::AutocastScope(torch::DeviceType device, Precision precision) : device_(device) {
  if (precision == Precision::kFp32) return;
  active_ = true;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_,
                                   precision == Precision::kBf16 ? at::kBFloat16 : at::kHalf);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
  // The cache holds low-precision copies of the weights made inside the scope; once the outermost
  // scope closes they are stale (the optimizer will change the weights), so drop them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
}

DynamicLossScaler::DynamicLossScaler(torch::Device device, double init_scale, double growth_factor,
                                     double backoff_factor, int64_t growth_interval)
    : scale_(torch::full({1}, init_scale, torch::dtype(torch::kFloat).device(device))),
      growth_tracker_(torch::zeros({1}, torch::dtype(torch::kInt).device(device))),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval) {}

torch::Tensor DynamicLossScaler::unscale_(const std::vector<torch::Tensor>& params) {
  auto found_inf = torch::zeros({1}, scale_.options());  // (1) fp32, set to 1 by the kernel
  std::vector<torch::Tensor> grads;
  grads.reserve(params.size());
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return found_inf;
  const auto inv_scale = scale_.reciprocal();  // (1) fp32: computed on the device, no sync
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  return found_inf;
}

void DynamicLossScaler::update(const torch::Tensor& found_inf) {
  // found_inf may come from another device-side reduction (e.g. an all-reduce); the kernel wants
  // (1) fp32 on the scale's device.
  auto found = found_inf.to(scale_.options()).reshape({1});
  at::_amp_update_scale_(scale_, growth_tracker_, found, growth_factor_, backoff_factor_,
                         growth_interval_);
}

std::map<std::string, torch::Tensor> DynamicLossScaler::state_dict() const {
  return {{"scale", scale_.detach().clone()}, {"growth_tracker", growth_tracker_.detach().clone()}};
}

void DynamicLossScaler::load_state_dict(const std::map<std::string, torch::Tensor>& state) {
  const std::pair<const char*, torch::Tensor*> slots[] = {{"scale", &scale_},
                                                          {"growth_tracker", &growth_tracker_}};
  for (const auto& [key, dst] : slots) {
    const auto it = state.find(key);
    if (it == state.end() || it->second.sizes() != dst->sizes()) {
      throw CheckpointError(std::string("loss scaler state: '") + key +
                            "' is missing or has the wrong shape\nHINT: the checkpoint was not "
                            "written by an fp16 run of this keel version; resume with the same "
                            "run.precision");
    }
    dst->copy_(it->second);  // keeps our device and dtype
  }
}

}  // namespace keel::optim
