// The kernels of fused_kernels.h, written with ATen's Vectorized<float> and compiled with
// -mavx2 -mfma and CPU_CAPABILITY=AVX2 (see CMakeLists.txt), so a vector is 8 lanes. It also
// needs -fopenmp: at::parallel_for is a template whose `omp parallel` would otherwise compile to
// a serial loop here. An AVX-512 build of the same code was no faster: the fused passes are
// memory-bound once exp is the inline polynomial.

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>

#include "model/fused_kernels.h"

namespace keel::model::kernels {
namespace {

using Vec = at::vec::Vectorized<float>;

// Rows per parallel task: enough elements that a task outweighs the fork (~32K, ATen's grain).
int64_t row_grain(int64_t f) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(f, 1)); }

// exp_u20 is ATen's inline polynomial (2 ULP), cheaper than the Sleef call (1 ULP) behind ATen's
// own silu; the scalar overload serves the tail of a row.
inline Vec sigmoid(const Vec& x) { return Vec(1.0f) / (Vec(1.0f) + x.neg().exp_u20()); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void swiglu_forward_avx2(const float* gate_up, float* out, int64_t rows, int64_t f) {
  at::parallel_for(0, rows, row_grain(f), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate_up + r * 2 * f;
      const float* u = g + f;
      float* h = out + r * f;
      int64_t i = 0;
      for (; i + Vec::size() <= f; i += Vec::size()) {
        const Vec gv = Vec::loadu(g + i), uv = Vec::loadu(u + i);
        const Vec s = sigmoid(gv);
        (gv * s * uv).store(h + i);
      }
      for (; i < f; ++i) h[i] = g[i] * sigmoid(g[i]) * u[i];
    }
  });
}

void swiglu_backward_avx2(const float* gate_up, const float* grad_out, float* grad_gate_up,
                          int64_t rows, int64_t f) {
  at::parallel_for(0, rows, row_grain(f), [&](int64_t begin, int64_t end) {
    const Vec one(1.0f);
    for (int64_t r = begin; r < end; ++r) {
      const float* g = gate_up + r * 2 * f;
      const float* u = g + f;
      const float* dh = grad_out + r * f;
      float* dg = grad_gate_up + r * 2 * f;
      float* du = dg + f;
      int64_t i = 0;
      for (; i + Vec::size() <= f; i += Vec::size()) {
        const Vec gv = Vec::loadu(g + i), uv = Vec::loadu(u + i), dhv = Vec::loadu(dh + i);
        const Vec s = sigmoid(gv);
        const Vec gs = gv * s;  // silu(gate)
        (dhv * uv * s * (one + gv * (one - s))).store(dg + i);
        (dhv * gs).store(du + i);
      }
      for (; i < f; ++i) {
        const float s = sigmoid(g[i]);
        dg[i] = dh[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = dh[i] * g[i] * s;
      }
    }
  });
}

}  // namespace keel::model::kernels
