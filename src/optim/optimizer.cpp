// AdamW (fused kernel or multi-tensor `_foreach_` ops) and Lion over parameter groups.
// Hot-path rules: no .item(), no per-parameter host work beyond building tensor lists, state
// tensors allocated once. A step skipped on `found_inf` is decided on the device: the fused kernel
// reads the flag itself; the foreach paths compute into copies and commit them with `where`, so a
// skipped step leaves weights and state bit-identical even when the gradients hold inf/nan.
#include "optim/optimizer.h"

#include <utility>

#include "common/error.h"

namespace keel::optim {

using torch::Tensor;
using TensorVec = std::vector<Tensor>;

// ---- parameter groups --------------------------------------------------------------------------
namespace {

// The no-decay pattern `pattern` matches `name` directly, or through its module kind: keel names
// embedding tables "*_emb", so "embedding" also matches any name containing "emb".
bool matches_no_decay(const std::string& name, const std::string& pattern) {
  if (name.find(pattern) != std::string::npos) return true;
  return pattern == "embedding" && name.find("emb") != std::string::npos;
}

bool wants_no_decay(const std::string& name, const Tensor& p, const config::OptimConfig& cfg) {
  if (p.dim() <= 1) return true;  // biases, norm gains, scalars
  for (const auto& pattern : cfg.no_decay) {
    if (matches_no_decay(name, pattern)) return true;
  }
  return false;
}

}  // namespace

std::vector<ParamGroup> make_param_groups(
    const std::vector<std::pair<std::string, Tensor>>& named_params,
    const config::OptimConfig& cfg) {
  ParamGroup decay, no_decay;
  decay.weight_decay = cfg.weight_decay;
  no_decay.weight_decay = 0.0;
  for (const auto& [name, p] : named_params) {
    if (!p.requires_grad()) continue;
    auto& g = wants_no_decay(name, p, cfg) ? no_decay : decay;
    g.names.push_back(name);
    g.params.push_back(p);
  }
  std::vector<ParamGroup> groups;  // [decay, no_decay], empty groups dropped
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

void Optimizer::zero_grad() {
  // Setting grads to None frees them and lets the next backward write instead of accumulate.
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      if (!keep_gradients_)
        p.mutable_grad().reset();
      else if (p.grad().defined())
        p.mutable_grad().zero_();
    }
  }
}

// ---- shared machinery --------------------------------------------------------------------------
namespace {

Tensor zeros_fp32_like(const Tensor& p) {
  return torch::zeros_like(p, torch::dtype(torch::kFloat));
}

// The parameters of one group that received a gradient this step, with their state, as parallel
// lists for the multi-tensor kernels. Non-fp32 parameters are updated through fp32 copies that
// `write_back` copies into the originals.
struct Work {
  TensorVec params, grads, exp_avg, exp_avg_sq;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (original, fp32 copy)
  bool empty() const { return params.empty(); }
  void finish() {
    for (auto& [orig, copy] : write_back) orig.copy_(copy);
  }
};

Work gather(const ParamGroup& group, const TensorVec& exp_avg, const TensorVec* exp_avg_sq) {
  Work w;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const auto& p = group.params[i];
    const auto& g = p.grad();
    if (!g.defined()) continue;
    if (p.scalar_type() == torch::kFloat) {
      w.params.push_back(p);
    } else {
      w.params.push_back(p.detach().to(torch::kFloat));
      w.write_back.emplace_back(p, w.params.back());
    }
    w.grads.push_back(g.scalar_type() == torch::kFloat ? g : g.to(torch::kFloat));
    w.exp_avg.push_back(exp_avg[i]);
    if (exp_avg_sq) w.exp_avg_sq.push_back((*exp_avg_sq)[i]);
  }
  return w;
}

// dst[i] = skip ? dst[i] : src[i], elementwise on the device. `skip` is a () bool tensor.
void commit(TensorVec& dst, const TensorVec& src, const Tensor& skip) {
  for (size_t i = 0; i < dst.size(); ++i) at::where_out(dst[i], skip, dst[i], src[i]);
}

