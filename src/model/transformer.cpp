// Decoder-only transformer (llama / gpt2 flavours). Legend: B batch, T sequence, C d_model,
// H heads, Hkv kv heads, D head dim (C / H), F MLP hidden size, V vocabulary, L layers.
// Parameter names are part of the contract: layers are "layers.<i>.", every norm parameter has
// "norm" in its name and every embedding "emb", so optim::make_param_groups can sort them.
#include "model/transformer.h"

#include <cmath>
#include <unordered_set>

#include "common/error.h"
#include "model/chunked_loss.h"
#include "model/fused_ops.h"
#include "model/layers.h"
#include "model/recompute.h"

namespace keel::model {
namespace {

namespace F = torch::nn::functional;
using torch::Tensor;

constexpr double kRopeBase = 10000.0;
constexpr double kNormEps = 1e-5;

bool is_llama(const config::ModelConfig& cfg) { return cfg.arch == config::Arch::kLlama; }

Tensor residual_dropout(const Tensor& x, double p, bool training) {
  if (p <= 0.0 || !training) return x;
  return F::dropout(x, F::DropoutFuncOptions().p(p).training(true));
}

// RMSNorm (weight only) or LayerNorm (weight and bias) over the last dimension.
class NormImpl : public torch::nn::Module {
 public:
  NormImpl(int64_t dim, bool rms, bool deferred) : dim_(dim), rms_(rms) {
    weight_ = register_parameter("weight", new_parameter({dim}, deferred));
    if (!rms_) bias_ = register_parameter("bias", new_parameter({dim}, deferred));
  }
  Tensor forward(const Tensor& x) {  // (..., dim) -> (..., dim)
    if (rms_) {
      // Under autocast a bf16/fp16 input (q, k from a linear) meets the fp32 gain; normalise in
      // fp32, which also keeps the fused kernel eligible, and hand back the input's dtype.
      if (x.scalar_type() == weight_.scalar_type()) return rms_norm(x, weight_, kNormEps);
      return rms_norm(x.to(weight_.scalar_type()), weight_, kNormEps).to(x.scalar_type());
    }
    return at::layer_norm(x, {dim_}, weight_, bias_, kNormEps);
  }

