// Fused CPU kernels for the memory-bound parts of a block. On the CPU a training step is matmuls
// (MKL) plus a tail of elementwise passes, each of which reads and writes whole activations;
// fusing a chain of them into one pass is where a C++ trainer can beat eager PyTorch running the
// same kernels. Each op falls back to the ATen composite where its kernel does not apply
// (another device or dtype, or a CPU without AVX2 and FMA), so callers never branch.
#pragma once

#include <torch/torch.h>

#include "config/schema.h"

namespace keel::model {

// SwiGLU of an MLP input projection laid out as [gate | up] along the last dimension:
// (..., 2F) -> (..., F) = silu(gate) * up. Fused (one pass forward, one pass backward writing
// the gradient of the whole [gate | up] block) for contiguous fp32 CPU tensors.
torch::Tensor swiglu(const torch::Tensor& gate_up);

// The composite the fused kernel replaces; the reference of its tests.
torch::Tensor swiglu_composite(const torch::Tensor& gate_up);

// Whether swiglu() takes the fused path for this tensor.
bool swiglu_is_fused(const torch::Tensor& gate_up);

// y = x W^T + b over the last dimension: x (..., K), weight (N, K), bias (N) or undefined ->
// (..., N), the value of at::linear. On the CPU in fp32 (no autocast), with the GEMM backend set
// to kOneDnn, the forward and input-gradient GEMMs run in oneDNN (LibTorch's
// mkldnn::_linear_pointwise) and the weight gradient in ATen's mm: on the AMD EPYC this was
// measured on, oneDNN's AVX-512 GEMMs are 20-40 % faster than MKL's for the first two, and no
// faster for the third. Everything else is at::linear.
using CpuMatmul = config::CpuMatmul;
void set_cpu_matmul(CpuMatmul backend);  // process-wide; run.cpu_matmul
CpuMatmul cpu_matmul();
bool onednn_linear_available();  // LibTorch was built with oneDNN (mkldnn)
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = {});
bool linear_uses_onednn(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias = {});

// RMSNorm over the last dimension with a gain: x (..., n), weight (n) -> (..., n), the value of
// at::rms_norm. Fused (one pass forward, one pass backward for both gradients) for contiguous
// fp32 CPU tensors; at::rms_norm's own backward is a chain of autograd ops.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rms_norm_composite(const torch::Tensor& x, const torch::Tensor& weight, double eps);
bool rms_norm_is_fused(const torch::Tensor& x, const torch::Tensor& weight);

// Rotary embedding, "rotate half" layout: x (B, T, h, D), cos/sin (>= T, D/2) -> (B, T, h, D).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);

// Attention heads from a fused QKV projection (B, T, (H + 2 Hkv) D), laid out [q | k | v]:
// heads-first q (B, H, T, D), k and v (B, Hkv, T, D), with q and k rotated by apply_rope's
// tables. Fused (one pass forward that also makes the heads contiguous, one pass backward that
// writes the gradient of qkv whole) for fp32 CPU tensors; otherwise split, view, apply_rope and
// transpose, which leaves strided views.
struct QkvHeads {
  torch::Tensor q, k, v;
};
QkvHeads split_qkv_rope(const torch::Tensor& qkv, const torch::Tensor& cos,
                        const torch::Tensor& sin, int64_t n_heads, int64_t n_kv_heads);
QkvHeads split_qkv_rope_composite(const torch::Tensor& qkv, const torch::Tensor& cos,
                                  const torch::Tensor& sin, int64_t n_heads, int64_t n_kv_heads);
bool split_qkv_rope_is_fused(const torch::Tensor& qkv, const torch::Tensor& cos,
                             const torch::Tensor& sin, int64_t n_heads, int64_t n_kv_heads);

// Causal self-attention of heads-first q, k, v (B, H, T, D) -> (B, H, T, D), the value of
// at::scaled_dot_product_attention(q, k, v, {}, dropout_p, /*is_causal=*/true). Without dropout,
// for fp32 CPU tensors of short sequences, as two batched matmuls around a fused causal softmax:
// at T <= 512 MKL's batched GEMM beats the CPU flash kernel's small tiles, at the cost of keeping
// the (B, H, T, T) probabilities for the backward, capped at kMaxAttentionProbsBytes per call.
// Otherwise SDPA.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p);
bool causal_attention_is_fused(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, double dropout_p);
inline constexpr int64_t kMaxAttentionSeq = 512;
inline constexpr int64_t kMaxAttentionProbsBytes = int64_t{32} << 20;

}  // namespace keel::model