// found_inf arrives as (1) or () fp32 (the loss scaler makes (1)); broadcasting against 0-d step
// tensors needs ().
Tensor as_scalar_flag(const Tensor& found_inf, const Tensor& like) {
  return found_inf.to(like.device(), torch::kFloat).reshape({});
}

std::string state_key(size_t g, size_t i, const char* what) {
  return "group" + std::to_string(g) + ".param" + std::to_string(i) + "." + what;
}

// Copies state[key] into dst after checking it exists and has dst's shape.
void load_slot(const std::map<std::string, Tensor>& state, const std::string& key, Tensor& dst) {
  const auto it = state.find(key);
  if (it == state.end()) {
    throw CheckpointError("optimizer state: missing '" + key +
                          "'\nHINT: the checkpoint was written with a different optimizer, model "
                          "or no_decay setting; resume with the config it was written with");
  }
  if (it->second.sizes() != dst.sizes()) {
    throw CheckpointError("optimizer state: '" + key + "' has shape " +
                          c10::str(it->second.sizes()) + " but the model needs " +
                          c10::str(dst.sizes()) +
                          "\nHINT: the model config changed since the "
                          "checkpoint was written");
  }
  torch::NoGradGuard no_grad;
  dst.copy_(it->second);
}

void check_no_extra_keys(const std::map<std::string, Tensor>& state, size_t expected) {
  if (state.size() == expected) return;
  throw CheckpointError("optimizer state: " + std::to_string(state.size()) + " entries, expected " +
                        std::to_string(expected) +
                        "\nHINT: the checkpoint was written with a different optimizer or model");
}

bool fused_supported(const std::vector<ParamGroup>& groups) {
  for (const auto& g : groups) {
    for (const auto& p : g.params) {
      if (p.scalar_type() != torch::kFloat) return false;
      if (!p.device().is_cpu() && !p.device().is_cuda()) return false;
    }
  }
  return true;
}

double beta(const config::OptimConfig& cfg, size_t i) {
  if (cfg.betas.size() != 2) {
    throw ConfigError(
        "optim.betas: expected two values [beta1, beta2]\nHINT: e.g. betas: [0.9, 0.95]");
  }
  return cfg.betas[i];
}