 private:
  int64_t dim_;
  bool rms_;
  Tensor weight_, bias_;
};
TORCH_MODULE(Norm);

// (B, Hkv, T, D) -> (B, Hkv * groups, T, D), kv head j serving query heads j*groups .. +groups-1
// (the repeat_interleave layout). Materialised so every SDPA backend stays eligible.
Tensor repeat_kv(const Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto B = x.size(0), Hkv = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, groups, T, D}).reshape({B, Hkv * groups, T, D});
}

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const config::ModelConfig& cfg, bool deferred)
      : n_heads_(cfg.n_heads),
        n_kv_heads_(config::effective_kv_heads(cfg)),
        head_dim_(cfg.d_model / cfg.n_heads),
        dropout_(cfg.dropout) {
    const bool bias = !is_llama(cfg);
    const int64_t qkv_out = (n_heads_ + 2 * n_kv_heads_) * head_dim_;
    qkv_ = register_module("qkv", Linear(cfg.d_model, qkv_out, bias, deferred));
    proj_ = register_module("proj", Linear(cfg.d_model, cfg.d_model, bias, deferred));
    if (config::qk_norm_on(cfg)) {
      q_norm_ = register_module("q_norm", Norm(head_dim_, /*rms=*/true, deferred));
      k_norm_ = register_module("k_norm", Norm(head_dim_, /*rms=*/true, deferred));
    }
  }

  // x (B, T, C); cos/sin (T_max, D/2) or undefined (no rotary) -> (B, T, C)
  Tensor forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
    return attend(model::linear(x, qkv_->weight, qkv_->bias), cos, sin);
  }
  // The rest of forward, from the qkv projection's output (B, T, (H + 2 Hkv) D).
  Tensor attend(const Tensor& qkv, const Tensor& cos, const Tensor& sin) {
    const int64_t B = qkv.size(0), T = qkv.size(1), D = head_dim_;
    Tensor q, k, v;                   // heads-first: (B, H, T, D), k and v (B, Hkv, T, D)
    if (cos.defined() && !q_norm_) {  // split and rotate in one pass where the kernel applies
      auto heads = split_qkv_rope(qkv, cos, sin, n_heads_, n_kv_heads_);
      q = std::move(heads.q);
      k = std::move(heads.k);
      v = std::move(heads.v);
    } else {
      auto parts = qkv.split({n_heads_ * D, n_kv_heads_ * D, n_kv_heads_ * D}, -1);
      q = parts[0].view({B, T, n_heads_, D});     // (B, T, H, D)
      k = parts[1].view({B, T, n_kv_heads_, D});  // (B, T, Hkv, D)
      v = parts[2].view({B, T, n_kv_heads_, D});
      if (q_norm_) {
        q = q_norm_(q);
        k = k_norm_(k);
      }
      if (cos.defined()) {
        q = apply_rope(q, cos, sin);
        k = apply_rope(k, cos, sin);
      }
      q = q.transpose(1, 2);
      k = k.transpose(1, 2);
      v = v.transpose(1, 2);
    }
    // Norms and rotary may have promoted q/k to fp32 under autocast; attention wants one dtype.
    q = q.to(v.scalar_type());
    k = repeat_kv(k.to(v.scalar_type()), n_heads_ / n_kv_heads_);
    v = repeat_kv(v, n_heads_ / n_kv_heads_);
    auto y = causal_attention(q, k, v, is_training() ? dropout_ : 0.0);  // (B, H, T, D)
    const auto merged = y.transpose(1, 2).reshape({B, T, n_heads_ * D});
    auto out = model::linear(merged, proj_->weight, proj_->bias);  // (B, T, C)
    if (is_training() && record_stats_) {
      // One small reduction kept on the device for the guard's drift check; read at log steps.
      torch::NoGradGuard no_grad;
      last_std_ = out.detach().std().to(torch::kFloat);
    }
    return out;
  }
  // Generation: x (B, T, C) at positions pos .. pos+T-1; the layer's cache (B, Hkv, pos, D) grows
  // by T. Same arithmetic as forward, without the fused training kernels.
  Tensor forward_cached(const Tensor& x, const Tensor& cos, const Tensor& sin, Tensor& k_cache,
                        Tensor& v_cache, int64_t pos) {
    const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
    const auto qkv = model::linear(x, qkv_->weight, qkv_->bias);  // (B, T, (H + 2 Hkv) D)
    auto parts = qkv.split({n_heads_ * D, n_kv_heads_ * D, n_kv_heads_ * D}, -1);
    Tensor q = parts[0].view({B, T, n_heads_, D});     // (B, T, H, D)
    Tensor k = parts[1].view({B, T, n_kv_heads_, D});  // (B, T, Hkv, D)
    Tensor v = parts[2].view({B, T, n_kv_heads_, D});
    if (q_norm_) {
      q = q_norm_(q);
      k = k_norm_(k);
    }
    if (cos.defined()) {  // the rotation of positions pos .. pos+T-1
      const auto c = cos.narrow(0, pos, T), s = sin.narrow(0, pos, T);
      q = apply_rope(q, c, s);
      k = apply_rope(k, c, s);
    }
    q = q.transpose(1, 2).to(v.scalar_type());  // (B, H, T, D)
    k = k.transpose(1, 2).to(v.scalar_type());  // (B, Hkv, T, D)
    v = v.transpose(1, 2);
    k_cache = k_cache.defined() ? torch::cat({k_cache, k}, 2) : k;  // (B, Hkv, pos+T, D)
    v_cache = v_cache.defined() ? torch::cat({v_cache, v}, 2) : v;
    const int64_t groups = n_heads_ / n_kv_heads_;
    const auto keys = repeat_kv(k_cache, groups), values = repeat_kv(v_cache, groups);
    Tensor y;      // (B, H, T, D)
    if (T == 1) {  // the newest position sees every cached one
      y = at::scaled_dot_product_attention(q, keys, values);
    } else {  // position pos+i sees positions 0 .. pos+i
      const auto allowed =
          torch::ones({T, pos + T}, x.options().dtype(torch::kBool)).tril(pos);  // (T, pos+T)
      y = at::scaled_dot_product_attention(q, keys, values, allowed);
    }
    return model::linear(y.transpose(1, 2).reshape({B, T, n_heads_ * D}), proj_->weight,
                         proj_->bias);
  }
  const Linear& qkv() const { return qkv_; }
  const Tensor& last_output_std() const { return last_std_; }  // () fp32 or undefined
  void set_record_stats(bool on) { record_stats_ = on; }

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
  double dropout_;
  Linear qkv_{nullptr}, proj_{nullptr};
  Norm q_norm_{nullptr}, k_norm_{nullptr};
  Tensor last_std_;
  bool record_stats_ = true;
};
TORCH_MODULE(Attention);

