// The pre-launch checks of validate.h. One function per config section states its rules through a
// Checker, which attaches each key's location (LoadedConfig::where) and words the messages the same
// way everywhere: what the key must be, and what it was. Errors come first, then warnings, each by
// location.
#include "config/validate.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <tuple>

namespace keel::config {
namespace {

namespace fs = std::filesystem;

// Shortest round-trip text of a double, so messages show exactly what the user wrote ("3e-4",
// not to_chars' "3e-04").
std::string num(double v) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, v);
  std::string text(buffer, end);
  const size_t exponent = text.find('e');
  if (exponent == std::string::npos) return text;
  const size_t digits = exponent + 2;  // after the sign
  while (text.size() > digits + 1 && text[digits] == '0') text.erase(digits, 1);
  if (text[exponent + 1] == '+') text.erase(exponent + 1, 1);
  return text;
}
std::string num(int64_t v) { return std::to_string(v); }
// Three significant digits, for a computed suggestion rather than a value the user wrote.
std::string approx(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", v);
  return buffer;
}

std::string human_bytes(double bytes) {
  char buffer[32];
  if (bytes >= 1e12) {
    std::snprintf(buffer, sizeof buffer, "%.1f TB", bytes / 1e12);
  } else if (bytes >= 1e9) {
    std::snprintf(buffer, sizeof buffer, "%.1f GB", bytes / 1e9);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1f MB", bytes / 1e6);
  }
  return buffer;
}

std::string human_count(double n) {
  char buffer[32];
  if (n >= 1e9) {
    std::snprintf(buffer, sizeof buffer, "%.1fB", n / 1e9);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.1fM", n / 1e6);
  }
  return buffer;
}

// Saturates instead of overflowing: a typo such as d_model: 1e12 must give a message, not UB.
int64_t to_int64(double v) {
  constexpr double kMax = static_cast<double>(std::numeric_limits<int64_t>::max());
  return v >= kMax ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(v);
}

// fp32 weights once, and the optimizer's fp32 moments (AdamW two, Lion one) once per rank, or
// once in all under ZeRO-1 and 2, whose ranks each write their part.
int64_t checkpoint_bytes_for(const Config& cfg, int64_t parameters, int64_t world_size) {
  const double moments = cfg.optim.name == OptimizerName::kLion ? 1 : 2;
  const double copies =
      cfg.distributed.zero >= 1 ? 1.0 : static_cast<double>(std::max<int64_t>(world_size, 1));
  const double bytes_per_parameter = 4 + 4 * moments * copies;
  // Trainer state, manifest, config, RNG states and safetensors headers: ~30 kB measured on the
  // tiny model (a few hundred bytes per tensor name plus ~5 kB of CPU RNG state).
  constexpr double kStateBytes = 64 << 10;
  return to_int64(static_cast<double>(parameters) * bytes_per_parameter + kStateBytes);
}

// Collects diagnostics; every rule is phrased "must be ..." with the value found. Comparisons are
// written so that NaN fails them.
class Checker {
 public:
  explicit Checker(const LoadedConfig& loaded) : loaded_(loaded) {}

  void error(const std::string& key, const std::string& message) {
    out_.push_back({Diagnostic::Severity::kError, key, loaded_.where(key), message});
  }
  void warning(const std::string& key, const std::string& message) {
    out_.push_back({Diagnostic::Severity::kWarning, key, loaded_.where(key), message});
  }

  void at_least(const std::string& key, int64_t value, int64_t min) {
    if (value < min) error(key, "must be >= " + num(min) + " (got " + num(value) + ")");
  }
  // A key that also takes `auto` (kAuto).
  void auto_or_at_least(const std::string& key, int64_t value, int64_t min) {
    if (value != kAuto && value < min)
      error(key, "must be auto or >= " + num(min) + " (got " + num(value) + ")");
  }

