// The kernels of fused_kernels.h, written with ATen's Vectorized<float> and compiled with
// -mavx2 -mfma and CPU_CAPABILITY=AVX2 (see CMakeLists.txt), so a vector is 8 lanes. It also
// needs -fopenmp: at::parallel_for is a template whose `omp parallel` would otherwise compile to
// a serial loop here. An AVX-512 build of the same code was no faster: the fused passes are
// memory-bound once exp is the inline polynomial.

#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

namespace {

// y1 = x1 c + sign * x2 s, y2 = x2 c - sign * x1 s over one head: sign -1 rotates forward, +1
// back (the transpose). x and y are `half` apart pairs; y may not alias x.
template <int kSign>
inline void rotate_head(const float* x, const float* c, const float* s, float* y, int64_t half) {
  int64_t i = 0;
  for (; i + Vec::size() <= half; i += Vec::size()) {
    const Vec x1 = Vec::loadu(x + i), x2 = Vec::loadu(x + half + i);
    const Vec cv = Vec::loadu(c + i), sv = Vec::loadu(s + i);
    if constexpr (kSign < 0) {
      at::vec::fmsub(x1, cv, x2 * sv).store(y + i);
      at::vec::fmadd(x2, cv, x1 * sv).store(y + half + i);
    } else {
      at::vec::fmadd(x1, cv, x2 * sv).store(y + i);
      at::vec::fmsub(x2, cv, x1 * sv).store(y + half + i);
    }
  }
  for (; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    y[i] = x1 * c[i] + kSign * x2 * s[i];
    y[half + i] = x2 * c[i] - kSign * x1 * s[i];
  }
}

inline const float* head_ptr(const HeadsView& v, int64_t b, int64_t h, int64_t t) {
  return v.data + b * v.stride_b + h * v.stride_h + t * v.stride_t;
}

}  // namespace

void qkv_rope_forward_avx2(const float* qkv, const float* cos, const float* sin, float* q, float* k,
                           float* v, int64_t batch, int64_t seq, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2, width = (n_heads + 2 * n_kv_heads) * head_dim;
  at::parallel_for(0, batch * seq, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / seq, t = r % seq;
      const float* row = qkv + r * width;
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      // Head h of a heads-first (B, h, T, D) output starts at ((b * heads + h) * T + t) * D.
      auto at_head = [&](float* out, int64_t heads, int64_t h) {
        return out + ((b * heads + h) * seq + t) * head_dim;
      };
      for (int64_t h = 0; h < n_heads; ++h) {
        rotate_head<-1>(row + h * head_dim, c, s, at_head(q, n_heads, h), half);
      }
      for (int64_t h = 0; h < n_kv_heads; ++h) {
        rotate_head<-1>(row + (n_heads + h) * head_dim, c, s, at_head(k, n_kv_heads, h), half);
        std::copy_n(row + (n_heads + n_kv_heads + h) * head_dim, head_dim,
                    at_head(v, n_kv_heads, h));
      }
    }
  });
}

void qkv_rope_backward_avx2(HeadsView dq, HeadsView dk, HeadsView dv, const float* cos,
                            const float* sin, float* grad_qkv, int64_t batch, int64_t seq,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim) {
  const int64_t half = head_dim / 2, width = (n_heads + 2 * n_kv_heads) * head_dim;
  at::parallel_for(0, batch * seq, row_grain(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / seq, t = r % seq;
      float* row = grad_qkv + r * width;
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      // Heads in qkv order: H of q, Hkv of k (both rotated back), Hkv of v (copied).
      for (int64_t j = 0; j < n_heads + 2 * n_kv_heads; ++j) {
        const bool is_q = j < n_heads, is_k = !is_q && j < n_heads + n_kv_heads;
        const HeadsView& g = is_q ? dq : is_k ? dk : dv;
        const int64_t h = is_q ? j : is_k ? j - n_heads : j - n_heads - n_kv_heads;
        float* out = row + j * head_dim;
        if (g.data == nullptr) {
          std::fill_n(out, head_dim, 0.0f);
        } else if (is_q || is_k) {
          rotate_head<+1>(head_ptr(g, b, h, t), c, s, out, half);
        } else {
          std::copy_n(head_ptr(g, b, h, t), head_dim, out);
        }
      }
    }
  });
}

namespace {

inline float sum_lanes(const Vec& v) {
  return at::vec::vec_reduce_all([](const Vec& a, const Vec& b) { return a + b; }, v);
}

// Sum of a[i] * b[i] over n, vector lanes first, then the tail.
inline float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.0f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size())
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  float sum = sum_lanes(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

}  // namespace

void rms_norm_forward_avx2(const float* x, const float* weight, float* out, float* rstd,
                           int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = x + r * n;
      float* yr = out + r * n;
      const float rs = 1.0f / std::sqrt(dot(xr, xr, n) / static_cast<float>(n) + eps);
      rstd[r] = rs;
      const Vec rsv(rs);
      int64_t i = 0;
      for (; i + Vec::size() <= n; i += Vec::size()) {
        (Vec::loadu(xr + i) * rsv * Vec::loadu(weight + i)).store(yr + i);
      }
      for (; i < n; ++i) yr[i] = xr[i] * rs * weight[i];
    }
  });
}