// A norm as a region that selective recompute reruns (model/recompute.h).
Region norm_region(const Norm& norm) {
  return [norm](const Tensor& t) { return norm.ptr()->forward(t); };
}

// llama: SwiGLU, fc holds gate and up side by side (C -> 2F); gpt2: GELU(tanh) with biases.
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const config::ModelConfig& cfg, bool deferred) : llama_(is_llama(cfg)) {
    const int64_t d_ff = config::effective_d_ff(cfg);
    const int64_t fc_out = llama_ ? 2 * d_ff : d_ff;
    fc_ = register_module("fc", Linear(cfg.d_model, fc_out, !llama_, deferred));
    proj_ = register_module("proj", Linear(d_ff, cfg.d_model, !llama_, deferred));
  }
  Tensor forward(const Tensor& x) {  // (B, T, C) -> (B, T, C)
    return model::linear(activation(model::linear(x, fc_->weight, fc_->bias)), proj_->weight,
                         proj_->bias);
  }
  // Selective recompute: the norm before fc and the activation before proj are computed again in
  // the backward pass; fc's output and the result are kept.
  Tensor forward_selective(const Tensor& x, const Norm& norm) {  // x before `norm`
    const auto h = recompute_then_linear(norm_region(norm), x, fc_->weight, fc_->bias);
    const bool llama = llama_;
    return recompute_then_linear([llama](const Tensor& t) { return activation(t, llama); }, h,
                                 proj_->weight, proj_->bias);
  }

 private:
  Tensor activation(const Tensor& h) const { return activation(h, llama_); }
  static Tensor activation(const Tensor& h, bool llama) {  // (B, T, 2F) or (B, T, F) -> (B, T, F)
    return llama ? swiglu(h) : F::gelu(h, F::GELUFuncOptions().approximate("tanh"));
  }

  bool llama_;
  Linear fc_{nullptr}, proj_{nullptr};
};
TORCH_MODULE(Mlp);

// Pre-norm residual block: x + drop(attn(norm(x))), then x + drop(mlp(norm(x))).
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const config::ModelConfig& cfg, bool deferred)
      : dropout_(cfg.dropout),
        selective_(cfg.activation_checkpointing == config::ActivationCheckpointing::kSelective) {
    attn_norm_ = register_module("attn_norm", Norm(cfg.d_model, is_llama(cfg), deferred));
    attn_ = register_module("attn", Attention(cfg, deferred));
    mlp_norm_ = register_module("mlp_norm", Norm(cfg.d_model, is_llama(cfg), deferred));
    mlp_ = register_module("mlp", Mlp(cfg, deferred));
  }
  Tensor forward(Tensor x, const Tensor& cos, const Tensor& sin) {  // (B, T, C) -> (B, T, C)
    if (selective_ && is_training()) return forward_selective(x, cos, sin);
    x = x + residual_dropout(attn_(attn_norm_(x), cos, sin), dropout_, is_training());
    return x + residual_dropout(mlp_(mlp_norm_(x)), dropout_, is_training());
  }
  // The norms and activations recomputed in the backward pass; matmul and attention outputs kept.
  Tensor forward_selective(Tensor x, const Tensor& cos, const Tensor& sin) {
    const auto qkv =
        recompute_then_linear(norm_region(attn_norm_), x, attn_->qkv()->weight, attn_->qkv()->bias);
    x = x + residual_dropout(attn_->attend(qkv, cos, sin), dropout_, true);
    return x + residual_dropout(mlp_->forward_selective(x, mlp_norm_), dropout_, true);
  }
  Tensor forward_cached(Tensor x, const Tensor& cos, const Tensor& sin, Tensor& k_cache,
                        Tensor& v_cache, int64_t pos) {
    x = x + attn_->forward_cached(attn_norm_(x), cos, sin, k_cache, v_cache, pos);
    return x + mlp_(mlp_norm_(x));
  }
  const Attention& attention() const { return attn_; }
  Attention& attention() { return attn_; }

 private:
  double dropout_;
  bool selective_;
  Norm attn_norm_{nullptr}, mlp_norm_{nullptr};
  Attention attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(Block);