  // value in the interval from lo to hi; `open` ends exclude their bound.
  enum class Ends { kClosed, kOpen, kOpenLow, kOpenHigh };
  void in_range(const std::string& key, double value, double lo, double hi, Ends ends) {
    const bool low_open = ends == Ends::kOpen || ends == Ends::kOpenLow;
    const bool high_open = ends == Ends::kOpen || ends == Ends::kOpenHigh;
    const bool ok = (low_open ? value > lo : value >= lo) && (high_open ? value < hi : value <= hi);
    if (ok) return;
    const std::string range = std::string(low_open ? "(" : "[") + num(lo) + ", " +
                              (std::isinf(hi) ? "inf" : num(hi)) + (high_open ? ")" : "]");
    error(key, "must be in " + range + " (got " + num(value) + ")");
  }
  void positive(const std::string& key, double value) {
    if (!(value > 0)) error(key, "must be > 0 (got " + num(value) + ")");
  }

  const LoadedConfig& loaded() const { return loaded_; }
  std::vector<Diagnostic>& diagnostics() { return out_; }

 private:
  const LoadedConfig& loaded_;
  std::vector<Diagnostic> out_;
};

using Ends = Checker::Ends;
constexpr double kInf = std::numeric_limits<double>::infinity();

void check_run(Checker& c, const RunConfig& run) {
  if (run.name.empty()) c.error("run.name", "must not be empty (it names the run directory)");
  c.at_least("run.max_steps", run.max_steps, 1);
  c.at_least("run.threads", run.threads, 0);
  c.positive("run.fp16_initial_scale", run.fp16_initial_scale);
  c.at_least("run.fp16_growth_interval", run.fp16_growth_interval, 1);
  if (run.precision == Precision::kFp16)
    c.warning("run.precision", "fp16 needs loss scaling; bf16 is safer where supported");
}

void check_model_shape(Checker& c, const ModelConfig& m) {
  if (m.d_model < 1 || m.n_heads < 1) return;  // already reported as ranges
  if (m.d_model % m.n_heads != 0) {
    c.error("model.n_heads", "must divide model.d_model (" + num(m.d_model) +
                                 ") evenly, since the "
                                 "head dim is d_model / n_heads (got " +
                                 num(m.n_heads) + ")");
    return;
  }
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0) {
    c.error("model.n_kv_heads", "must divide model.n_heads (" + num(m.n_heads) +
                                    ") so query heads "
                                    "share key/value heads evenly (got " +
                                    num(m.n_kv_heads) + ")");
  }
  const int64_t head_dim = m.d_model / m.n_heads;
  if (m.arch == Arch::kLlama && head_dim % 2 != 0) {
    c.error("model.d_model",
            "llama's rotary embedding (RoPE) needs an even head dim, but d_model / "
            "n_heads = " +
                num(head_dim));
  }
}

void check_model(Checker& c, const ModelConfig& m, const DataConfig& d) {
  c.auto_or_at_least("model.vocab_size", m.vocab_size, 2);
  if (m.vocab_size == kAuto && d.source == DataSource::kSynthetic)
    c.error("model.vocab_size",
            "auto takes the vocabulary of prepared shards (data.source: shards); the synthetic "
            "source has none of its own: give a number");
  if (m.vocab_size == kAuto && (d.source == DataSource::kMegatron || d.source == DataSource::kLlmc))
    c.error("model.vocab_size",
            "auto takes the vocabulary of prepared shards; pre-tokenized data (data.source: " +
                std::string(name_of(d.source)) +
                ") does not record its tokenizer's: give it (50257 for GPT-2's, 128256 for Llama "
                "3's; a multiple of 64 above it, such as 50304, runs faster)");
  c.at_least("model.d_model", m.d_model, 1);
  c.at_least("model.n_layers", m.n_layers, 1);
  c.at_least("model.n_heads", m.n_heads, 1);
  c.at_least("model.n_kv_heads", m.n_kv_heads, 0);
  c.at_least("model.seq_len", m.seq_len, 1);
  c.at_least("model.d_ff", m.d_ff, 0);
  c.in_range("model.dropout", m.dropout, 0, 1, Ends::kOpenHigh);
  c.in_range("model.z_loss", m.z_loss, 0, kInf, Ends::kOpenHigh);
  c.positive("model.init_std", m.init_std);
  check_model_shape(c, m);
}

