// Decoder-only transformer in two flavours:
//   arch=llama: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention (n_kv_heads)
//   arch=gpt2:  LayerNorm, learned positions, GELU(tanh) MLP
// Causal attention goes through scaled_dot_product_attention. Legend: B batch, T sequence,
// C d_model, H heads, Hkv kv heads, D head dim, V vocabulary.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "config/schema.h"
#include "model/layers.h"
#include "model/unit_gate.h"

namespace keel::model {

struct LossOutput {
  torch::Tensor loss;             // () fp32: mean cross-entropy + z_loss term; what backward uses
  torch::Tensor ce_loss;          // () fp32: mean cross-entropy alone (detached)
  torch::Tensor per_sample_loss;  // (B) fp32: mean cross-entropy of each sequence (detached)
  // (B) fp32: each sequence's share of `loss` (its mean cross-entropy + z_loss term), with
  // gradient: a weighted mean of it trains on some samples of the batch and not others.
  torch::Tensor per_sample_objective;
};

// Keys and values of the positions a generation has seen, per layer (B, Hkv, T_seen, D), so each
// new token costs one position's forward instead of the whole sequence's.
struct KvCache {
  std::vector<torch::Tensor> k, v;  // per layer; undefined before the first forward_cached
  int64_t length = 0;               // positions cached
};

// The initial value of parameter `name` (fp32, its shape) of the model `cfg` describes, drawn from
// the global generator. The model draws its parameters in named_parameters() order; norms and
// biases draw nothing, so units initialized one by one in unit order (model/unit_gate.h) draw the
// same numbers as the whole model.
void initialize_parameter(const config::ModelConfig& cfg, const std::string& name,
                          torch::Tensor value);

class TransformerImpl : public torch::nn::Module {
 public:
  // kInitialized: parameters allocated and initialized. kDeferred: parameters shaped but holding
  // no memory (model/layers.h), to be given values before use (ZeRO-3 does so unit by unit).
  enum class Parameters { kInitialized, kDeferred };
  explicit TransformerImpl(const config::ModelConfig& cfg,
                           Parameters parameters = Parameters::kInitialized);

  // tokens (B, T) int64 -> logits (B, T, V)
  torch::Tensor forward(const torch::Tensor& tokens);
  // Generation: tokens (B, T_new) at positions cache.length .. cache.length + T_new - 1 -> logits
  // (B, T_new, V), appending their keys and values to `cache`. Inference only (call under
  // NoGradGuard, in eval mode); cache.length + T_new must not exceed model.seq_len.
  torch::Tensor forward_cached(const torch::Tensor& tokens, KvCache& cache);
  // inputs, targets (B, T) int64 -> losses; cross-entropy computed in fp32. With
  // model.chunked_loss in effect (uses_chunked_loss) the logits are never whole.
  LossOutput loss(const torch::Tensor& inputs, const torch::Tensor& targets);
  // model.chunked_loss resolved for the device the model runs on.
  bool uses_chunked_loss(const torch::Device& device) const;

  const config::ModelConfig& config() const { return cfg_; }
  int64_t num_parameters() const;  // unique parameters (tied weights counted once)
  // Model FLOPs per trained token (forward + backward): config::flops_per_token, the one formula.
  double flops_per_token() const;
  // Name prefix of each transformer layer's parameters ("layers.0.", ...), for per-layer
  // statistics.
  std::vector<std::string> layer_prefixes() const;
  // Whether training-mode forwards record the attention-output std (default on). The trainer
  // turns it on only for the steps whose statistics it reads, sparing a reduction per layer.
  void set_record_activation_stats(bool on);
  // Per layer, the std of the attention branch's output (after its projection) in the latest
  // recording training-mode forward; empty before the first. Reads the device: call at log steps
  // only.
  std::vector<double> attention_output_std() const;
  // The parameters by unit (model/unit_gate.h), and the gate every forward pass then goes
  // through (null: none; the gate must outlive its use).
  ParameterUnits parameter_units() const;
  void set_unit_gate(UnitGate* gate) { gate_ = gate; }

 private:
  void enter(int64_t unit) {
    if (gate_) gate_->enter(unit);
  }
  torch::Tensor leave(int64_t unit, const torch::Tensor& output) {
    return gate_ ? gate_->leave(unit, output) : output;
  }
  int64_t head_unit() const { return cfg_.tie_embeddings ? 0 : cfg_.n_layers + 1; }
  torch::Tensor hidden(const torch::Tensor& tokens);  // (B, T) -> (B, T, C) after the final norm
  const torch::Tensor& head_weight() const;           // (V, C): the head's, or the tied embedding
  LossOutput chunked_loss(const torch::Tensor& inputs, const torch::Tensor& targets);

  config::ModelConfig cfg_;
  // members defined in the .cpp's private nested modules
  Embedding tok_emb_{nullptr};
  Embedding pos_emb_{nullptr};  // gpt2 only
  torch::nn::ModuleList layers_{nullptr};
  torch::nn::AnyModule final_norm_;
  Linear lm_head_{nullptr};            // absent (nullptr) when tie_embeddings
  torch::Tensor rope_cos_, rope_sin_;  // llama only, (T, D/2) buffers
  UnitGate* gate_ = nullptr;
};
TORCH_MODULE(Transformer);

}  // namespace keel::model