void check_shape_config(const config::ModelConfig& cfg) {
  const int64_t kv = config::effective_kv_heads(cfg);
  if (cfg.n_heads <= 0 || cfg.d_model % cfg.n_heads != 0 || kv <= 0 || cfg.n_heads % kv != 0) {
    throw ConfigError(
        "model: d_model must be divisible by n_heads and n_heads by n_kv_heads (got "
        "d_model=" +
        std::to_string(cfg.d_model) + ", n_heads=" + std::to_string(cfg.n_heads) + ", n_kv_heads=" +
        std::to_string(kv) + ")\nHINT: e.g. d_model=128, n_heads=4, n_kv_heads=2");
  }
  if (is_llama(cfg) && (cfg.d_model / cfg.n_heads) % 2 != 0) {
    throw ConfigError("model: rotary embeddings need an even head dim (d_model / n_heads)");
  }
}

// cos/sin tables (T, D/2) fp32 for positions 0..T-1.
std::pair<Tensor, Tensor> rope_tables(int64_t seq_len, int64_t head_dim) {
  const auto inv_freq =
      torch::pow(kRopeBase, -torch::arange(0, head_dim, 2, torch::kDouble) / head_dim);  // (D/2)
  const auto angles = torch::outer(torch::arange(seq_len, torch::kDouble), inv_freq);    // (T, D/2)
  return {angles.cos().to(torch::kFloat), angles.sin().to(torch::kFloat)};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

// normal(0, init_std) for weights; output projections of attention and MLP get
// init_std / sqrt(2 L) so the residual stream's variance does not grow with depth; zeros for
// biases, ones for norm gains. Only the weights draw random numbers.
void initialize_parameter(const config::ModelConfig& cfg, const std::string& name,
                          torch::Tensor value) {
  torch::NoGradGuard no_grad;
  const double out_std = cfg.init_std / std::sqrt(2.0 * static_cast<double>(cfg.n_layers));
  if (name.find("norm") != std::string::npos) {
    ends_with(name, ".bias") ? value.zero_() : value.fill_(1.0);
  } else if (ends_with(name, ".bias")) {
    value.zero_();
  } else if (ends_with(name, "attn.proj.weight") || ends_with(name, "mlp.proj.weight")) {
    value.normal_(0.0, out_std);
  } else {
    value.normal_(0.0, cfg.init_std);
  }
}

TransformerImpl::TransformerImpl(const config::ModelConfig& cfg, Parameters parameters)
    : cfg_(cfg) {
  check_shape_config(cfg_);
  const bool deferred = parameters == Parameters::kDeferred;
  tok_emb_ = register_module("tok_emb", Embedding(cfg_.vocab_size, cfg_.d_model, deferred));
  if (!is_llama(cfg_)) {
    pos_emb_ = register_module("pos_emb", Embedding(cfg_.seq_len, cfg_.d_model, deferred));
  } else {
    auto [cos, sin] = rope_tables(cfg_.seq_len, cfg_.d_model / cfg_.n_heads);
    rope_cos_ = register_buffer("rope_cos", cos);
    rope_sin_ = register_buffer("rope_sin", sin);
  }
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg_.n_layers; ++i) layers_->push_back(Block(cfg_, deferred));
  final_norm_ = torch::nn::AnyModule(Norm(cfg_.d_model, is_llama(cfg_), deferred));
  register_module("final_norm", final_norm_.ptr());
  if (!cfg_.tie_embeddings)
    lm_head_ = register_module("lm_head", Linear(cfg_.d_model, cfg_.vocab_size, false, deferred));
  if (deferred) return;
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) initialize_parameter(cfg_, item.key(), item.value());
}