void check_loader(Checker& c, const LoaderConfig& l) {
  c.at_least("data.loader.workers", l.workers, 0);
  c.at_least("data.loader.queue_capacity", l.queue_capacity, 1);
  // The loader refills when the queue drops to low and pauses producers at high: 0 <= low < high <=
  // capacity.
  if (l.low_watermark < 0) {
    c.at_least("data.loader.low_watermark", l.low_watermark, 0);
  } else if (l.low_watermark >= l.high_watermark) {
    c.error("data.loader.low_watermark", "must be below data.loader.high_watermark (" +
                                             num(l.high_watermark) + ") (got " +
                                             num(l.low_watermark) + ")");
  }
  if (l.high_watermark > l.queue_capacity) {
    c.error("data.loader.high_watermark", "must be <= data.loader.queue_capacity (" +
                                              num(l.queue_capacity) + ") (got " +
                                              num(l.high_watermark) + ")");
  }
  c.positive("data.loader.stall_timeout_s", l.stall_timeout_s);
}

void check_data(Checker& c, const DataConfig& d) {
  if (d.source == DataSource::kShards && d.path.empty()) {
    c.error("data.source",
            "shards needs data.path, the directory `keel prepare` wrote (it is empty)");
  }
  if (d.source == DataSource::kMegatron && d.path.empty())
    c.error("data.source",
            "megatron needs data.path, the prefix of a .bin/.idx pair (it is empty)");
  if (d.source == DataSource::kLlmc && d.path.empty())
    c.error("data.source",
            "llmc needs data.path: an llm.c .bin shard, a directory of them or a glob pattern "
            "(it is empty)");
  c.at_least("data.micro_batch_size", d.micro_batch_size, 1);
  c.at_least("data.grad_accum_steps", d.grad_accum_steps, 1);
  c.at_least("data.buckets", d.buckets, 1);
  c.at_least("data.min_clusters_per_batch", d.min_clusters_per_batch, 1);
  check_loader(c, d.loader);
  c.in_range("data.consumed_tolerance", d.consumed_tolerance, 0, 1, Ends::kOpen);
  c.at_least("data.synthetic_branching", d.synthetic_branching, 1);
  c.in_range("data.synthetic_zipf", d.synthetic_zipf, 0, kInf, Ends::kOpenHigh);
}

// Dynamic accumulation moves within [grad_accum_min, grad_accum_max] around grad_accum_steps, on
// the guard's gradient norms; a production config, whose batch is validated, keeps it fixed.
void check_accumulation(Checker& c, const Config& cfg) {
  const DataConfig& d = cfg.data;
  if (d.grad_accum != GradAccum::kDynamic) return;
  c.at_least("data.grad_accum_min", d.grad_accum_min, 1);
  if (d.grad_accum_min > d.grad_accum_steps)
    c.error("data.grad_accum_min", "must be <= data.grad_accum_steps (" + num(d.grad_accum_steps) +
                                       ") (got " + num(d.grad_accum_min) + ")");
  const int64_t max = grad_accum_max(d);
  if (max < d.grad_accum_steps || max < 1)
    c.error("data.grad_accum_max", "must be >= data.grad_accum_steps (" + num(d.grad_accum_steps) +
                                       "), or auto (got " + num(max) + ")");
  else if (max == d.grad_accum_min)
    c.error("data.grad_accum_max",
            "equals data.grad_accum_min (" + num(max) +
                "): a dynamic count needs room to move; widen the range or set "
                "data.grad_accum: fixed");
  if (!cfg.stability.enabled)
    c.error("data.grad_accum",
            "dynamic follows the guard's gradient norms, and stability.enabled is false; enable "
            "the guard or set data.grad_accum: fixed");
  if (cfg.production.locked || !cfg.production.validated.empty())
    c.error("data.grad_accum",
            "dynamic (experimental) in a production config: its batch is validated at fixed "
            "points (production.validated); set data.grad_accum: fixed");
}

