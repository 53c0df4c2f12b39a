#include "model/fused_ops.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <atomic>
#include <cmath>
#include <optional>

#include "model/fused_kernels.h"
#include "model/kernel_config.h"  // generated: KEEL_HAVE_X86_KERNELS

namespace keel::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

std::atomic<CpuMatmul> g_cpu_matmul{CpuMatmul::kOneDnn};

// LibTorch's oneDNN linear, found once; absent when LibTorch was built without mkldnn.
const std::optional<c10::OperatorHandle>& onednn_linear_op() {
  static const auto op = c10::Dispatcher::singleton().findSchema({"mkldnn::_linear_pointwise", ""});
  return op;
}

// x (M, K) @ w^T where w is (N, K) with any strides oneDNN accepts -> (M, N).
Tensor onednn_linear_2d(const Tensor& x, const Tensor& w) {
  torch::jit::Stack stack{x,
                          w,
                          /*bias=*/c10::IValue(),
                          /*attr=*/std::string("none"),
                          /*scalars=*/c10::List<std::optional<c10::Scalar>>(),
                          /*algorithm=*/c10::IValue()};
  onednn_linear_op()->callBoxed(&stack);
  return stack[0].toTensor();
}

// Without bias: autograd functions take only defined tensors. A bias is added outside, one
// broadcast add, as addmm's copy of it into the output would cost.
struct OneDnnLinear : torch::autograd::Function<OneDnnLinear> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight) {
    const auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
    ctx->save_for_backward({x2, weight});
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return onednn_linear_2d(x2, weight).view(sizes);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x2 = saved[0], &weight = saved[1];
    const auto grad2 = grads[0].reshape({-1, weight.size(0)}).contiguous();  // (M, N)
    Tensor grad_x, grad_weight;
    if (ctx->needs_input_grad(0)) {
      auto sizes = grads[0].sizes().vec();
      sizes.back() = weight.size(1);
      grad_x = onednn_linear_2d(grad2, weight.t()).view(sizes);  // dY W, with W^T as the "weight"
    }
    if (ctx->needs_input_grad(1)) grad_weight = at::mm(grad2.t(), x2);
    return {grad_x, grad_weight};
  }
};

#if KEEL_HAVE_X86_KERNELS
const bool kCpuHasAvx2Fma = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}();

Tensor half_last_dim_empty(const Tensor& gate_up) {
  auto sizes = gate_up.sizes().vec();
  sizes.back() /= 2;
  return at::empty(sizes, gate_up.options());
}

struct FusedSwiglu : torch::autograd::Function<FusedSwiglu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    const int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * f);
    auto out = half_last_dim_empty(gate_up);
    kernels::swiglu_forward_avx2(gate_up.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
                                 rows, f);
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto gate_up = ctx->get_saved_variables()[0];
    const auto grad_out = grads[0].contiguous();
    const int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * f);
    auto grad = at::empty_like(gate_up);
    kernels::swiglu_backward_avx2(gate_up.const_data_ptr<float>(), grad_out.const_data_ptr<float>(),
                                  grad.mutable_data_ptr<float>(), rows, f);
    return {grad};
  }
};

struct FusedRmsNorm : torch::autograd::Function<FusedRmsNorm> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight, double eps) {
    const int64_t n = x.size(-1), rows = x.numel() / n;
    auto out = at::empty_like(x);
    auto rstd = at::empty({rows}, x.options());
    kernels::rms_norm_forward_avx2(x.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                                   out.mutable_data_ptr<float>(), rstd.mutable_data_ptr<float>(),
                                   rows, n, static_cast<float>(eps));
    ctx->save_for_backward({x, weight, rstd});
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &weight = saved[1], &rstd = saved[2];
    const auto grad_out = grads[0].contiguous();
    const int64_t n = x.size(-1), rows = x.numel() / n;
    auto grad_x = at::empty_like(x);
    auto grad_weight = at::empty_like(weight);
    kernels::rms_norm_backward_avx2(x.const_data_ptr<float>(), weight.const_data_ptr<float>(),
                                    rstd.const_data_ptr<float>(), grad_out.const_data_ptr<float>(),
                                    grad_x.mutable_data_ptr<float>(),
                                    grad_weight.mutable_data_ptr<float>(), rows, n);
    return {grad_x, grad_weight, Tensor()};
  }
};

// (B, H, T, D) -> (B * H, T, D), contiguous.
Tensor batch_heads(const Tensor& x) { return x.contiguous().view({-1, x.size(2), x.size(3)}); }

