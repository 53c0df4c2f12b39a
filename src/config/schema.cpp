// Derived quantities declared in schema.h. They live here, once, so that the model builder, the
// validator, the trainer and the benchmarks agree on what a 0 or an `auto` means and on how much
// a model costs.
#include "config/schema.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace keel::config {
namespace {

// Saturates instead of overflowing: a typo such as d_model: 1e12 must give a message, not UB.
int64_t to_int64(double v) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max());
  return v >= kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// Token embedding (plus the untied output head) and gpt2's learned positions: the parameters that
// the FLOPs count leaves out.
double embedding_parameters(const ModelConfig& m) {
  const double C = static_cast<double>(std::max<int64_t>(m.d_model, 0));
  const double V = static_cast<double>(std::max<int64_t>(m.vocab_size, 0));
  double embeddings = V * C * (m.tie_embeddings ? 1 : 2);
  if (m.arch == Arch::kGpt2) embeddings += static_cast<double>(std::max<int64_t>(m.seq_len, 0)) * C;
  return embeddings;
}

}  // namespace

int64_t effective_d_ff(const ModelConfig& m) {
  if (m.d_ff > 0) return m.d_ff;
  if (m.arch == Arch::kGpt2) return 4 * m.d_model;
  // llama: SwiGLU keeps the MLP's parameter count near a 4*C GELU MLP with 2/3 of 4*C, then rounds
  // up to a multiple of 64 for matmul-friendly shapes (as Meta's reference: floor first, then
  // round).
  constexpr int64_t kMultiple = 64;
  const int64_t hidden = 8 * m.d_model / 3;
  return (hidden + kMultiple - 1) / kMultiple * kMultiple;
}

int64_t effective_kv_heads(const ModelConfig& m) {
  return m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads;
}

int64_t parameter_count(const ModelConfig& m) {
  // C = d_model, H = heads, Hkv = key/value heads, D = head dim, F = MLP width.
  const double C = static_cast<double>(std::max<int64_t>(m.d_model, 0));
  const double L = static_cast<double>(std::max<int64_t>(m.n_layers, 0));
  const double H = static_cast<double>(std::max<int64_t>(m.n_heads, 1));
  const double Hkv = static_cast<double>(std::max<int64_t>(effective_kv_heads(m), 1));
  const double D = C / H;
  const double F = static_cast<double>(std::max<int64_t>(effective_d_ff(m), 0));
  const bool gpt2 = m.arch == Arch::kGpt2;

  const double embeddings = embedding_parameters(m);
  // Attention: q and o are C x C; k and v are C x (Hkv*D). gpt2 has biases, llama none.
  double attention = 2 * C * C + 2 * C * Hkv * D;
  if (gpt2) attention += 2 * C + 2 * Hkv * D;
  // MLP: llama's SwiGLU has gate, up and down; gpt2 has up and down with biases.
  const double mlp = gpt2 ? 2 * C * F + F + C : 3 * C * F;
  // Norms: two per layer plus a final one; LayerNorm (gpt2) has a bias, RMSNorm (llama) not.
  const double norm = gpt2 ? 2 * C : C;
  const double qk_norm = qk_norm_on(m) ? 2 * D : 0;
  return to_int64(embeddings + L * (attention + mlp + 2 * norm + qk_norm) + norm);
}

double flops_per_token(const ModelConfig& m) {
  const double C = static_cast<double>(std::max<int64_t>(m.d_model, 0));
  const double V = static_cast<double>(std::max<int64_t>(m.vocab_size, 0));
  const double L = static_cast<double>(std::max<int64_t>(m.n_layers, 0));
  const double T = static_cast<double>(std::max<int64_t>(m.seq_len, 0));
  // Embedding lookups cost no matmul FLOPs; the output projection (C x V) does, counted once
  // whether or not it is tied.
  const double non_embedding = static_cast<double>(parameter_count(m)) - embedding_parameters(m);
  return 6.0 * non_embedding + 12.0 * L * C * T + 6.0 * C * V;
}

int64_t warmup_steps(const ScheduleConfig& s, int64_t max_steps) {
  int64_t w = s.warmup_steps;
  if (w == kAuto) {
    w = s.kind == ScheduleKind::kThreePhase
            ? static_cast<int64_t>(std::llround(s.phases.warmup * static_cast<double>(max_steps)))
            : std::min<int64_t>(max_steps / 10, 2000);
  }
  return std::clamp<int64_t>(w, 0, std::max<int64_t>(max_steps, 0));
}

int64_t recovery_steps(const StabilityConfig& s, int64_t max_steps) {
  if (s.recovery.steps != kAuto) return s.recovery.steps;
  // The seed's ~200 steps at ¼ lr for a long run; a short run recovers over 5 % of its length.
  return std::clamp<int64_t>(max_steps / 20, 10, 200);
}

int64_t stuck_steps(const RollbackConfig& r, int64_t max_steps) {
  if (r.stuck_steps != kAuto) return r.stuck_steps;
  return std::max<int64_t>(100, max_steps / 4);
}

int64_t grad_accum_max(const DataConfig& d) {
  if (d.grad_accum_max != kAuto) return d.grad_accum_max;
  return 2 * std::max<int64_t>(d.grad_accum_steps, 1);
}

int64_t padded_vocab_size(int64_t data_vocab_size) {
  constexpr int64_t kMultiple = 64;
  return (std::max<int64_t>(data_vocab_size, 1) + kMultiple - 1) / kMultiple * kMultiple;
}

Config resolve_auto(Config c, std::optional<int64_t> data_vocab_size) {
  if (c.model.vocab_size == kAuto && data_vocab_size)
    c.model.vocab_size = padded_vocab_size(*data_vocab_size);
  c.model.qk_norm = qk_norm_on(c.model) ? Switch::kOn : Switch::kOff;
  c.schedule.warmup_steps = warmup_steps(c.schedule, c.run.max_steps);
  c.stability.recovery.steps = recovery_steps(c.stability, c.run.max_steps);
  c.stability.rollback.stuck_steps = stuck_steps(c.stability.rollback, c.run.max_steps);
  if (c.data.grad_accum == GradAccum::kDynamic) c.data.grad_accum_max = grad_accum_max(c.data);
  if (c.logging.tensorboard_every_steps == kAuto)
    c.logging.tensorboard_every_steps = std::max<int64_t>(c.logging.every_steps, 1);
  return c;
}

}  // namespace keel::config