void check_optim(Checker& c, const OptimConfig& o, const RunConfig& run) {
  c.in_range("optim.lr", o.lr, 0, 1, Ends::kOpenLow);
  if (o.betas.size() != 2) {
    c.error("optim.betas",
            "must be exactly 2 values [beta1, beta2] (got " + num(int64_t(o.betas.size())) + ")");
  } else {
    c.in_range("optim.betas", o.betas[0], 0, 1, Ends::kOpen);
    c.in_range("optim.betas", o.betas[1], 0, 1, Ends::kOpen);
    if (o.betas[1] >= 0.999 && o.betas[1] < 1 && run.max_steps >= 10000) {
      c.warning("optim.betas", "β2=" + num(o.betas[1]) +
                                   " reacts slowly to late-training gradient "
                                   "jitter; 0.95 is the usual choice");
    }
  }
  c.positive("optim.eps", o.eps);
  // Decay is applied as w -= lr x weight_decay x w (torch.optim.AdamW's form), so 0.1, the value
  // of GPT-3's and Llama's recipes, is the usual choice and no cause for a warning.
  c.in_range("optim.weight_decay", o.weight_decay, 0, 0.1, Ends::kClosed);
  c.positive("optim.grad_clip", o.grad_clip);
  c.positive("optim.adaptive_clip_z", o.adaptive_clip_z);
}

void check_schedule(Checker& c, const ScheduleConfig& s, int64_t max_steps) {
  c.auto_or_at_least("schedule.warmup_steps", s.warmup_steps, 0);
  if (max_steps >= 1 && s.warmup_steps != kAuto && s.warmup_steps >= max_steps) {
    c.error("schedule.warmup_steps", "must be below run.max_steps (" + num(max_steps) + ") (got " +
                                         num(s.warmup_steps) + ")");
  }
  c.in_range("schedule.min_lr_ratio", s.min_lr_ratio, 0, 1, Ends::kClosed);
  c.in_range("schedule.phases.warmup", s.phases.warmup, 0, 1, Ends::kClosed);
  c.in_range("schedule.phases.stable", s.phases.stable, 0, 1, Ends::kClosed);
  c.in_range("schedule.phases.decay", s.phases.decay, 0, 1, Ends::kClosed);
  const double sum = s.phases.warmup + s.phases.stable + s.phases.decay;
  if (!(std::fabs(sum - 1.0) <= 1e-6)) {
    c.error("schedule.phases", "warmup + stable + decay must sum to 1 (got " + num(sum) + ")");
  }
  // An explicit warmup_steps replaces phases.warmup; the decay phase keeps its length.
  if (s.kind == ScheduleKind::kThreePhase && s.warmup_steps != kAuto && max_steps >= 1 &&
      s.warmup_steps + std::llround(s.phases.decay * static_cast<double>(max_steps)) > max_steps) {
    c.error("schedule.warmup_steps",
            "with three_phase, warmup_steps (" + num(s.warmup_steps) +
                ") plus the decay phase (phases.decay x run.max_steps = " +
                num(static_cast<int64_t>(std::llround(s.phases.decay * max_steps))) +
                ") must fit in run.max_steps (" + num(max_steps) + ")");
  }
}

