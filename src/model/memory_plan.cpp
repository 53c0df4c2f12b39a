#include "model/memory_plan.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "model/chunked_loss.h"
#include "model/fused_ops.h"

namespace keel::model {
namespace {

using config::ActivationCheckpointing;

struct BlockBytes {
  double kept = 0;        // per block, kept for the backward pass
  double recomputed = 0;  // of those, what selective recompute does not keep
};

// One transformer block's tensors kept for the backward pass, for a micro-batch of B x T tokens.
// `stream` is the residual stream's element size (fp32), `mm` a matmul output's (fp32, or the
// autocast dtype's).
BlockBytes block_bytes(const config::Config& cfg, bool cuda) {
  const auto& m = cfg.model;
  const double B = static_cast<double>(cfg.data.micro_batch_size);
  const double T = static_cast<double>(m.seq_len), N = B * T;
  const double C = static_cast<double>(m.d_model);
  const double H = static_cast<double>(m.n_heads);
  const double D = C / H;
  const double Hkv = static_cast<double>(config::effective_kv_heads(m));
  const double F = static_cast<double>(config::effective_d_ff(m));
  const bool fp32 = cfg.run.precision == config::Precision::kFp32;
  const bool llama = m.arch == config::Arch::kLlama;
  const double stream = 4, mm = fp32 ? 4 : 2;
  // The CPU's fused attention (fp32, no dropout, short sequences) keeps its probabilities.
  const double probs = B * H * T * T * 4;
  const bool fused_attention = !cuda && fp32 && m.dropout == 0.0 && m.seq_len <= kMaxAttentionSeq &&
                               probs <= static_cast<double>(kMaxAttentionProbsBytes);
  const bool fused_rope = !cuda && fp32 && llama && !config::qk_norm_on(m);

  BlockBytes b;
  b.kept += N * C * stream * 2;  // the block's input and the residual after attention (norm inputs)
  b.kept += N * C * mm * 2;      // the two norms' outputs (the qkv and fc projections' inputs)
  b.recomputed += N * C * mm * 2;
  // qkv: kept by the composite rotary (and as q, k, v's storage for gpt2); the fused kernel
  // writes q, k, v anew and lets it go.
  if (!fused_rope) b.kept += N * (H + 2 * Hkv) * D * mm;
  if (llama) b.kept += N * 3 * C * mm;  // q, k, v as attention reads them (k, v repeated to H)
  b.kept += N * C * mm * 2;             // attention's output, and merged heads (proj's input)
  b.kept += fused_attention ? probs : N * H * 4;  // probabilities, or the log-sum-exp
  b.kept += N * F * mm * (llama ? 2 : 1);         // fc's output (the activation's input)
  b.kept += N * F * mm;                           // the activation's output (proj's input)
  b.recomputed += N * F * mm;
  if (m.dropout > 0) b.kept += N * C * 2;  // two residual dropout masks, a byte each
  return b;
}

std::string bytes_text(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.0f} kB", bytes / 1e3);
}

// ZeRO-3's weights and gradients per rank. Units (distributed/sharded_parameters.h): the
// embedding, each block, the final norm with the head (tied: with the embedding).
void plan_zero3_states(const config::Config& cfg, double W, MemoryPlan& plan) {
  const auto& m = cfg.model;
  const double P = static_cast<double>(plan.parameters);
  const double V = static_cast<double>(m.vocab_size), C = static_cast<double>(m.d_model);
  const double embedding = V * C + (m.arch == config::Arch::kGpt2 ? m.seq_len * C : 0);
  const double norm = m.arch == config::Arch::kGpt2 ? 2 * C : C;
  const double head = m.tie_embeddings ? 0 : V * C;
  const double block = (P - embedding - norm - head) / static_cast<double>(m.n_layers);
  const double head_unit = m.tie_embeddings ? embedding + norm : head + norm;
  const double largest = std::max({embedding, block, head_unit});
  // Units are gathered in the compute dtype, so autocast makes no copies of the weights.
  const double compute = cfg.run.precision == config::Precision::kFp32 ? 4 : 2;
  plan.weights = 4 * P / W;
  plan.gathered = compute * std::max(2 * block + head_unit, embedding + block);
  // This rank's part of the mean; the .grad of the unit computing; at most two units' flat
  // gradients in reduction, with their incoming parts: consecutive units of the backward pass
  // (the head unit and the last block, blocks, the first block and the embedding).
  const double rd = cfg.distributed.reduce_dtype == config::ReduceDtype::kBf16 ? 2 : 4;
  const double in_flight = std::max({head_unit, embedding, block}) + block;
  plan.gradients = 4 * P / W + compute * largest + in_flight * rd * (1 + 1 / W);
}

}  // namespace

