// The typed configuration of a keel run: one struct per YAML section, field names equal to YAML
// keys. Defaults here are the documented defaults (docs/config.md). Every struct compares by value
// (operator==), which the to_yaml round-trip relies on. Loading, overrides and validation live
// in load.h / validate.h; this header only describes the shape, and a visitor that walks it so that
// reading, writing, key listing and locking share one list of fields.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace keel::config {

struct RunConfig {
  std::string name = "keel";
  std::string out_dir = "runs";  // the run directory is out_dir/name unless --run-dir is given
  int64_t seed = 1234;
  int64_t max_steps = 1000;        // optimizer steps
  std::string device = "auto";     // auto|cpu|cuda
  std::string precision = "fp32";  // bf16|fp16|fp32
  bool deterministic = false;
  int64_t threads = 0;                     // intra-op threads; 0 = LibTorch's default
  std::string host_allocator = "caching";  // caching|system: LibTorch's CPU tensor memory
  std::string cpu_matmul = "onednn";       // onednn|aten: the GEMMs of fp32 CPU linear layers
  bool operator==(const RunConfig&) const = default;
};

struct ModelConfig {
  std::string arch = "llama";  // llama|gpt2
  int64_t vocab_size = 256;
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0 = n_heads (no grouping)
  int64_t seq_len = 128;
  int64_t d_ff = 0;  // 0 = derived: 4*d_model (gpt2) or 8/3*d_model rounded to 64 (llama)
  double dropout = 0.0;
  bool tie_embeddings = true;
  bool qk_norm = false;
  double z_loss = 0.0;  // coefficient of the log(Z)^2 auxiliary loss; 0 disables
  double init_std = 0.02;
  bool operator==(const ModelConfig&) const = default;
};

struct LoaderConfig {
  int64_t workers = 1;
  int64_t queue_capacity = 16;  // batches
  int64_t low_watermark = 2;
  int64_t high_watermark = 8;
  double stall_timeout_s = 300.0;
  bool operator==(const LoaderConfig&) const = default;
};

struct DataConfig {
  std::string source = "synthetic";  // synthetic|shards
  std::string path;                  // shard directory when source=shards
  int64_t micro_batch_size = 8;      // sequences per micro-batch per rank
  int64_t grad_accum_steps = 1;
  std::string sampling = "stratified";  // stratified|random|sequential
  int64_t buckets = 16;
  int64_t min_clusters_per_batch = 2;
  LoaderConfig loader;
  double consumed_tolerance = 0.05;
  std::string val_path;
  // Synthetic source: an order-1 chain over the vocabulary whose successor is one of
  // `synthetic_branching` tokens with Zipf(synthetic_zipf) probabilities; its entropy rate is
  // exact.
  int64_t synthetic_branching = 8;
  double synthetic_zipf = 1.0;
  bool operator==(const DataConfig&) const = default;
};

struct OptimConfig {
  std::string name = "adamw";  // adamw|lion
  double lr = 3e-4;            // peak learning rate
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 0.05;
  std::vector<std::string> no_decay = {"bias", "norm", "embedding"};
  double grad_clip = 1.0;
  std::string clip_mode = "global";  // global|adaptive
  double adaptive_clip_z = 4.0;
  std::string fused = "auto";  // auto|on|off
  bool operator==(const OptimConfig&) const = default;
};

struct PhasesConfig {
  double warmup = 0.2;
  double stable = 0.6;
  double decay = 0.2;
  bool operator==(const PhasesConfig&) const = default;
};

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine|three_phase|constant
  int64_t warmup_steps = 100;   // cosine/constant; three_phase uses phases.warmup unless this is >0
  double min_lr_ratio = 0.1;
  PhasesConfig phases;
  bool operator==(const ScheduleConfig&) const = default;
};

struct RollbackConfig {
  bool enabled = true;
  int64_t max_rollbacks = 3;
  bool skip_data = true;
  int64_t skip_ahead_steps = 0;  // with skip_data: also skip this many steps of data past the pause
  bool operator==(const RollbackConfig&) const = default;
};

struct RecoveryConfig {
  int64_t steps = 200;
  double lr_factor = 0.25;
  // When a resume is a recovery (lr x lr_factor for `steps`): stable = `--resume stable` (and a
  // crash-loop fallback to it), always = every resume, never = no resume.
  std::string on_resume = "stable";  // stable|always|never
  bool operator==(const RecoveryConfig&) const = default;
};

struct StabilityConfig {
  bool enabled = true;
  int64_t median_window = 100;
  double warn_factor = 5.0;
  double pause_factor = 10.0;
  std::string nan_policy = "skip";  // skip|pause|abort
  int64_t max_consecutive_nan = 3;
  double update_ratio_alarm = 0.1;
  double loss_alarm_factor = 3.0;
  double clip_rate_warn = 0.5;
  RollbackConfig rollback;
  RecoveryConfig recovery;
  int64_t top_k_samples = 8;
  bool operator==(const StabilityConfig&) const = default;
};