void check_stability(Checker& c, const StabilityConfig& s) {
  c.at_least("stability.median_window", s.median_window, 1);
  c.in_range("stability.warn_factor", s.warn_factor, 1, kInf, Ends::kOpen);
  if (!(s.pause_factor > s.warn_factor)) {
    c.error("stability.pause_factor", "must be above stability.warn_factor (" + num(s.warn_factor) +
                                          ") (got " + num(s.pause_factor) + ")");
  }
  c.at_least("stability.max_consecutive_nan", s.max_consecutive_nan, 1);
  c.positive("stability.update_ratio_alarm", s.update_ratio_alarm);
  c.in_range("stability.loss_alarm_factor", s.loss_alarm_factor, 1, kInf, Ends::kOpen);
  c.in_range("stability.clip_rate_warn", s.clip_rate_warn, 0, 1, Ends::kOpenLow);
  c.at_least("stability.rollback.max_rollbacks", s.rollback.max_rollbacks, 0);
  c.at_least("stability.rollback.max_incidents", s.rollback.max_incidents, 1);
  c.at_least("stability.rollback.incident_window_steps", s.rollback.incident_window_steps, 1);
  c.auto_or_at_least("stability.rollback.stuck_steps", s.rollback.stuck_steps, 1);
  c.at_least("stability.rollback.skip_ahead_steps", s.rollback.skip_ahead_steps, 0);
  c.in_range("stability.screen.factor", s.screen.factor, 1, kInf, Ends::kOpen);
  c.positive("stability.screen.z", s.screen.z);
  c.at_least("stability.screen.min_samples", s.screen.min_samples, 1);
  c.auto_or_at_least("stability.recovery.steps", s.recovery.steps, 0);
  c.in_range("stability.recovery.lr_factor", s.recovery.lr_factor, 0, 1, Ends::kOpenLow);
  c.at_least("stability.top_k_samples", s.top_k_samples, 0);
  c.at_least("stability.replica_check_every", s.replica_check_every, 0);
}

void check_periodic(Checker& c, const Config& cfg) {
  c.auto_or_at_least("checkpoint.every_steps", cfg.checkpoint.every_steps, 0);
  c.in_range("checkpoint.max_overhead", cfg.checkpoint.max_overhead, 0, 1, Ends::kOpen);
  c.at_least("checkpoint.keep_last", cfg.checkpoint.keep_last, 1);
  c.auto_or_at_least("checkpoint.stable.every_steps", cfg.checkpoint.stable.every_steps, 0);
  c.at_least("checkpoint.stable.keep", cfg.checkpoint.stable.keep, 1);
  if (cfg.checkpoint.stable.memory_mb != kAuto)
    c.at_least("checkpoint.stable.memory_mb", cfg.checkpoint.stable.memory_mb, 0);
  c.auto_or_at_least("checkpoint.stable.window", cfg.checkpoint.stable.window, 0);
  c.at_least("eval.every_steps", cfg.eval.every_steps, 0);
  c.at_least("eval.batches", cfg.eval.batches, 1);
  c.at_least("logging.every_steps", cfg.logging.every_steps, 0);
  c.auto_or_at_least("logging.tensorboard_every_steps", cfg.logging.tensorboard_every_steps, 1);
  const int64_t log_every = std::max<int64_t>(cfg.logging.every_steps, 1);
  const int64_t tb_every = cfg.logging.tensorboard_every_steps;
  if (tb_every != kAuto && tb_every >= 1 && tb_every % log_every != 0)
    c.error("logging.tensorboard_every_steps",
            num(tb_every) + " is not a multiple of logging.every_steps (" + num(log_every) +
                "): TensorBoard gets the metrics lines keel writes; use " +
                num(std::max<int64_t>(tb_every / log_every, 1) * log_every) + " or " +
                num((tb_every / log_every + 1) * log_every));
}

void check_distributed(Checker& c, const DistributedConfig& d, const RunConfig& run) {
  if (d.backend == Backend::kNccl && run.device == Device::kCpu) {
    c.error("distributed.backend", "nccl needs CUDA, but run.device is cpu; use gloo or auto");
  }
  c.positive("distributed.timeout_s", d.timeout_s);
  c.positive("distributed.bucket_mb", d.bucket_mb);
  if (d.zero < 0 || d.zero > 3)
    c.error("distributed.zero",
            "must be 0 (every rank keeps the whole optimizer state), 1 (ZeRO-1: each rank keeps "
            "its part), 2 (ZeRO-2: the gradients too) or 3 (ZeRO-3: the weights too); got " +
                num(d.zero));
  if (d.reduce_dtype == ReduceDtype::kBf16 && d.zero != 3)
    c.error("distributed.reduce_dtype",
            "bf16 applies to ZeRO-3's gradient reduce-scatter, but distributed.zero is " +
                num(d.zero) + "; set distributed.zero: 3 or reduce_dtype: fp32");
}

