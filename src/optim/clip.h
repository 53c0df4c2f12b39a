// Global-L2 gradient clipping without host synchronisation: the norm stays on the device.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace keel::optim {

// Total L2 norm of all gradients, () fp32 on the gradients' device (multi-tensor _foreach_norm).
// Parameters without a gradient are skipped.
torch::Tensor global_grad_norm(const std::vector<torch::Tensor>& params);

// Scales gradients in place so their global norm is at most max_norm (coefficient
// min(1, max_norm / (norm + 1e-6)), applied on the device). Returns the norm before clipping.
torch::Tensor clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm);
// The same with the global norm already computed (the trainer has it from the per-parameter
// norms the guard reads), saving a pass over every gradient. `prescale` (a () tensor, or
// undefined for none) multiplies the gradients first, in the same pass; `norm` is then the norm
// after that multiplication.
void clip_grad_norm_(const std::vector<torch::Tensor>& params, double max_norm,
                     const torch::Tensor& norm, const torch::Tensor& prescale = {});

// Per-parameter L2 norms as one (P) fp32 tensor, same order as params (zeros where no grad).
torch::Tensor per_param_grad_norms(const std::vector<torch::Tensor>& params);

}  // namespace keel::optim
