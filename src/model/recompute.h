// Activation checkpointing: parts of the forward pass whose intermediate tensors are not kept
// but computed again in the backward pass, trading compute for memory.
//
// recompute(fn, x): fn(x) runs without keeping anything but x; the backward pass runs fn again on
// x, under the autocast and RNG state of the first run (so dropout draws the same masks), and
// back-propagates through that second run. The gradients of the parameters fn uses accumulate in
// their .grad during it (reentrant, as torch.utils.checkpoint with use_reentrant=True), so the
// gradient hooks the distributed reducer sets fire as usual. model.activation_checkpointing: full
// wraps each transformer block in it.
//
// recompute_then_linear(fn, x, weight, bias): linear(fn(x), weight, bias), keeping x and the
// output but not fn(x): the backward pass recomputes fn(x) (a norm, an activation) for the
// weight's gradient and goes on through it. The matmul is never run twice. This is
// model.activation_checkpointing: selective: matmul and attention outputs kept, the norms and
// activations between them recomputed.
//
// Outside a gradient-recording forward (eval, no_grad) both are plain calls.
#pragma once

#include <functional>

#include <torch/torch.h>

namespace keel::model {

using Region = std::function<torch::Tensor(const torch::Tensor&)>;

torch::Tensor recompute(Region fn, const torch::Tensor& x);

torch::Tensor recompute_then_linear(Region fn, const torch::Tensor& x, const torch::Tensor& weight,
                                    const torch::Tensor& bias = {});

}  // namespace keel::model