// ---- AdamW -------------------------------------------------------------------------------------
// p <- p * (1 - lr*wd);  m <- lerp(m, g, 1-b1);  v <- b2*v + (1-b2)*g^2;
// p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// One step counter per group (a () fp32 tensor on the group's device), shared by its parameters:
// they always step together, and one counter lets the bias corrections be () tensors that the
// multi-tensor kernels broadcast on their fast path.
class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, const config::OptimConfig& cfg, bool fused)
      : Optimizer(std::move(groups)),
        beta1_(beta(cfg, 0)),
        beta2_(beta(cfg, 1)),
        eps_(cfg.eps),
        fused_(fused) {
    for (const auto& g : groups_) {
      State s;
      for (const auto& p : g.params) {
        s.exp_avg.push_back(zeros_fp32_like(p));
        s.exp_avg_sq.push_back(zeros_fp32_like(p));
      }
      const auto device = g.params.empty() ? torch::Device(torch::kCPU) : g.params[0].device();
      s.step = torch::zeros({}, torch::dtype(torch::kFloat).device(device));
      state_.push_back(std::move(s));
    }
  }

  void step(double lr, const std::optional<Tensor>& found_inf) override {
    torch::NoGradGuard no_grad;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      auto& s = state_[gi];
      Work w = gather(groups_[gi], s.exp_avg, &s.exp_avg_sq);
      if (w.empty()) continue;
      const double wd = groups_[gi].weight_decay;
      std::optional<Tensor> flag;
      if (found_inf) flag = as_scalar_flag(*found_inf, s.step);
      s.step.add_(1);
      if (fused_) {
        step_fused(w, s.step, lr, wd, flag);
      } else if (flag) {
        step_foreach_skippable(w, s.step, lr, wd, *flag);
      } else {
        step_foreach(w, s.step, lr, wd, /*in_place=*/true);
      }
      if (flag) s.step.sub_(*flag);  // t + 1 - 1 == t exactly for counts below 2^24
      w.finish();
    }
  }

  std::map<std::string, Tensor> state_dict() const override {
    std::map<std::string, Tensor> out;
    for (size_t g = 0; g < state_.size(); ++g) {
      out["group" + std::to_string(g) + ".step"] = state_[g].step.detach();
      for (size_t i = 0; i < state_[g].exp_avg.size(); ++i) {
        out[state_key(g, i, "exp_avg")] = state_[g].exp_avg[i].detach();
        out[state_key(g, i, "exp_avg_sq")] = state_[g].exp_avg_sq[i].detach();
      }
    }
    return out;
  }

  void load_state_dict(const std::map<std::string, Tensor>& state) override {
    size_t expected = 0;
    for (size_t g = 0; g < state_.size(); ++g) {
      load_slot(state, "group" + std::to_string(g) + ".step", state_[g].step);
      for (size_t i = 0; i < state_[g].exp_avg.size(); ++i) {
        load_slot(state, state_key(g, i, "exp_avg"), state_[g].exp_avg[i]);
        load_slot(state, state_key(g, i, "exp_avg_sq"), state_[g].exp_avg_sq[i]);
      }
      expected += 1 + 2 * state_[g].exp_avg.size();
    }
    check_no_extra_keys(state, expected);
  }

  std::string describe() const override { return fused_ ? "adamw(fused)" : "adamw(foreach)"; }

 private:
  struct State {
    TensorVec exp_avg, exp_avg_sq;  // fp32, shaped like each param
    Tensor step;                    // () fp32: updates applied so far (already incremented)
  };

  void step_fused(Work& w, const Tensor& step, double lr, double wd,
                  const std::optional<Tensor>& flag) {
    // The kernel takes one step tensor per parameter and only reads it; all alias the group's.
    const TensorVec steps(w.params.size(), step);
    at::_fused_adamw_(w.params, w.grads, w.exp_avg, w.exp_avg_sq, /*max_exp_avg_sqs=*/{}, steps, lr,
                      beta1_, beta2_, wd, eps_, /*amsgrad=*/false, /*maximize=*/false,
                      /*grad_scale=*/std::nullopt, /*found_inf=*/flag);
  }

  // Updated (params, exp_avg, exp_avg_sq): written in place, or, for a step that may be skipped,
  // computed out of place (no extra copies: each first op is out of place) for `commit`.
  struct Updated {
    TensorVec p, m, v;
  };
  Updated step_foreach(Work& w, const Tensor& step, double lr, double wd, bool in_place) {
    const auto& g = w.grads;
    Updated u;
    if (in_place) {
      u = {w.params, w.exp_avg, w.exp_avg_sq};
      if (wd != 0.0) at::_foreach_mul_(u.p, 1.0 - lr * wd);
      at::_foreach_lerp_(u.m, g, 1.0 - beta1_);
      at::_foreach_mul_(u.v, beta2_);
    } else {
      u.p = at::_foreach_mul(w.params, 1.0 - lr * wd);
      u.m = at::_foreach_lerp(w.exp_avg, g, 1.0 - beta1_);
      u.v = at::_foreach_mul(w.exp_avg_sq, beta2_);
    }
    at::_foreach_addcmul_(u.v, g, g, 1.0 - beta2_);
    // () tensors, so the step count never visits the host.
    const auto neg_inv_step_size = (at::pow(beta1_, step) - 1.0) / lr;  // -(1 - b1^t) / lr
    const auto inv_bc2_sqrt = (1.0 - at::pow(beta2_, step)).rsqrt();    // 1 / sqrt(1 - b2^t)
    auto denom = at::_foreach_sqrt(u.v);
    at::_foreach_mul_(denom, inv_bc2_sqrt);
    at::_foreach_add_(denom, eps_);
    at::_foreach_mul_(denom, neg_inv_step_size);
    at::_foreach_addcdiv_(u.p, u.m, denom);  // p += m / (-denom / step_size)
    return u;
  }

  void step_foreach_skippable(Work& w, const Tensor& step, double lr, double wd,
                              const Tensor& flag) {
    const auto u = step_foreach(w, step, lr, wd, /*in_place=*/false);
    const auto skip = flag.ne(0);
    commit(w.params, u.p, skip);
    commit(w.exp_avg, u.m, skip);
    commit(w.exp_avg_sq, u.v, skip);
  }

  double beta1_, beta2_, eps_;
  bool fused_;
  std::vector<State> state_;
};

