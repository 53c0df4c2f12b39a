// The keys of a config: each section's fields named as in YAML, in the order they are written.
// Only the passes over a whole config read it (config/load, write, key_paths; train/resume_source):
// a key renamed here rebuilds those, not every module that reads the types (schema.h).
#pragma once

#include <vector>

#include "config/schema.h"

namespace keel::config {

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
  v.field("fp16_initial_scale", c.fp16_initial_scale);
  v.field("fp16_growth_interval", c.fp16_growth_interval);
  v.field("deterministic", c.deterministic);
  v.field("cuda_graphs", c.cuda_graphs);
  v.field("threads", c.threads);
  v.field("host_allocator", c.host_allocator);
  v.field("cpu_matmul", c.cpu_matmul);
}
template <class V>
void visit(V& v, ModelConfig& c) {
  v.field("arch", c.arch);
  v.field("vocab_size", c.vocab_size, kAutoAllowed);
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
  v.field("chunked_loss", c.chunked_loss);
  v.field("activation_checkpointing", c.activation_checkpointing);
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
  v.field("grad_accum", c.grad_accum);
  v.field("grad_accum_min", c.grad_accum_min);
  v.field("grad_accum_max", c.grad_accum_max, kAutoAllowed);
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
  v.field("warmup_steps", c.warmup_steps, kAutoAllowed);
  v.field("min_lr_ratio", c.min_lr_ratio);
  v.section("phases", c.phases);
}
template <class V>
void visit(V& v, RollbackConfig& c) {
  v.field("enabled", c.enabled);
  v.field("max_rollbacks", c.max_rollbacks);
  v.field("max_incidents", c.max_incidents);
  v.field("incident_window_steps", c.incident_window_steps);
  v.field("stuck_steps", c.stuck_steps, kAutoAllowed);
  v.field("skip_data", c.skip_data);
  v.field("skip_ahead_steps", c.skip_ahead_steps);
}
template <class V>
void visit(V& v, ScreenConfig& c) {
  v.field("enabled", c.enabled);
  v.field("factor", c.factor);
  v.field("z", c.z);
  v.field("min_samples", c.min_samples);
  v.field("low", c.low);
}
template <class V>
void visit(V& v, RecoveryConfig& c) {
  v.field("steps", c.steps, kAutoAllowed);
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
  v.section("screen", c.screen);
  v.section("recovery", c.recovery);
  v.field("top_k_samples", c.top_k_samples);
  v.field("update_gate", c.update_gate);
  v.field("replica_check_every", c.replica_check_every);
}
template <class V>
void visit(V& v, StableConfig& c) {
  v.field("every_steps", c.every_steps, kAutoAllowed);
  v.field("keep", c.keep);
  v.field("window", c.window, kAutoAllowed);
  v.field("require_no_alarms", c.require_no_alarms);
  v.field("memory_mb", c.memory_mb, kAutoAllowed);
}
template <class V>
void visit(V& v, CheckpointConfig& c) {
  v.field("dir", c.dir);
  v.field("every_steps", c.every_steps, kAutoAllowed);
  v.field("max_overhead", c.max_overhead);
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
  v.field("tensorboard_every_steps", c.tensorboard_every_steps, kAutoAllowed);
  v.field("progress", c.progress);
  v.field("sample_ids", c.sample_ids);
}
template <class V>
void visit(V& v, DistributedConfig& c) {
  v.field("backend", c.backend);
  v.field("timeout_s", c.timeout_s);
  v.field("bucket_mb", c.bucket_mb);
  v.field("overlap", c.overlap);
  v.field("zero", c.zero);
  v.field("reduce_dtype", c.reduce_dtype);
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
  v.field("path", c.path);
  v.field("rank", c.rank);
  v.field("host", c.host);
  v.field("period", c.period);
  v.field("persistent", c.persistent);
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

}  // namespace keel::config