void check_faults(Checker& c, const std::vector<FaultSpec>& faults) {
  for (size_t i = 0; i < faults.size(); ++i) {
    const FaultSpec& f = faults[i];
    const std::string key = "faults[" + std::to_string(i) + "]";
    c.at_least(key + ".at_step", f.at_step, 0);
    c.at_least(key + ".steps", f.steps, 1);
    c.at_least(key + ".rank", f.rank, -1);
    if (f.kind == FaultKind::kLrSpike) c.positive(key + ".factor", f.factor);
    if (f.kind == FaultKind::kDropSamples)
      c.in_range(key + ".factor", f.factor, 0, 1, Ends::kOpenLow);
    if (f.kind == FaultKind::kLoaderStall || f.kind == FaultKind::kSlowRank)
      c.positive(key + ".seconds", f.seconds);
    if (f.kind == FaultKind::kRepeatData) c.at_least(key + ".period", f.period, 1);
    if (f.kind == FaultKind::kGradGrowth)
      c.in_range(key + ".factor", f.factor, 1, kInf, Ends::kOpen);
    if (f.kind == FaultKind::kCorruptGrad && !(std::isfinite(f.factor) && f.factor != 0))
      c.error(key + ".factor", "corrupt_grad multiplies the gradient by it: finite, not 0 (got " +
                                   num(f.factor) + "; left out: " + num(kCorruptGradFactor) + ")");
    if (f.persistent && f.kind != FaultKind::kCorruptGrad)
      c.error(key + ".persistent", "only corrupt_grad is persistent; remove it from this fault");
    if (f.kind == FaultKind::kHang && !(f.seconds >= 0))
      c.error(key + ".seconds", "must be >= 0 (0: hang until killed) (got " + num(f.seconds) + ")");
    if (f.kind == FaultKind::kSpliceData) {
      std::error_code ec;
      if (f.path.empty() || !fs::exists(fs::path(f.path) / "meta.json", ec))
        c.error(key + ".path",
                "splice_data needs a dataset prepared by `keel prepare` (a directory "
                "with meta.json) (got '" +
                    f.path + "')");
    } else if (!f.path.empty()) {
      c.error(key + ".path", "only splice_data reads a path");
    }
  }
}

// A [lo, hi] pair of a validated combination; reports and returns false when malformed.
bool check_pair(Checker& c, const std::string& key, const std::vector<double>& pair) {
  if (pair.size() != 2) {
    c.error(key, "must be exactly 2 values [lo, hi] (got " + num(int64_t(pair.size())) + ")");
    return false;
  }
  if (!(pair[0] <= pair[1])) {
    c.error(key, "lo must be <= hi (got [" + num(pair[0]) + ", " + num(pair[1]) + "])");
    return false;
  }
  return true;
}

