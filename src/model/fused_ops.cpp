#include "model/fused_ops.h"

#include "model/fused_kernels.h"
#include "model/kernel_config.h"  // generated: KEEL_HAVE_X86_KERNELS

namespace keel::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

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
    kernels::swiglu_forward_avx2(gate_up.const_data_ptr<float>(), out.mutable_data_ptr<float>(), rows, f);
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

}  // namespace keel::model