torch::Tensor TransformerImpl::hidden(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > cfg_.seq_len) {
    throw DataError("model: sequence of " + std::to_string(T) +
                    " tokens is longer than model.seq_len=" + std::to_string(cfg_.seq_len) +
                    "\nHINT: raise model.seq_len or feed shorter sequences");
  }
  enter(0);
  // The residual stream is fp32 even where the weights are gathered in bf16 (ZeRO-3).
  auto x = tok_emb_(tokens).to(torch::kFloat);  // (B, T, C)
  if (pos_emb_) x = x + pos_emb_(torch::arange(T, tokens.options().dtype(torch::kLong)));
  x = leave(0, x);
  const bool full =
      cfg_.activation_checkpointing == config::ActivationCheckpointing::kFull && is_training();
  for (size_t i = 0; i < layers_->size(); ++i) {
    BlockImpl* block = layers_[i]->as<BlockImpl>();
    const auto unit = static_cast<int64_t>(i) + 1;
    enter(unit);
    if (full) {
      x = recompute([block, cos = rope_cos_,
                     sin = rope_sin_](const Tensor& t) { return block->forward(t, cos, sin); },
                    x);
    } else {
      x = block->forward(x, rope_cos_, rope_sin_);
    }
    x = leave(unit, x);
  }
  enter(head_unit());  // left by the caller, once the head has run
  return final_norm_.forward<Tensor>(x);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens) {
  return leave(head_unit(), model::linear(hidden(tokens), head_weight()));  // (B, T, V)
}

const torch::Tensor& TransformerImpl::head_weight() const {
  return lm_head_ ? lm_head_->weight : tok_emb_->weight;  // (V, C)
}

bool TransformerImpl::uses_chunked_loss(const torch::Device& device) const {
  return chunked_loss_in_effect(cfg_, device.is_cuda());
}

torch::Tensor TransformerImpl::forward_cached(const torch::Tensor& tokens, KvCache& cache) {
  const int64_t T = tokens.size(1), pos = cache.length;
  if (pos + T > cfg_.seq_len) {
    throw DataError("model: generating position " + std::to_string(pos + T - 1) +
                    " is beyond model.seq_len=" + std::to_string(cfg_.seq_len) +
                    "\nHINT: slide the context window (model::generate does)");
  }
  cache.k.resize(layers_->size());
  cache.v.resize(layers_->size());
  enter(0);
  // The residual stream is fp32 even where the weights are gathered in bf16 (ZeRO-3).
  auto x = tok_emb_(tokens).to(torch::kFloat);  // (B, T, C)
  if (pos_emb_) x = x + pos_emb_(torch::arange(pos, pos + T, tokens.options().dtype(torch::kLong)));
  x = leave(0, x);
  for (size_t i = 0; i < layers_->size(); ++i) {
    const auto unit = static_cast<int64_t>(i) + 1;
    enter(unit);
    x = layers_[i]->as<BlockImpl>()->forward_cached(x, rope_cos_, rope_sin_, cache.k[i], cache.v[i],
                                                    pos);
    x = leave(unit, x);
  }
  cache.length = pos + T;
  enter(head_unit());
  x = final_norm_.forward(x);
  return leave(head_unit(), model::linear(x, head_weight()));  // (B, T, V)
}