struct FusedCausalAttention : torch::autograd::Function<FusedCausalAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v) {
    const int64_t T = q.size(2);
    const float scale = 1.0f / std::sqrt(static_cast<float>(q.size(3)));
    const auto q3 = batch_heads(q), k3 = batch_heads(k), v3 = batch_heads(v);
    auto probs = at::bmm(q3, k3.transpose(1, 2));  // (B*H, T, T) raw scores, then in place
    kernels::causal_softmax_forward_avx2(probs.mutable_data_ptr<float>(), probs.size(0), T, scale);
    ctx->save_for_backward({q3, k3, v3, probs});
    ctx->saved_data["scale"] = static_cast<double>(scale);
    return at::bmm(probs, v3).view(q.sizes());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q3 = saved[0], &k3 = saved[1], &v3 = saved[2], &probs = saved[3];
    const auto scale = static_cast<float>(ctx->saved_data["scale"].toDouble());
    const auto sizes = grads[0].sizes().vec();
    const auto grad_out = batch_heads(grads[0]);
    auto grad_scores = at::bmm(grad_out, v3.transpose(1, 2));  // dL/dprobs, then dL/dscores
    auto grad_v = at::bmm(probs.transpose(1, 2), grad_out);
    kernels::causal_softmax_backward_avx2(probs.const_data_ptr<float>(),
                                          grad_scores.mutable_data_ptr<float>(), probs.size(0),
                                          probs.size(1), scale);
    auto grad_q = at::bmm(grad_scores, k3);
    auto grad_k = at::bmm(grad_scores.transpose(1, 2), q3);
    return {grad_q.view(sizes), grad_k.view(sizes), grad_v.view(sizes)};
  }
};

kernels::HeadsView heads_view(const Tensor& grad) {  // (B, h, T, D), D contiguous, or undefined
  if (!grad.defined()) return {nullptr, 0, 0, 0};
  return {grad.const_data_ptr<float>(), grad.stride(0), grad.stride(1), grad.stride(2)};
}