struct StableConfig {
  int64_t every_steps = 0;  // 0 = same as checkpoint.every_steps
  int64_t keep = 2;
  int64_t window = 100;
  bool require_no_alarms = true;
  bool operator==(const StableConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;          // empty = RUN_DIR/checkpoints
  int64_t every_steps = 0;  // 0 = only at the end
  int64_t keep_last = 3;
  bool async = false;
  StableConfig stable;
  bool operator==(const CheckpointConfig&) const = default;
};

struct EvalConfig {
  int64_t every_steps = 100;  // 0 = only at the end
  int64_t batches = 8;
  bool operator==(const EvalConfig&) const = default;
};

struct LoggingConfig {
  int64_t every_steps = 10;
  bool tensorboard = false;
  std::string progress = "auto";  // auto|on|off
  bool sample_ids = false;        // RUN_DIR/samples.jsonl: the sample ids of every step
  bool operator==(const LoggingConfig&) const = default;
};

struct DistributedConfig {
  std::string backend = "auto";  // auto|nccl|gloo
  double timeout_s = 600.0;
  double bucket_mb = 25.0;
  int64_t zero = 0;  // 0|1
  bool operator==(const DistributedConfig&) const = default;
};

struct ValidatedCombo {
  std::vector<double> lr;            // [lo, hi]
  std::vector<double> global_batch;  // [lo, hi] in sequences
  bool operator==(const ValidatedCombo&) const = default;
};

struct ProductionConfig {
  bool locked = false;
  std::vector<std::string> locked_keys = {"optim.*",
                                          "schedule.*",
                                          "stability.*",
                                          "run.precision",
                                          "data.micro_batch_size",
                                          "data.grad_accum_steps"};
  std::vector<ValidatedCombo> validated;
  bool operator==(const ProductionConfig&) const = default;
};

struct FaultSpec {
  std::string kind;  // corrupt_batch|nan_grad|lr_spike|loader_stall|drop_samples|crash
  int64_t at_step = 0;
  int64_t steps = 1;
  std::string mode;      // corrupt_batch: random_tokens|repeat_token|shuffled
  double factor = 1.0;   // lr_spike multiplier, drop_samples fraction
  double seconds = 0.0;  // loader_stall duration
  bool operator==(const FaultSpec&) const = default;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  OptimConfig optim;
  ScheduleConfig schedule;
  StabilityConfig stability;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  LoggingConfig logging;
  DistributedConfig distributed;
  ProductionConfig production;
  std::vector<FaultSpec> faults;
  bool operator==(const Config&) const = default;
};

// ---- The field list, shared by every pass over a config. -------------------------------------
// A visitor V provides:
//   template <class T> void field(const char* key, T& value);      // scalar / list of scalars
//   template <class S> void section(const char* key, S& sub);      // nested struct (calls visit)
//   template <class S> void list(const char* key, std::vector<S>& items);  // list of structs

template <class V>
void visit(V& v, RunConfig& c) {
  v.field("name", c.name);
  v.field("out_dir", c.out_dir);
  v.field("seed", c.seed);
  v.field("max_steps", c.max_steps);
  v.field("device", c.device);
  v.field("precision", c.precision);
  v.field("deterministic", c.deterministic);
  v.field("threads", c.threads);
  v.field("host_allocator", c.host_allocator);
  v.field("cpu_matmul", c.cpu_matmul);
}
template <class V>
void visit(V& v, ModelConfig& c) {
  v.field("arch", c.arch);
  v.field("vocab_size", c.vocab_size);
  v.field("d_model", c.d_model);
  v.field("n_layers", c.n_layers);
  v.field("n_heads", c.n_heads);
  v.field("n_kv_heads", c.n_kv_heads);
  v.field("seq_len", c.seq_len);
  v.field("d_ff", c.d_ff);
  v.field("dropout", c.dropout);
  v.field("tie_embeddings", c.tie_embeddings);
  v.field("qk_norm", c.qk_norm);
  v.field("z_loss", c.z_loss);
  v.field("init_std", c.init_std);
}
template <class V>
void visit(V& v, LoaderConfig& c) {
  v.field("workers", c.workers);
  v.field("queue_capacity", c.queue_capacity);
  v.field("low_watermark", c.low_watermark);
  v.field("high_watermark", c.high_watermark);
  v.field("stall_timeout_s", c.stall_timeout_s);
}
template <class V>
void visit(V& v, DataConfig& c) {
  v.field("source", c.source);
  v.field("path", c.path);
  v.field("micro_batch_size", c.micro_batch_size);
  v.field("grad_accum_steps", c.grad_accum_steps);
  v.field("sampling", c.sampling);
  v.field("buckets", c.buckets);
  v.field("min_clusters_per_batch", c.min_clusters_per_batch);
  v.section("loader", c.loader);
  v.field("consumed_tolerance", c.consumed_tolerance);
  v.field("val_path", c.val_path);
  v.field("synthetic_branching", c.synthetic_branching);
  v.field("synthetic_zipf", c.synthetic_zipf);
}
template <class V>
void visit(V& v, OptimConfig& c) {
  v.field("name", c.name);
  v.field("lr", c.lr);
  v.field("betas", c.betas);
  v.field("eps", c.eps);
  v.field("weight_decay", c.weight_decay);
  v.field("no_decay", c.no_decay);
  v.field("grad_clip", c.grad_clip);
  v.field("clip_mode", c.clip_mode);
  v.field("adaptive_clip_z", c.adaptive_clip_z);
  v.field("fused", c.fused);
}
template <class V>
void visit(V& v, PhasesConfig& c) {
  v.field("warmup", c.warmup);
  v.field("stable", c.stable);
  v.field("decay", c.decay);
}
template <class V>
void visit(V& v, ScheduleConfig& c) {
  v.field("kind", c.kind);
  v.field("warmup_steps", c.warmup_steps);
  v.field("min_lr_ratio", c.min_lr_ratio);
  v.section("phases", c.phases);
}
template <class V>
void visit(V& v, RollbackConfig& c) {
  v.field("enabled", c.enabled);
  v.field("max_rollbacks", c.max_rollbacks);
  v.field("skip_data", c.skip_data);
  v.field("skip_ahead_steps", c.skip_ahead_steps);
}
template <class V>
void visit(V& v, RecoveryConfig& c) {
  v.field("steps", c.steps);
  v.field("lr_factor", c.lr_factor);
  v.field("on_resume", c.on_resume);
}
template <class V>
void visit(V& v, StabilityConfig& c) {
  v.field("enabled", c.enabled);
  v.field("median_window", c.median_window);
  v.field("warn_factor", c.warn_factor);
  v.field("pause_factor", c.pause_factor);
  v.field("nan_policy", c.nan_policy);
  v.field("max_consecutive_nan", c.max_consecutive_nan);
  v.field("update_ratio_alarm", c.update_ratio_alarm);
  v.field("loss_alarm_factor", c.loss_alarm_factor);
  v.field("clip_rate_warn", c.clip_rate_warn);
  v.section("rollback", c.rollback);
  v.section("recovery", c.recovery);
  v.field("top_k_samples", c.top_k_samples);
}
template <class V>
void visit(V& v, StableConfig& c) {
  v.field("every_steps", c.every_steps);
  v.field("keep", c.keep);
  v.field("window", c.window);
  v.field("require_no_alarms", c.require_no_alarms);
}
template <class V>
void visit(V& v, CheckpointConfig& c) {
  v.field("dir", c.dir);
  v.field("every_steps", c.every_steps);
  v.field("keep_last", c.keep_last);
  v.field("async", c.async);
  v.section("stable", c.stable);
}
template <class V>
void visit(V& v, EvalConfig& c) {
  v.field("every_steps", c.every_steps);
  v.field("batches", c.batches);
}
template <class V>
void visit(V& v, LoggingConfig& c) {
  v.field("every_steps", c.every_steps);
  v.field("tensorboard", c.tensorboard);
  v.field("progress", c.progress);
  v.field("sample_ids", c.sample_ids);
}
template <class V>
void visit(V& v, DistributedConfig& c) {
  v.field("backend", c.backend);
  v.field("timeout_s", c.timeout_s);
  v.field("bucket_mb", c.bucket_mb);
  v.field("zero", c.zero);
}
template <class V>
void visit(V& v, ValidatedCombo& c) {
  v.field("lr", c.lr);
  v.field("global_batch", c.global_batch);
}
template <class V>
void visit(V& v, ProductionConfig& c) {
  v.field("locked", c.locked);
  v.field("locked_keys", c.locked_keys);
  v.list("validated", c.validated);
}
template <class V>
void visit(V& v, FaultSpec& c) {
  v.field("kind", c.kind);
  v.field("at_step", c.at_step);
  v.field("steps", c.steps);
  v.field("mode", c.mode);
  v.field("factor", c.factor);
  v.field("seconds", c.seconds);
}
template <class V>
void visit(V& v, Config& c) {
  v.section("run", c.run);
  v.section("model", c.model);
  v.section("data", c.data);
  v.section("optim", c.optim);
  v.section("schedule", c.schedule);
  v.section("stability", c.stability);
  v.section("checkpoint", c.checkpoint);
  v.section("eval", c.eval);
  v.section("logging", c.logging);
  v.section("distributed", c.distributed);
  v.section("production", c.production);
  v.list("faults", c.faults);
}

// Derived quantities that several modules need; defined once here so they agree.
int64_t effective_d_ff(const ModelConfig& m);
int64_t effective_kv_heads(const ModelConfig& m);

}  // namespace keel::config
