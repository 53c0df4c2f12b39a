// Fused CPU kernels for the memory-bound parts of a block. On the CPU a training step is matmuls
// (MKL) plus a tail of elementwise passes, each of which reads and writes whole activations;
// fusing a chain of them into one pass is where a C++ trainer can beat eager PyTorch running the
// same kernels. Each op falls back to the ATen composite where its kernel does not apply
// (another device or dtype, or a CPU without AVX2 and FMA), so callers never branch.
#pragma once

#include <torch/torch.h>

namespace keel::model {

// SwiGLU of an MLP input projection laid out as [gate | up] along the last dimension:
// (..., 2F) -> (..., F) = silu(gate) * up. Fused (one pass forward, one pass backward writing
// the gradient of the whole [gate | up] block) for contiguous fp32 CPU tensors.
torch::Tensor swiglu(const torch::Tensor& gate_up);

// The composite the fused kernel replaces; the reference of its tests.
torch::Tensor swiglu_composite(const torch::Tensor& gate_up);

// Whether swiglu() takes the fused path for this tensor.
bool swiglu_is_fused(const torch::Tensor& gate_up);

}  // namespace keel::model