MemoryPlan plan_memory(const config::Config& cfg, const MemoryPlanOptions& options) {
  const auto& m = cfg.model;
  MemoryPlan plan;
  plan.parameters = config::parameter_count(m);
  const double P = static_cast<double>(plan.parameters);
  const double W = static_cast<double>(std::max<int64_t>(options.world_size, 1));
  plan.world_size = options.world_size;
  plan.graphs = options.cuda_graphs && options.cuda;
  plan.tokens = cfg.data.micro_batch_size * m.seq_len;
  const bool several = options.world_size > 1;
  const bool zero1 = cfg.distributed.zero >= 1 && several;
  const bool zero2 = cfg.distributed.zero >= 2 && several;
  const bool zero3 = cfg.distributed.zero >= 3 && several;

  plan.weights = 4 * P;
  if (zero3) {
    plan_zero3_states(cfg, W, plan);
  } else if (zero2) {
    // This rank's part of the mean, plus what is not yet reduced. A bucket holds up to
    // bucket_mb and one parameter more (the embedding or head, V x C, may be one alone).
    // Overlapped: at most GradReducer::kBucketsInFlight flat buffers, and the .grad waiting for
    // the next bucket. Otherwise every .grad exists until the buckets start after the pass.
    const double largest = static_cast<double>(m.vocab_size) * static_cast<double>(m.d_model) * 4;
    const double bucket = std::min(4 * P, cfg.distributed.bucket_mb * (1 << 20) + largest);
    plan.gradients =
        4 * P / W + (cfg.distributed.overlap ? std::min(4 * P, 3 * bucket) : 4 * P + bucket);
  } else {
    // .grad, and the reducer's flat buckets (several ranks): one more fp32 copy of every
    // gradient; sharded, plus this rank's part of the mean.
    plan.gradients = 4 * P + (several ? 4 * P : 0) + (zero1 ? 4 * P / W : 0);
  }
  plan.snapshot = 4 * P / (zero3 ? W : 1);
  const double state_per_param = cfg.optim.name == config::OptimizerName::kAdamW ? 8 : 4;
  plan.optimizer = state_per_param * P / (zero1 ? W : 1);
  if (cfg.run.precision != config::Precision::kFp32 && !zero3) plan.copies = 2 * P;

  const BlockBytes block = block_bytes(cfg, options.cuda);
  const double N = static_cast<double>(plan.tokens);
  const double C = static_cast<double>(m.d_model);
  const double V = static_cast<double>(m.vocab_size);
  const double L = static_cast<double>(m.n_layers);
  switch (m.activation_checkpointing) {
    case ActivationCheckpointing::kNone:
      plan.activations = L * block.kept;
      break;
    case ActivationCheckpointing::kSelective:
      plan.activations = L * (block.kept - block.recomputed);
      break;
    case ActivationCheckpointing::kFull:
      plan.activations = L * N * C * 4;  // each block's input
      // Later in the backward pass, once the loss's tensors are gone: one block rebuilt, with
      // the gradients of its activations.
      plan.recompute = 1.5 * block.kept;
      break;
  }
  plan.activations += N * C * 4 * 2;  // the final norm's input and output

  if (chunked_loss_in_effect(m, options.cuda)) {
    // Kept: each token's loss and log-sum-exp. At the start of the backward pass: one chunk's
    // recomputed logits and their gradient, the head's fp32 gradient and the hidden states'.
    const double rows = std::min<double>(N, static_cast<double>(loss_chunk_rows(m.vocab_size)));
    plan.logits = 2 * N * 4 + 2 * rows * V * 4 + V * C * 4 + N * C * 4;
  } else {
    // The kept fp32 log-probabilities, and at the start of the backward pass two gradients of
    // their size.
    plan.logits = 3 * N * V * 4;
  }
  return plan;
}

std::string format_memory_plan(const MemoryPlan& p, const config::Config& cfg) {
  return fmt::format(
      "memory plan per rank ({} rank{}, zero {}, activation_checkpointing {}, chunked_loss {}): "
      "weights {}{}, gradients {}, optimizer {}, weight copies {}, activations {} ({} tokens per "
      "micro-batch), loss {}{}, a logged step's weight snapshot {}{}; total {}\n",
      p.world_size, p.world_size == 1 ? "" : "s", cfg.distributed.zero,
      config::name_of(cfg.model.activation_checkpointing), config::name_of(cfg.model.chunked_loss),
      bytes_text(p.weights),
      p.gathered > 0 ? ", gathered units " + bytes_text(p.gathered) : std::string(),
      bytes_text(p.gradients), bytes_text(p.optimizer), bytes_text(p.copies),
      bytes_text(p.activations), p.tokens, bytes_text(p.logits),
      p.recompute > 0 ? ", a block recomputed " + bytes_text(p.recompute) : std::string(),
      bytes_text(p.snapshot), p.graphs ? " (CUDA graphs: on top of the pass's memory)" : "",
      bytes_text(p.total()));
}

