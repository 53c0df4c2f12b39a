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

}  // namespace keel::model::kernels
