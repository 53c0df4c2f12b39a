#include "model/chunked_loss.h"

#include <ATen/autocast_mode.h>

#include <algorithm>

namespace keel::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The dtype the head's matmul runs in: the autocast dtype while autocast is on for the device,
// else the hidden states' own.
at::ScalarType matmul_dtype(const Tensor& hidden) {
  const auto device = hidden.device().type();
  if (at::autocast::is_autocast_enabled(device)) return at::autocast::get_autocast_dtype(device);
  return hidden.scalar_type();
}

Tensor chunk_logits(const Tensor& h, const Tensor& w) {  // (n, C) x (V, C) -> (n, V) fp32
  return at::mm(h, w.t()).to(torch::kFloat);
}

struct LinearCrossEntropy : torch::autograd::Function<LinearCrossEntropy> {
  static tensor_list forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                             const Tensor& targets, int64_t chunk_rows) {
    const auto dtype = matmul_dtype(hidden);
    // The casts autocast would make, made once: every chunk's matmul sees the same operands.
    const auto h = hidden.to(dtype), w = weight.to(dtype);
    const int64_t n = hidden.size(0);
    auto ce = at::empty({n}, hidden.options().dtype(torch::kFloat));
    auto lse = at::empty({n}, hidden.options().dtype(torch::kFloat));
    for (int64_t a = 0; a < n; a += chunk_rows) {
      const int64_t b = std::min(n, a + chunk_rows);
      const auto logits = chunk_logits(h.slice(0, a, b), w);
      const auto l = at::logsumexp(logits, 1);
      lse.slice(0, a, b).copy_(l);
      ce.slice(0, a, b).copy_(l - logits.gather(1, targets.slice(0, a, b).unsqueeze(1)).squeeze(1));
    }
    ctx->save_for_backward({hidden, weight, targets, lse});
    ctx->saved_data["chunk_rows"] = chunk_rows;
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    return {ce, lse};
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &hidden = saved[0], &weight = saved[1], &targets = saved[2], &lse = saved[3];
    const int64_t chunk_rows = ctx->saved_data["chunk_rows"].toInt();
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t n = hidden.size(0);
    const auto zeros = at::zeros({n}, lse.options());
    const Tensor g_ce = grads[0].defined() ? grads[0].to(torch::kFloat) : zeros;
    const Tensor g_lse = grads[1].defined() ? grads[1].to(torch::kFloat) : zeros;
    const auto h = hidden.to(dtype), w = weight.to(dtype);
    auto grad_hidden = at::empty_like(hidden);
    auto grad_weight = at::zeros(weight.sizes(), weight.options().dtype(torch::kFloat));
    for (int64_t a = 0; a < n; a += chunk_rows) {
      const int64_t b = std::min(n, a + chunk_rows);
      const auto hc = h.slice(0, a, b);
      const auto gce = g_ce.slice(0, a, b);
      // d/dlogits of ce·g_ce + lse·g_lse = softmax·(g_ce + g_lse) - onehot(target)·g_ce.
      auto d = (chunk_logits(hc, w) - lse.slice(0, a, b).unsqueeze(1)).exp_();
      d.mul_((gce + g_lse.slice(0, a, b)).unsqueeze(1));
      const auto target = targets.slice(0, a, b).unsqueeze(1);        // one index per row: scatter_
      d.scatter_(1, target, d.gather(1, target) - gce.unsqueeze(1));  // is deterministic
      const auto dd = d.to(dtype);
      grad_hidden.slice(0, a, b).copy_(at::mm(dd, w));
      grad_weight.add_(at::mm(dd.t(), hc).to(torch::kFloat));
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), Tensor(), Tensor()};
  }
};

}  // namespace

TokenLosses linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                                 int64_t chunk_rows) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
              "linear_cross_entropy: hidden (N, C) and weight (V, C)");
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == hidden.size(0),
              "linear_cross_entropy: targets (N)");
  TORCH_CHECK(chunk_rows >= 1, "linear_cross_entropy: chunk_rows >= 1");
  auto out = LinearCrossEntropy::apply(hidden, weight, targets, chunk_rows);
  return {out[0], out[1]};
}

int64_t loss_chunk_rows(int64_t vocab, int64_t chunk_bytes) {
  return std::max<int64_t>(1, chunk_bytes / (std::max<int64_t>(vocab, 1) * 4));
}

}  // namespace keel::model
