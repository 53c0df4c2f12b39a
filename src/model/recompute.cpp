#include "model/recompute.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>

namespace keel::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The state a recomputation must see again: autocast on the region's device, and its RNG.
struct ForwardState {
  at::DeviceType device = at::kCPU;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
  Tensor rng;  // the device generator's state before the first run

  static ForwardState capture(const Tensor& x) {
    ForwardState s;
    s.device = x.device().type();
    s.autocast = at::autocast::is_autocast_enabled(s.device);
    s.autocast_dtype = at::autocast::get_autocast_dtype(s.device);
    auto gen = at::globalContext().defaultGenerator(x.device());
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.rng = gen.get_state();
    return s;
  }
};

// Within its lifetime the thread runs as the first forward did; the state before comes back
// after (the generator too: recomputing must not move the run's random stream).
class Replay {
 public:
  Replay(const ForwardState& s, const torch::Device& device)
      : device_type_(s.device), gen_(at::globalContext().defaultGenerator(device)) {
    prev_autocast_ = at::autocast::is_autocast_enabled(s.device);
    prev_dtype_ = at::autocast::get_autocast_dtype(s.device);
    at::autocast::set_autocast_enabled(s.device, s.autocast);
    at::autocast::set_autocast_dtype(s.device, s.autocast_dtype);
    if (s.autocast) at::autocast::increment_nesting();
    autocast_ = s.autocast;
    std::lock_guard<std::mutex> lock(gen_.mutex());
    prev_rng_ = gen_.get_state();
    gen_.set_state(s.rng);
  }
  ~Replay() {
    {
      std::lock_guard<std::mutex> lock(gen_.mutex());
      gen_.set_state(prev_rng_);
    }
    at::autocast::set_autocast_enabled(device_type_, prev_autocast_);
    at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
    if (autocast_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  }
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

 private:
  at::DeviceType device_type_;
  at::Generator gen_;
  Tensor prev_rng_;
  bool prev_autocast_ = false, autocast_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// The region and the state it ran in, carried from forward to backward in the context.
struct RegionHolder : torch::CustomClassHolder {
  Region fn;
  ForwardState state;
};

c10::intrusive_ptr<RegionHolder> holder_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<RegionHolder>(ctx->saved_data["region"].toCapsule());
}

void keep_region(AutogradContext* ctx, Region fn, const Tensor& x) {
  auto holder = c10::make_intrusive<RegionHolder>();
  holder->fn = std::move(fn);
  holder->state = ForwardState::capture(x);
  ctx->saved_data["region"] = c10::IValue::make_capsule(holder);
}

// Runs the region again on a detached copy of `x` that records its gradient.
std::pair<Tensor, Tensor> rerun(AutogradContext* ctx, const Tensor& x) {
  auto holder = holder_of(ctx);
  Tensor input = x.detach().requires_grad_(x.requires_grad());
  Replay replay(holder->state, x.device());
  torch::AutoGradMode grad(true);
  return {input, holder->fn(input)};
}

struct Recompute : torch::autograd::Function<Recompute> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, Region fn) {
    keep_region(ctx, fn, x);
    ctx->save_for_backward({x});
    torch::NoGradGuard no_grad;
    return fn(x);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const Tensor x = ctx->get_saved_variables()[0];
    auto [input, output] = rerun(ctx, x);
    torch::autograd::backward({output}, {grads[0]});
    return {input.grad(), Tensor()};
  }
};

struct RecomputeThenLinear : torch::autograd::Function<RecomputeThenLinear> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, Region fn) {
    keep_region(ctx, fn, x);
    ctx->save_for_backward({x, weight, bias});
    torch::NoGradGuard no_grad;
    // Under autocast: in its dtype, as a plain linear.
    return at::linear(fn(x), weight, bias.numel() > 0 ? bias : Tensor());
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1], &bias = saved[2];
    auto [input, h] = rerun(ctx, x);
    // The matmul's gradients in the dtype the forward ran it in (the output's), as autograd
    // would compute them through autocast's casts.
    const Tensor g = grads[0];
    const auto dtype = g.scalar_type();
    const Tensor g2 = g.reshape({-1, g.size(-1)});
    const Tensor h2 = h.detach().to(dtype).reshape({-1, h.size(-1)});
    const Tensor w = weight.to(dtype);
    Tensor grad_weight = at::mm(g2.t(), h2).to(weight.scalar_type());
    Tensor grad_bias = bias.numel() > 0 ? g2.sum(0).to(bias.scalar_type()) : Tensor();
    Tensor grad_h = at::mm(g2, w).view(h.sizes()).to(h.scalar_type());
    if (h.requires_grad())
      torch::autograd::backward({h}, {grad_h});  // else fn has nothing to train
    return {input.grad(), grad_weight, grad_bias, Tensor()};
  }
};

}  // namespace

Tensor recompute(Region fn, const Tensor& x) {
  if (!torch::GradMode::is_enabled()) return fn(x);
  // The region's output records a gradient only through x: with an x that records none, the
  // parameters inside would silently get none.
  TORCH_CHECK(x.requires_grad(),
              "recompute: the region's input does not require grad, so its parameters would get "
              "no gradient");
  return Recompute::apply(x, std::move(fn));
}

Tensor recompute_then_linear(Region fn, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!torch::GradMode::is_enabled()) return at::linear(fn(x), weight, bias);
  // An autograd function's inputs must be defined tensors: no bias is an empty one.
  const Tensor b = bias.defined() ? bias : at::empty({0}, weight.options());
  return RecomputeThenLinear::apply(x, weight, b, std::move(fn));
}

}  // namespace keel::model
