// Mixed precision: autocast scopes (bf16/fp16 compute over fp32 master weights) and dynamic loss
// scaling for fp16, all without host synchronisation on the hot path.
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/schema.h"

namespace keel::optim {

using Precision = config::Precision;  // run.precision

// RAII: enables autocast for `device` with the precision's dtype for its lifetime (no-op for fp32)
// and restores the previous state (and clears the autocast cache) on exit.
class AutocastScope {
 public:
  AutocastScope(torch::DeviceType device, Precision precision);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  torch::DeviceType device_;
  bool active_ = false;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

// Dynamic loss scaling (GradScaler semantics): multiply the loss by scale(); after backward,
// unscale_() divides the gradients in place and returns found_inf; update() halves the scale on
// overflow and doubles it after `growth_interval` clean steps. All on the device.
class DynamicLossScaler {
 public:
  DynamicLossScaler(torch::Device device, double init_scale = 65536.0, double growth_factor = 2.0,
                    double backoff_factor = 0.5, int64_t growth_interval = 2000);
  const torch::Tensor& scale() const { return scale_; }              // (1) fp32
  torch::Tensor unscale_(const std::vector<torch::Tensor>& params);  // returns found_inf (1) fp32
  void update(const torch::Tensor& found_inf);
  std::map<std::string, torch::Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, torch::Tensor>& state);

 private:
  torch::Tensor scale_, growth_tracker_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
};

}  // namespace keel::optim