// A production config may only run at (lr, global batch) points someone has validated.
void check_validated(Checker& c, const Config& cfg, int64_t world_size) {
  const auto& combos = cfg.production.validated;
  if (combos.empty()) return;
  bool well_formed = true;
  for (size_t i = 0; i < combos.size(); ++i) {
    const std::string key = "production.validated[" + std::to_string(i) + "]";
    well_formed &= check_pair(c, key + ".lr", combos[i].lr);
    well_formed &= check_pair(c, key + ".global_batch", combos[i].global_batch);
  }
  if (!well_formed) return;
  const double lr = cfg.optim.lr;
  const int64_t global_batch = cfg.data.micro_batch_size * cfg.data.grad_accum_steps * world_size;
  std::string listed;
  for (const auto& combo : combos) {
    const double gb = static_cast<double>(global_batch);
    if (combo.lr[0] <= lr && lr <= combo.lr[1] && combo.global_batch[0] <= gb &&
        gb <= combo.global_batch[1])
      return;
    listed += std::string(listed.empty() ? "" : ", ") + "{lr [" + num(combo.lr[0]) + ", " +
              num(combo.lr[1]) + "], global_batch [" + num(combo.global_batch[0]) + ", " +
              num(combo.global_batch[1]) + "]}";
  }
  // The seed's rule for a batch no combination covers: lr x sqrt(batch ratio) with a longer
  // warmup, from the combination nearest in batch; and its safer path first.
  std::string advice;
  const ValidatedCombo* nearest = nullptr;
  double nearest_gb = 0, distance = kInf;
  for (const auto& combo : combos) {
    const double gb =
        std::clamp(static_cast<double>(global_batch), combo.global_batch[0], combo.global_batch[1]);
    const double d = std::fabs(std::log(static_cast<double>(global_batch) / std::max(gb, 1.0)));
    if (d < distance) distance = d, nearest = &combo, nearest_gb = gb;
  }
  if (nearest && distance == 0) {
    advice = "; HINT: at global_batch " + num(global_batch) + " the validated lr is [" +
             num(nearest->lr[0]) + ", " + num(nearest->lr[1]) +
             "]; another lr needs a validation run and an entry in production.validated";
  } else if (nearest && nearest_gb > 0) {
    const double ratio = static_cast<double>(global_batch) / nearest_gb;
    const double scaled_lr = nearest->lr[1] * std::sqrt(ratio);
    const int64_t warmup = warmup_steps(cfg.schedule, cfg.run.max_steps);
    advice =
        "; HINT: the safer path is to raise the batch and keep a validated lr (validate "
        "lr " +
        num(nearest->lr[1]) + " at global_batch " + num(global_batch) +
        " before anything else); scaling it by sqrt(" + num(global_batch) + "/" + num(nearest_gb) +
        ") gives lr " + approx(scaled_lr) + ", which needs a longer warmup too (e.g. " +
        num(static_cast<int64_t>(std::llround(warmup * std::max(ratio, 1.0)))) +
        " steps instead of " + num(warmup) + ") and a new entry in production.validated";
  }
  c.error("production.validated",
          "lr=" + num(lr) + ", global_batch=" + num(global_batch) + " (micro_batch_size " +
              num(cfg.data.micro_batch_size) + " x grad_accum_steps " +
              num(cfg.data.grad_accum_steps) + " x world_size " + num(world_size) +
              ") lies outside every validated combination: " + listed + advice);
}

void check_vocab(Checker& c, const ModelConfig& m, int64_t data_vocab) {
  if (m.vocab_size == kAuto) return;  // resolved from the data, so it fits
  if (m.vocab_size < data_vocab) {
    c.error("model.vocab_size", "must be >= the data's vocabulary (" + num(data_vocab) + ") (got " +
                                    num(m.vocab_size) +
                                    "); larger token ids would index past the embedding");
  } else if (m.vocab_size > 2 * data_vocab) {
    c.warning("model.vocab_size", num(m.vocab_size) +
                                      " is more than twice the data's vocabulary (" +
                                      num(data_vocab) + "); the unused rows only cost memory");
  }
}

void check_filesystem(Checker& c, const Config& cfg, int64_t parameters, int64_t world_size,
                      const std::string& run_dir) {
  const fs::path dir = checkpoint_dir(cfg, run_dir);
  std::error_code ec;
  const fs::path existing = nearest_existing_dir(dir);
  if (!fs::is_directory(existing, ec)) {
    c.error("checkpoint.dir",
            "cannot create " + dir.string() + ": " + existing.string() + " is not a directory");
    return;
  }
  if (access(existing.c_str(), W_OK) != 0) {
    c.error("checkpoint.dir",
            "cannot create " + dir.string() + ": " + existing.string() + " is not writable");
    return;
  }
  struct statvfs fs_stat {};
  if (statvfs(existing.c_str(), &fs_stat) != 0) return;  // unknown free space: nothing to say
  const double free_bytes =
      static_cast<double>(fs_stat.f_bavail) * static_cast<double>(fs_stat.f_frsize);
  // The kept checkpoints plus the one being written before the oldest is deleted.
  const int64_t copies = std::max<int64_t>(cfg.checkpoint.keep_last, 0) +
                         std::max<int64_t>(cfg.checkpoint.stable.keep, 0) + 1;
  const double each = static_cast<double>(checkpoint_bytes_for(cfg, parameters, world_size));
  const double needed = each * static_cast<double>(copies);
  if (free_bytes < needed) {
    c.error("checkpoint.dir", "checkpoints need about " + human_bytes(needed) + " (" + num(copies) +
                                  " x " + human_bytes(each) +
                                  ": keep_last + stable.keep + 1 in flight) but only " +
                                  human_bytes(free_bytes) + " is free under " + existing.string());
  }
}