struct FusedQkvRope : torch::autograd::Function<FusedQkvRope> {
  static tensor_list forward(AutogradContext* ctx, const Tensor& qkv, const Tensor& cos,
                             const Tensor& sin, int64_t n_heads, int64_t n_kv_heads) {
    const int64_t B = qkv.size(0), T = qkv.size(1);
    const int64_t D = qkv.size(2) / (n_heads + 2 * n_kv_heads);
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["shape"] = std::vector<int64_t>{B, T, n_heads, n_kv_heads, D};
    auto q = at::empty({B, n_heads, T, D}, qkv.options());
    auto k = at::empty({B, n_kv_heads, T, D}, qkv.options());
    auto v = at::empty({B, n_kv_heads, T, D}, qkv.options());
    kernels::qkv_rope_forward_avx2(qkv.const_data_ptr<float>(), cos.const_data_ptr<float>(),
                                   sin.const_data_ptr<float>(), q.mutable_data_ptr<float>(),
                                   k.mutable_data_ptr<float>(), v.mutable_data_ptr<float>(), B, T,
                                   n_heads, n_kv_heads, D);
    return {q, k, v};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto shape = ctx->saved_data["shape"].toIntVector();
    const int64_t B = shape[0], T = shape[1], H = shape[2], Hkv = shape[3], D = shape[4];
    // The kernel reads any (B, h, T) strides but needs each head's D values contiguous.
    for (auto& g : grads) {
      if (g.defined() && g.stride(3) != 1) g = g.contiguous();
    }
    auto grad_qkv = at::empty({B, T, (H + 2 * Hkv) * D}, saved[0].options());
    kernels::qkv_rope_backward_avx2(heads_view(grads[0]), heads_view(grads[1]),
                                    heads_view(grads[2]), saved[0].const_data_ptr<float>(),
                                    saved[1].const_data_ptr<float>(),
                                    grad_qkv.mutable_data_ptr<float>(), B, T, H, Hkv, D);
    return {grad_qkv, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};
#endif

}  // namespace

bool swiglu_is_fused(const Tensor& gate_up) {
#if KEEL_HAVE_X86_KERNELS
  return kCpuHasAvx2Fma && gate_up.device().is_cpu() && gate_up.scalar_type() == torch::kFloat &&
         gate_up.is_contiguous() && gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0 &&
         gate_up.size(-1) > 0;
#else
  return false;
#endif
}

Tensor swiglu_composite(const Tensor& gate_up) {
  const auto parts = gate_up.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

Tensor swiglu(const Tensor& gate_up) {
#if KEEL_HAVE_X86_KERNELS
  if (swiglu_is_fused(gate_up)) return FusedSwiglu::apply(gate_up);
#endif
  return swiglu_composite(gate_up);
}

void set_cpu_matmul(CpuMatmul backend) { g_cpu_matmul = backend; }
CpuMatmul cpu_matmul() { return g_cpu_matmul; }
bool onednn_linear_available() { return onednn_linear_op().has_value(); }

bool linear_uses_onednn(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  auto cpu_fp32 = [](const Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat;
  };
  return g_cpu_matmul == CpuMatmul::kOneDnn && onednn_linear_available() &&
         !at::autocast::is_autocast_enabled(at::kCPU) && cpu_fp32(x) && cpu_fp32(weight) &&
         x.dim() >= 1 && x.numel() > 0 && weight.dim() == 2 && x.size(-1) == weight.size(1) &&
         weight.is_contiguous() &&
         (!bias.defined() || (cpu_fp32(bias) && bias.dim() == 1 && bias.size(0) == weight.size(0)));
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (linear_uses_onednn(x, weight, bias)) {
    auto y = OneDnnLinear::apply(x, weight);
    return bias.defined() ? y + bias : y;
  }
  return at::linear(x, weight, bias);
}

bool rms_norm_is_fused(const Tensor& x, const Tensor& weight) {
#if KEEL_HAVE_X86_KERNELS
  return kCpuHasAvx2Fma && x.device().is_cpu() && x.scalar_type() == torch::kFloat &&
         x.is_contiguous() && x.dim() >= 1 && x.size(-1) > 0 && weight.device().is_cpu() &&
         weight.scalar_type() == torch::kFloat && weight.is_contiguous() && weight.dim() == 1 &&
         weight.size(0) == x.size(-1);
#else
  return false;
#endif
}

Tensor rms_norm_composite(const Tensor& x, const Tensor& weight, double eps) {
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
#if KEEL_HAVE_X86_KERNELS
  if (rms_norm_is_fused(x, weight)) return FusedRmsNorm::apply(x, weight, eps);
#endif
  return rms_norm_composite(x, weight, eps);
}

bool causal_attention_is_fused(const Tensor& q, const Tensor& k, const Tensor& v,
                               double dropout_p) {
#if KEEL_HAVE_X86_KERNELS
  if (!kCpuHasAvx2Fma || dropout_p > 0.0 || q.dim() != 4 || !q.sizes().equals(k.sizes()) ||
      !q.sizes().equals(v.sizes())) {
    return false;
  }
  for (const auto* t : {&q, &k, &v}) {
    if (!t->device().is_cpu() || t->scalar_type() != torch::kFloat) return false;
  }
  const int64_t T = q.size(2);
  return T > 0 && q.size(3) > 0 && T <= kMaxAttentionSeq &&
         q.size(0) * q.size(1) * T * T * int64_t{sizeof(float)} <= kMaxAttentionProbsBytes;
#else
  return false;
#endif
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p) {
#if KEEL_HAVE_X86_KERNELS
  if (causal_attention_is_fused(q, k, v, dropout_p)) return FusedCausalAttention::apply(q, k, v);
#endif
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p, /*is_causal=*/true);
}

Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t T = x.size(1), half = x.size(3) / 2;
  // Cast to x's dtype so that under autocast the rotation stays in the compute dtype.
  const auto c = cos.narrow(0, 0, T).view({1, T, 1, half}).to(x.scalar_type());
  const auto s = sin.narrow(0, 0, T).view({1, T, 1, half}).to(x.scalar_type());
  const auto x1 = x.narrow(-1, 0, half), x2 = x.narrow(-1, half, half);
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

bool split_qkv_rope_is_fused(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                             int64_t n_heads, int64_t n_kv_heads) {
#if KEEL_HAVE_X86_KERNELS
  if (!kCpuHasAvx2Fma || qkv.dim() != 3 || n_heads <= 0 || n_kv_heads <= 0) return false;
  const int64_t heads = n_heads + 2 * n_kv_heads;
  if (qkv.size(2) % heads != 0 || (qkv.size(2) / heads) % 2 != 0) return false;
  const int64_t half = qkv.size(2) / heads / 2;
  auto eligible_table = [&](const Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == torch::kFloat && t.is_contiguous() &&
           t.dim() == 2 && t.size(0) >= qkv.size(1) && t.size(1) == half;
  };
  return qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat && qkv.is_contiguous() &&
         eligible_table(cos) && eligible_table(sin);
#else
  return false;
#endif
}

QkvHeads split_qkv_rope_composite(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                                  int64_t n_heads, int64_t n_kv_heads) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(2) / (n_heads + 2 * n_kv_heads);
  auto parts = qkv.split({n_heads * D, n_kv_heads * D, n_kv_heads * D}, -1);
  return {apply_rope(parts[0].view({B, T, n_heads, D}), cos, sin).transpose(1, 2),
          apply_rope(parts[1].view({B, T, n_kv_heads, D}), cos, sin).transpose(1, 2),
          parts[2].view({B, T, n_kv_heads, D}).transpose(1, 2)};
}

QkvHeads split_qkv_rope(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t n_heads,
                        int64_t n_kv_heads) {
#if KEEL_HAVE_X86_KERNELS
  if (split_qkv_rope_is_fused(qkv, cos, sin, n_heads, n_kv_heads)) {
    auto heads = FusedQkvRope::apply(qkv, cos, sin, n_heads, n_kv_heads);
    return {heads[0], heads[1], heads[2]};
  }
#endif
  return split_qkv_rope_composite(qkv, cos, sin, n_heads, n_kv_heads);
}

}  // namespace keel::model