void rms_norm_backward_avx2(const float* x, const float* weight, const float* rstd,
                            const float* grad_out, float* grad_x, float* grad_weight, int64_t rows,
                            int64_t n) {
  // grad_weight is a reduction over rows: each of a fixed number of row blocks sums into its
  // own partial, and the partials are added in block order, so the result does not depend on
  // which thread ran which block.
  if (rows <= 0) {
    std::fill_n(grad_weight, n, 0.0f);
    return;
  }
  const int64_t blocks = std::min<int64_t>(rows, std::max<int64_t>(1, at::get_num_threads()));
  const int64_t block_rows = (rows + blocks - 1) / blocks;
  std::vector<float> partial(static_cast<size_t>(blocks * n), 0.0f);
  const float inv_n = 1.0f / static_cast<float>(n);
  at::parallel_for(0, blocks, 1, [&](int64_t block_begin, int64_t block_end) {
    for (int64_t blk = block_begin; blk < block_end; ++blk) {
      float* gw = partial.data() + blk * n;
      for (int64_t r = blk * block_rows; r < std::min(rows, (blk + 1) * block_rows); ++r) {
        const float* xr = x + r * n;
        const float* dy = grad_out + r * n;
        float* dx = grad_x + r * n;
        const float rs = rstd[r];
        // mean(g * xhat) = rstd * mean(dy * w * x)
        Vec acc(0.0f);
        int64_t i = 0;
        for (; i + Vec::size() <= n; i += Vec::size()) {
          acc =
              at::vec::fmadd(Vec::loadu(dy + i) * Vec::loadu(weight + i), Vec::loadu(xr + i), acc);
        }
        float sum = sum_lanes(acc);
        for (; i < n; ++i) sum += dy[i] * weight[i] * xr[i];
        const float coef = rs * rs * rs * sum * inv_n;  // rstd * xhat-coefficient folded into x
        const Vec rsv(rs), coefv(coef);
        i = 0;
        for (; i + Vec::size() <= n; i += Vec::size()) {
          const Vec xv = Vec::loadu(xr + i), dyv = Vec::loadu(dy + i);
          at::vec::fmsub(dyv * Vec::loadu(weight + i), rsv, xv * coefv).store(dx + i);
          at::vec::fmadd(dyv * xv, rsv, Vec::loadu(gw + i)).store(gw + i);
        }
        for (; i < n; ++i) {
          dx[i] = dy[i] * weight[i] * rs - xr[i] * coef;
          gw[i] += dy[i] * xr[i] * rs;
        }
      }
    }
  });
  std::copy_n(partial.data(), n, grad_weight);
  for (int64_t blk = 1; blk < blocks; ++blk) {
    for (int64_t i = 0; i < n; ++i) grad_weight[i] += partial[blk * n + i];
  }
}

void causal_softmax_forward_avx2(float* s, int64_t n, int64_t seq, float scale) {
  at::parallel_for(0, n * seq, row_grain(seq), [&](int64_t begin, int64_t end) {
    const Vec scale_v(scale);
    for (int64_t r = begin; r < end; ++r) {
      float* row = s + r * seq;
      const int64_t len = r % seq + 1;  // query position i attends to keys 0..i
      float max = -std::numeric_limits<float>::infinity();
      int64_t j = 0;
      Vec max_v(max);
      for (; j + Vec::size() <= len; j += Vec::size())
        max_v = at::vec::maximum(max_v, Vec::loadu(row + j));
      max = at::vec::vec_reduce_all(
          [](const Vec& a, const Vec& b) { return at::vec::maximum(a, b); }, max_v);
      for (; j < len; ++j) max = std::max(max, row[j]);
      // scale > 0, so the largest scaled score is scale * max.
      const Vec shift_v(scale * max);
      Vec sum_v(0.0f);
      float sum = 0.0f;
      j = 0;
      for (; j + Vec::size() <= len; j += Vec::size()) {
        const Vec e = at::vec::fmsub(Vec::loadu(row + j), scale_v, shift_v).exp_u20();
        e.store(row + j);
        sum_v = sum_v + e;
      }
      sum = sum_lanes(sum_v);
      for (; j < len; ++j) {
        row[j] = std::exp(row[j] * scale - scale * max);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      const Vec inv_v(inv);
      j = 0;
      for (; j + Vec::size() <= len; j += Vec::size()) (Vec::loadu(row + j) * inv_v).store(row + j);
      for (; j < len; ++j) row[j] *= inv;
      std::fill(row + len, row + seq, 0.0f);
    }
  });
}

void causal_softmax_backward_avx2(const float* p, float* grad, int64_t n, int64_t seq,
                                  float scale) {
  at::parallel_for(0, n * seq, row_grain(seq), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* pr = p + r * seq;
      float* gr = grad + r * seq;
      const int64_t len = r % seq + 1;
      const float dot_pg = dot(pr, gr, len);
      const Vec scale_v(scale), dot_v(dot_pg);
      int64_t j = 0;
      for (; j + Vec::size() <= len; j += Vec::size()) {
        (Vec::loadu(pr + j) * (Vec::loadu(gr + j) - dot_v) * scale_v).store(gr + j);
      }
      for (; j < len; ++j) gr[j] = pr[j] * (gr[j] - dot_pg) * scale;
      std::fill(gr + len, gr + seq, 0.0f);
    }
  });
}

}  // namespace keel::model::kernels
