// Raw-pointer kernels behind fused_ops.h, built for AVX2+FMA in their own translation unit
// (fused_kernels_avx2.cpp), on x86-64 only (KEEL_HAVE_X86_KERNELS). Call them only on a CPU
// that has both.
#pragma once

#include <cstdint>

namespace keel::model::kernels {

// gate_up (rows, 2F) -> out (rows, F) = silu(gate) * up.
void swiglu_forward_avx2(const float* gate_up, float* out, int64_t rows, int64_t f);

// With s = sigmoid(gate): d_gate = d_out * up * s * (1 + gate * (1 - s)), d_up = d_out * gate * s,
// written side by side into grad_gate_up (rows, 2F).
void swiglu_backward_avx2(const float* gate_up, const float* grad_out, float* grad_gate_up,
                          int64_t rows, int64_t f);

// One tensor of attention heads, (B, h, T, D) with the head dim contiguous and any other
// strides (in elements); data == nullptr stands for zeros (a gradient autograd left undefined).
struct HeadsView {
  const float* data;
  int64_t stride_b, stride_h, stride_t;
};

// A fused QKV projection qkv (B, T, (H + 2 Hkv) D), laid out [q heads | k heads | v heads], into
// contiguous heads-first q (B, H, T, D), k and v (B, Hkv, T, D), as attention consumes them, with
// q and k rotated by the rotary tables cos/sin (>= T, D/2) in the "rotate half" layout:
// y1 = x1 c - x2 s, y2 = x2 c + x1 s.
void qkv_rope_forward_avx2(const float* qkv, const float* cos, const float* sin, float* q, float* k,
                           float* v, int64_t batch, int64_t seq, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim);

// The transpose: gradients of q, k, v into the gradient of qkv (B, T, (H + 2 Hkv) D), q and k
// rotated back (dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s).
void qkv_rope_backward_avx2(HeadsView dq, HeadsView dk, HeadsView dv, const float* cos,
                            const float* sin, float* grad_qkv, int64_t batch, int64_t seq,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim);

// Causal softmax of attention scores in place: s holds n matrices (T, T) of raw q.k products;
// row i becomes softmax_j(scale * s[i][j]) over j <= i, and 0 for j > i.
void causal_softmax_forward_avx2(float* s, int64_t n, int64_t seq, float scale);

// Its backward in place: grad (n, T, T) holds dL/dp and becomes dL/ds =
// scale * p * (grad - sum_j p * grad) on and below the diagonal, 0 above.
void causal_softmax_backward_avx2(const float* p, float* grad, int64_t n, int64_t seq, float scale);

// RMSNorm over rows of n: out = x * rstd * weight with rstd = 1 / sqrt(mean(x^2) + eps), one per
// row, kept for the backward.
void rms_norm_forward_avx2(const float* x, const float* weight, float* out, float* rstd,
                           int64_t rows, int64_t n, float eps);

// With xhat = x * rstd: grad_x = rstd * (g - xhat * mean(g * xhat)) where g = grad_out * weight,
// and grad_weight = sum over rows of grad_out * xhat (summed in a fixed order for a given
// thread count).
void rms_norm_backward_avx2(const float* x, const float* weight, const float* rstd,
                            const float* grad_out, float* grad_x, float* grad_weight, int64_t rows,
                            int64_t n);

}  // namespace keel::model::kernels