std::optional<std::string> cheapest_fit(const config::Config& cfg, const MemoryPlanOptions& options,
                                        double budget) {
  config::Config c = cfg;
  std::vector<std::pair<std::string, std::string>> settings;  // key, value; in the order made
  auto set = [&](const std::string& key, const std::string& value) {
    for (auto& [k, v] : settings)
      if (k == key) return void(v = value);
    settings.emplace_back(key, value);
  };
  auto fits = [&] { return plan_memory(c, options).total() <= budget; };
  auto text = [&] {
    std::string out;
    for (const auto& [k, v] : settings) out += (out.empty() ? "" : ", ") + k + ": " + v;
    return out;
  };
  if (!chunked_loss_in_effect(c.model, options.cuda)) {
    c.model.chunked_loss = config::Switch::kOn;
    set("model.chunked_loss", "on");
    if (fits()) return text();
  }
  if (c.model.activation_checkpointing == ActivationCheckpointing::kNone) {
    c.model.activation_checkpointing = ActivationCheckpointing::kSelective;
    set("model.activation_checkpointing", "selective");
    if (fits()) return text();
  }
  if (c.model.activation_checkpointing != ActivationCheckpointing::kFull) {
    c.model.activation_checkpointing = ActivationCheckpointing::kFull;
    set("model.activation_checkpointing", "full");
    if (fits()) return text();
  }
  for (int64_t zero = c.distributed.zero + 1; options.world_size > 1 && zero <= 3; ++zero) {
    c.distributed.zero = zero;
    set("distributed.zero", std::to_string(zero));
    if (fits()) return text();
  }
  while (c.data.micro_batch_size % 2 == 0) {  // halved exactly: the global batch stays
    c.data.micro_batch_size /= 2;
    c.data.grad_accum_steps *= 2;
    set("data.micro_batch_size", std::to_string(c.data.micro_batch_size));
    set("data.grad_accum_steps", std::to_string(c.data.grad_accum_steps));
    if (c.data.grad_accum == config::GradAccum::kDynamic) {  // the same range of samples
      c.data.grad_accum_min *= 2;
      set("data.grad_accum_min", std::to_string(c.data.grad_accum_min));
      if (c.data.grad_accum_max != config::kAuto) {
        c.data.grad_accum_max *= 2;
        set("data.grad_accum_max", std::to_string(c.data.grad_accum_max));
      }
    }
    if (fits()) return text();
  }
  return std::nullopt;
}

double rollback_memory_limit(const config::Config& cfg, int local_ranks) {
  const int64_t mb = cfg.checkpoint.stable.memory_mb;
  if (mb != config::kAuto) return static_cast<double>(std::max<int64_t>(mb, 0)) * (1 << 20);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page) / 4 / std::max(local_ranks, 1);
}

double rollback_copies_bytes(const MemoryPlan& plan, double limit_bytes) {
  const double part = plan.weights + plan.optimizer;
  if (part <= 0 || limit_bytes < part) return 0;
  return limit_bytes >= 2 * part ? 2 * part : part;
}

std::string format_rollback_memory(const MemoryPlan& plan, const config::Config& cfg,
                                   double limit_bytes) {
  const double part = plan.weights + plan.optimizer;
  const double kept = rollback_copies_bytes(plan, limit_bytes);
  const std::string limit =
      cfg.checkpoint.stable.memory_mb == config::kAuto
          ? "auto: " + bytes_text(limit_bytes) + ", a quarter of this host's memory"
          : bytes_text(limit_bytes);
  if (kept == 0)
    return fmt::format(
        "host memory for rollbacks: none kept (a checkpoint part of {} per rank is more than "
        "checkpoint.stable.memory_mb, {}): a rollback reads the stable snapshot from the disk\n",
        bytes_text(part), limit);
  return fmt::format(
      "host memory for rollbacks: {} per rank ({} of the checkpoint part of {}: the newest stable "
      "snapshot{}, within checkpoint.stable.memory_mb, {}), on top of the plan{}\n",
      bytes_text(kept), kept > part ? "two copies" : "one copy", bytes_text(part),
      kept > part ? " and the newest checkpoint" : "", limit,
      cfg.run.device == config::Device::kCpu ? " (on the CPU the same memory)" : "");
}

}  // namespace keel::model