// ---- Lion --------------------------------------------------------------------------------------
// c <- lerp(m, g, 1-b1);  p <- p * (1 - lr*wd) - lr * sign(c);  m <- lerp(m, g, 1-b2)
class Lion final : public Optimizer {
 public:
  Lion(std::vector<ParamGroup> groups, const config::OptimConfig& cfg)
      : Optimizer(std::move(groups)), beta1_(beta(cfg, 0)), beta2_(beta(cfg, 1)) {
    for (const auto& g : groups_) {
      TensorVec m;
      for (const auto& p : g.params) m.push_back(zeros_fp32_like(p));
      exp_avg_.push_back(std::move(m));
    }
  }

  void step(double lr, const std::optional<Tensor>& found_inf) override {
    torch::NoGradGuard no_grad;
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      Work w = gather(groups_[gi], exp_avg_[gi], nullptr);
      if (w.empty()) continue;
      const double wd = groups_[gi].weight_decay;
      if (found_inf) {
        const auto skip = as_scalar_flag(*found_inf, w.params[0]).ne(0);
        auto p = at::_foreach_mul(w.params, 1.0 - lr * wd);
        auto m = at::_foreach_lerp(w.exp_avg, w.grads, 1.0 - beta2_);
        update_params(p, w.grads, w.exp_avg, lr);
        commit(w.params, p, skip);
        commit(w.exp_avg, m, skip);
      } else {
        if (wd != 0.0) at::_foreach_mul_(w.params, 1.0 - lr * wd);
        update_params(w.params, w.grads, w.exp_avg, lr);
        at::_foreach_lerp_(w.exp_avg, w.grads, 1.0 - beta2_);
      }
      w.finish();
    }
  }

  std::map<std::string, Tensor> state_dict() const override {
    std::map<std::string, Tensor> out;
    for (size_t g = 0; g < exp_avg_.size(); ++g) {
      for (size_t i = 0; i < exp_avg_[g].size(); ++i) {
        out[state_key(g, i, "exp_avg")] = exp_avg_[g][i].detach();
      }
    }
    return out;
  }

  void load_state_dict(const std::map<std::string, Tensor>& state) override {
    size_t expected = 0;
    for (size_t g = 0; g < exp_avg_.size(); ++g) {
      for (size_t i = 0; i < exp_avg_[g].size(); ++i) {
        load_slot(state, state_key(g, i, "exp_avg"), exp_avg_[g][i]);
      }
      expected += exp_avg_[g].size();
    }
    check_no_extra_keys(state, expected);
  }

  std::string describe() const override { return "lion(foreach)"; }

 private:
  // p -= lr * sign(b1*m + (1-b1)*g), reading the momentum before its own update.
  void update_params(TensorVec& p, const TensorVec& g, const TensorVec& m, double lr) {
    auto c = at::_foreach_lerp(m, g, 1.0 - beta1_);
    at::_foreach_sign_(c);
    at::_foreach_add_(p, c, -lr);
  }

  double beta1_, beta2_;
  std::vector<TensorVec> exp_avg_;  // per group, fp32, shaped like each param
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(std::vector<ParamGroup> groups,
                                          const config::OptimConfig& cfg) {
  if (cfg.name == config::OptimizerName::kLion)
    return std::make_unique<Lion>(std::move(groups), cfg);
  const bool can_fuse = fused_supported(groups);
  if (cfg.fused == config::Switch::kOn && !can_fuse) {
    throw ConfigError(
        "optim.fused=on: the fused AdamW kernel needs fp32 parameters on CPU or "
        "CUDA\nHINT: set optim.fused to auto or off");
  }
  const bool fused =
      cfg.fused == config::Switch::kOn || (cfg.fused == config::Switch::kAuto && can_fuse);
  return std::make_unique<AdamW>(std::move(groups), cfg, fused);
}

}  // namespace keel::optim