LossOutput TransformerImpl::loss(const torch::Tensor& inputs, const torch::Tensor& targets) {
  if (uses_chunked_loss(inputs.device())) return chunked_loss(inputs, targets);
  const auto logits = forward(inputs);  // (B, T, V), possibly low precision under autocast
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  const auto lf = logits.reshape({B * T, V}).to(torch::kFloat);  // cross-entropy in fp32
  const auto tgt = targets.reshape({B * T});
  Tensor ce_tok, loss, per_sample;  // (B*T), (), (B)
  if (cfg_.z_loss > 0.0) {
    // Share log Z between the cross-entropy (log Z - logit[target]) and the z-loss (log Z)^2.
    const auto lse = torch::logsumexp(lf, -1);
    ce_tok = lse - lf.gather(1, tgt.unsqueeze(1)).squeeze(1);
    loss = ce_tok.mean() + cfg_.z_loss * lse.square().mean();
    per_sample = (ce_tok + cfg_.z_loss * lse.square()).view({B, T}).mean(1);
  } else {
    ce_tok = F::cross_entropy(lf, tgt, F::CrossEntropyFuncOptions().reduction(torch::kNone));
    loss = ce_tok.mean();
    per_sample = ce_tok.view({B, T}).mean(1);
  }
  const auto ce_det = ce_tok.detach();
  return {loss, ce_det.mean(), ce_det.view({B, T}).mean(1), per_sample};
}

LossOutput TransformerImpl::chunked_loss(const torch::Tensor& inputs,
                                         const torch::Tensor& targets) {
  const auto h = hidden(inputs);  // (B, T, C)
  const int64_t B = h.size(0), T = h.size(1), V = head_weight().size(0);
  const auto tok = linear_cross_entropy(h.reshape({B * T, h.size(2)}), head_weight(),
                                        targets.reshape({B * T}), loss_chunk_rows(V));
  Tensor loss = tok.ce.mean(), objective = tok.ce;
  if (cfg_.z_loss > 0.0) {
    loss = loss + cfg_.z_loss * tok.lse.square().mean();
    objective = tok.ce + cfg_.z_loss * tok.lse.square();
  }
  loss = leave(head_unit(), loss);
  const auto ce_det = tok.ce.detach();
  return {loss, ce_det.mean(), ce_det.view({B, T}).mean(1), objective.view({B, T}).mean(1)};
}

int64_t TransformerImpl::num_parameters() const {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

double TransformerImpl::flops_per_token() const { return config::flops_per_token(cfg_); }

std::vector<std::string> TransformerImpl::layer_prefixes() const {
  std::vector<std::string> out;
  for (int64_t i = 0; i < cfg_.n_layers; ++i) out.push_back("layers." + std::to_string(i) + ".");
  return out;
}

ParameterUnits TransformerImpl::parameter_units() const {
  ParameterUnits units;
  units.names.resize(static_cast<size_t>(cfg_.n_layers) + (cfg_.tie_embeddings ? 1 : 2));
  units.head = head_unit();
  units.weights_in_backward.assign(units.names.size(), true);
  units.weights_in_backward[0] = cfg_.tie_embeddings;  // tied: the head's weight and final norm
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    size_t unit = 0;
    if (name.rfind("layers.", 0) == 0)
      unit = std::stoul(name.substr(7)) + 1;  // "layers.<i>.…"
    else if (name.rfind("final_norm.", 0) == 0 || name.rfind("lm_head.", 0) == 0)
      unit = static_cast<size_t>(units.head);
    units.names[unit].push_back(name);
  }
  return units;
}

void TransformerImpl::set_record_activation_stats(bool on) {
  for (const auto& layer : *layers_) layer->as<BlockImpl>()->attention()->set_record_stats(on);
}

std::vector<double> TransformerImpl::attention_output_std() const {
  std::vector<Tensor> stds;  // one () per layer
  for (const auto& layer : *layers_) {
    const auto& s = layer->as<BlockImpl>()->attention()->last_output_std();
    if (!s.defined()) return {};
    stds.push_back(s);
  }
  if (stds.empty()) return {};
  const auto host = at::stack(stds).to(torch::kCPU, torch::kDouble);  // one sync for all layers
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

}  // namespace keel::model