void warn_short_warmup(Checker& c, const ScheduleConfig& s, int64_t max_steps, int64_t parameters) {
  const int64_t warmup = warmup_steps(s, max_steps);
  if (parameters > 1'000'000'000 && warmup < 2000) {
    c.warning("schedule.warmup_steps",
              num(warmup) + " warmup steps is short for a model of ~" +
                  human_count(double(parameters)) +
                  " parameters; large models often diverge early without >= 2000");
  }
}

}  // namespace

// Errors before warnings; within each, file locations in line order, then --set flags in order.
void sort_diagnostics(std::vector<Diagnostic>& diagnostics) {
  const auto rank = [](const Diagnostic& d) {
    return std::make_tuple(d.severity == Diagnostic::Severity::kWarning, d.loc.file == "--set",
                           d.loc.file, d.loc.line, d.loc.column);
  };
  std::stable_sort(diagnostics.begin(), diagnostics.end(),
                   [&](const Diagnostic& a, const Diagnostic& b) { return rank(a) < rank(b); });
}

std::vector<Diagnostic> validate(const LoadedConfig& loaded, const ValidateOptions& options) {
  Checker c(loaded);
  const Config& cfg = loaded.config;
  check_run(c, cfg.run);
  check_model(c, cfg.model, cfg.data);
  check_data(c, cfg.data);
  check_accumulation(c, cfg);
  check_optim(c, cfg.optim, cfg.run);
  check_schedule(c, cfg.schedule, cfg.run.max_steps);
  check_stability(c, cfg.stability);
  check_periodic(c, cfg);
  check_distributed(c, cfg.distributed, cfg.run);
  check_faults(c, cfg.faults);
  check_validated(c, cfg, options.world_size);
  if (options.data_vocab_size) check_vocab(c, cfg.model, *options.data_vocab_size);
  ModelConfig model = cfg.model;  // the model as it will be built: auto vocab from the data
  if (model.vocab_size == kAuto && options.data_vocab_size)
    model.vocab_size = padded_vocab_size(*options.data_vocab_size);
  const int64_t parameters = options.parameter_count.value_or(parameter_count(model));
  warn_short_warmup(c, cfg.schedule, cfg.run.max_steps, parameters);
  if (options.check_filesystem)
    check_filesystem(c, cfg, parameters, options.world_size, options.run_dir);
  std::vector<Diagnostic> out = std::move(c.diagnostics());
  sort_diagnostics(out);
  return out;
}

int64_t estimate_checkpoint_bytes(const Config& config, int64_t world_size) {
  return checkpoint_bytes_for(config, parameter_count(config.model), world_size);
}

fs::path checkpoint_dir(const Config& cfg, const std::string& run_dir) {
  if (!cfg.checkpoint.dir.empty()) return cfg.checkpoint.dir;
  if (!run_dir.empty()) return fs::path(run_dir) / "checkpoints";
  return fs::path(cfg.run.out_dir) / cfg.run.name / "checkpoints";
}

fs::path nearest_existing_dir(fs::path p) {
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec)) {
    const fs::path parent = p.parent_path();
    if (parent == p) break;
    p = parent;
  }
  if (p.empty()) p = ".";
  const fs::path canonical = fs::canonical(p, ec);
  return ec ? p : canonical;
}

}  // namespace keel::config
