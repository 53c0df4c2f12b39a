// The typed config of a keel run: one struct per YAML section, fields named as the keys, defaults
// as documented (docs/config.md), compared by value (the to_yaml round-trip relies on it). load.h
// and validate.h read and check it; fields.h is the one field list (the keys' names) every pass
// over a config shares, read only by config/ (and resume's config comparison).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/choice.h"

namespace keel::config {

// ---- Choice-valued keys (choice.h) ---------------------------------------------------------
enum class Device { kAuto, kCpu, kCuda };
KEEL_CHOICE(Device, "auto", "cpu", "cuda");
enum class Precision { kFp32, kBf16, kFp16 };
KEEL_CHOICE(Precision, "fp32", "bf16", "fp16");
enum class HostAllocator { kCaching, kSystem };
KEEL_CHOICE(HostAllocator, "caching", "system");
enum class CpuMatmul { kOneDnn, kAten };
KEEL_CHOICE(CpuMatmul, "onednn", "aten");
enum class Arch { kLlama, kGpt2 };
KEEL_CHOICE(Arch, "llama", "gpt2");
enum class DataSource { kSynthetic, kShards, kMegatron, kLlmc };
KEEL_CHOICE(DataSource, "synthetic", "shards", "megatron", "llmc");
enum class Sampling { kStratified, kRandom, kSequential };
KEEL_CHOICE(Sampling, "stratified", "random", "sequential");
enum class OptimizerName { kAdamW, kLion };
KEEL_CHOICE(OptimizerName, "adamw", "lion");
enum class ClipMode { kGlobal, kAdaptive };
KEEL_CHOICE(ClipMode, "global", "adaptive");
// optim.fused, logging.progress, model.chunked_loss, model.qk_norm. Read also as a bool (true: on).
enum class Switch { kAuto, kOn, kOff };
KEEL_CHOICE(Switch, "auto", "on", "off");
// model.activation_checkpointing (model/recompute.h): nothing recomputed, each whole block, or
// the norms and activations between the matmuls.
enum class ActivationCheckpointing { kNone, kFull, kSelective };
KEEL_CHOICE(ActivationCheckpointing, "none", "full", "selective");
// distributed.reduce_dtype: the type ZeRO-2/3's gradient reduce-scatter travels in (the mean is
// accumulated into fp32 parts either way).
enum class ReduceDtype { kFp32, kBf16 };
KEEL_CHOICE(ReduceDtype, "fp32", "bf16");
enum class ScheduleKind { kCosine, kThreePhase, kConstant };
KEEL_CHOICE(ScheduleKind, "cosine", "three_phase", "constant");
enum class NanPolicy { kSkip, kPause, kAbort };
KEEL_CHOICE(NanPolicy, "skip", "pause", "abort");
// stability.update_gate: the update is queued at once, gated on the device by the guard's pause
// levels (device), or after the host has read the step and decided (host; docs/DESIGN.md).
enum class UpdateGate { kDevice, kHost };
KEEL_CHOICE(UpdateGate, "device", "host");
// run.cuda_graphs: each micro-batch's forward and backward replayed from a CUDA graph (train/
// micro_graph.h); auto where every feature of the run can be captured.
enum class CudaGraphs { kAuto, kOn, kOff };
KEEL_CHOICE(CudaGraphs, "auto", "on", "off");
enum class ResumeRecovery { kStable, kAlways, kNever };
KEEL_CHOICE(ResumeRecovery, "stable", "always", "never");
enum class Backend { kAuto, kNccl, kGloo };
KEEL_CHOICE(Backend, "auto", "nccl", "gloo");
enum class FaultKind {
  kCorruptBatch,
  kNanGrad,
  kLrSpike,
  kLoaderStall,
  kDropSamples,
  kCrash,
  kSpliceData,
  kHang,
  kRepeatData,
  kGradGrowth,
  kCorruptGrad,
  kFlipBit,
  kSlowRank
};
KEEL_CHOICE(FaultKind, "corrupt_batch", "nan_grad", "lr_spike", "loader_stall", "drop_samples",
            "crash", "splice_data", "hang", "repeat_data", "grad_growth", "corrupt_grad",
            "flip_bit", "slow_rank");
enum class CorruptMode { kRandomTokens, kRepeatToken, kShuffled };
KEEL_CHOICE(CorruptMode, "random_tokens", "repeat_token", "shuffled");
// stability.screen.low: what becomes of samples far below the baseline, or repeating content
// seen under another id (repeated or memorised data): a warning only, or masked and set aside too.
enum class LowScreen { kWarn, kQuarantine };
KEEL_CHOICE(LowScreen, "warn", "quarantine");
// data.grad_accum: grad_accum_steps always, or dynamic (experimental, train/accumulation.h).
enum class GradAccum { kFixed, kDynamic };
KEEL_CHOICE(GradAccum, "fixed", "dynamic");
#undef KEEL_CHOICE

// An integer key that also takes `auto`: its owner derives the value (from the data, or measured);
// visitors see such a key through field(key, value, kAutoAllowed).
inline constexpr int64_t kAuto = -1;
struct AutoAllowed {};
inline constexpr AutoAllowed kAutoAllowed{};

struct RunConfig {
  std::string name = "keel";
  std::string out_dir = "runs";  // the run directory is out_dir/name unless --run-dir is given
  int64_t seed = 1234;
  int64_t max_steps = 1000;  // optimizer steps
  Device device = Device::kAuto;
  Precision precision = Precision::kFp32;
  // fp16's dynamic loss scaling: the initial scale, and the clean steps before it doubles.
  double fp16_initial_scale = 65536.0;
  int64_t fp16_growth_interval = 2000;
  bool deterministic = false;
  CudaGraphs cuda_graphs = CudaGraphs::kAuto;
  int64_t threads = 0;  // intra-op threads; 0 = LibTorch's default
  HostAllocator host_allocator = HostAllocator::kCaching;  // LibTorch's CPU tensor memory
  CpuMatmul cpu_matmul = CpuMatmul::kOneDnn;               // the GEMMs of fp32 CPU linear layers
  bool operator==(const RunConfig&) const = default;
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  int64_t vocab_size = 256;  // kAuto: the data's (shards' meta.json), padded up to 64
  int64_t d_model = 128;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0 = n_heads (no grouping)
  int64_t seq_len = 128;
  int64_t d_ff = 0;  // 0 = derived: 4*d_model (gpt2) or 8/3*d_model rounded to 64 (llama)
  double dropout = 0.0;
  bool tie_embeddings = true;
  // An RMSNorm over each head of q and k before the rotary (qk_norm_on). auto: on for llama
  // (issue 47: it cut the loss damage of a 30x-too-high lr from +48 % to +11 %), off for gpt2
  // (transformers' GPT2LMHeadModel has none); resolve_auto writes the choice down.
  Switch qk_norm = Switch::kAuto;
  double z_loss = 0.0;  // coefficient of the log(Z)^2 auxiliary loss; 0 disables
  double init_std = 0.02;
  // The head and its cross-entropy over chunks of tokens (model/chunked_loss.h), so the (B*T, V)
  // logits never exist whole. auto: on CUDA (where the logits are the largest activation), off on
  // the CPU (where recomputing the head's matmul in the backward pass costs more than it saves).
  Switch chunked_loss = Switch::kAuto;
  ActivationCheckpointing activation_checkpointing = ActivationCheckpointing::kNone;
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
  DataSource source = DataSource::kSynthetic;
  std::string path;  // shards: `keel prepare`'s directory; megatron / llmc: data/foreign_formats.h
  int64_t micro_batch_size = 8;  // sequences per micro-batch per rank
  int64_t grad_accum_steps = 1;  // dynamic: the count the run starts at and the lr is set for
  GradAccum grad_accum = GradAccum::kFixed;
  int64_t grad_accum_min = 1;
  int64_t grad_accum_max = kAuto;  // auto: 2 x grad_accum_steps
  Sampling sampling = Sampling::kStratified;
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
  OptimizerName name = OptimizerName::kAdamW;
  double lr = 3e-4;  // peak learning rate
  std::vector<double> betas = {0.9, 0.95};
  double eps = 1e-8;
  double weight_decay = 0.05;
  std::vector<std::string> no_decay = {"bias", "norm", "embedding"};
  double grad_clip = 1.0;
  ClipMode clip_mode = ClipMode::kGlobal;
  double adaptive_clip_z = 4.0;
  Switch fused = Switch::kAuto;
  bool operator==(const OptimConfig&) const = default;
};

struct PhasesConfig {
  double warmup = 0.2;
  double stable = 0.6;
  double decay = 0.2;
  bool operator==(const PhasesConfig&) const = default;
};

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  int64_t warmup_steps = kAuto;  // auto: see config::warmup_steps()
  double min_lr_ratio = 0.1;
  PhasesConfig phases;
  bool operator==(const ScheduleConfig&) const = default;
};

// Rollbacks are budgeted per incident (alarms after a rollback, before progress on clean data, are
// the same incident); the remedy escalates, so an incident ends within max_rollbacks. The run stops
// (exit 3) past max_incidents within incident_window_steps, or stuck_steps attempts unapplied.
struct RollbackConfig {
  bool enabled = true;
  int64_t max_rollbacks = 2;  // per incident
  int64_t max_incidents = 20;
  int64_t incident_window_steps = 1000;
  int64_t stuck_steps = kAuto;  // auto: max(100, run.max_steps / 4)
  bool skip_data = true;
  // With skip_data: also skip this many steps of data past the pause at an incident's first
  // rollback; a re-alarm within the incident doubles the skip-ahead each time.
  int64_t skip_ahead_steps = 0;
  bool operator==(const RollbackConfig&) const = default;
};

// The per-sample screen: samples above factor x the per-sample median and median + z robust sigma
// are masked and set aside (quarantine.jsonl), after warmup once min_samples are known. `low`: its
// low side (repeated or memorised data, docs/config.md) only warns, or masks too.
struct ScreenConfig {
  bool enabled = true;
  double factor = 2.0;
  double z = 6.0;
  int64_t min_samples = 256;
  LowScreen low = LowScreen::kWarn;
  bool operator==(const ScreenConfig&) const = default;
};

struct RecoveryConfig {
  int64_t steps = kAuto;  // auto: 5 % of run.max_steps, within [10, 200]
  double lr_factor = 0.25;
  // When a resume is a recovery (lr x lr_factor for `steps`): stable = `--resume stable` (and a
  // crash-loop fallback to it), always = every resume, never = no resume.
  ResumeRecovery on_resume = ResumeRecovery::kStable;
  bool operator==(const RecoveryConfig&) const = default;
};

struct StabilityConfig {
  bool enabled = true;
  int64_t median_window = 100;
  double warn_factor = 5.0;
  double pause_factor = 10.0;
  NanPolicy nan_policy = NanPolicy::kSkip;
  int64_t max_consecutive_nan = 3;
  double update_ratio_alarm = 0.1;
  double loss_alarm_factor = 3.0;
  double clip_rate_warn = 0.5;
  RollbackConfig rollback;
  ScreenConfig screen;
  RecoveryConfig recovery;
  int64_t top_k_samples = 8;
  UpdateGate update_gate = UpdateGate::kDevice;
  // Ranks that hold the same weights (replicated, ZeRO-1/2; and the optimizer state, replicated)
  // compare a fingerprint of them every N applied steps and before each checkpoint (0: never).
  int64_t replica_check_every = 100;
  bool operator==(const StabilityConfig&) const = default;
};

// Stable snapshots: the checkpoints a rollback may go back to. A checkpoint at a stable boundary is
// promoted when no alarm came within the `window` steps before it, no incident is open, it is not
// recovering and its loss is within the band of the running median.
struct StableConfig {
  int64_t every_steps = kAuto;  // auto (and 0): every checkpoint
  int64_t keep = 2;
  int64_t window = kAuto;  // auto: one checkpoint interval
  bool require_no_alarms = true;
  // Host memory (MB) for keeping the newest stable snapshot, and the newest checkpoint that may
  // become one, as copies a rollback restores from without reading the disk. auto: a quarter of
  // the host's physical memory shared among its ranks; 0: off (a rollback reads the disk).
  int64_t memory_mb = kAuto;
  bool operator==(const StableConfig&) const = default;
};

struct CheckpointConfig {
  std::string dir;  // empty = RUN_DIR/checkpoints
  // auto: the interval at which a save costs about max_overhead of training time, measured on the
  // run itself (a save's stall and the step time); 0 = only at the end.
  int64_t every_steps = kAuto;
  double max_overhead = 0.01;
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
  bool tensorboard = false;                 // RUN_DIR/tensorboard/ event files
  int64_t tensorboard_every_steps = kAuto;  // auto: every_steps; a multiple of every_steps
  Switch progress = Switch::kAuto;
  bool sample_ids = false;  // RUN_DIR/samples.jsonl: the sample ids of every step
  bool operator==(const LoggingConfig&) const = default;
};

struct DistributedConfig {
  Backend backend = Backend::kAuto;
  double timeout_s = 600.0;
  double bucket_mb = 25.0;
  bool overlap = true;  // buckets all-reduced as the backward pass fills them
  int64_t zero = 0;     // 0|1|2|3
  ReduceDtype reduce_dtype = ReduceDtype::kFp32;
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
                                          "data.grad_accum_steps",
                                          "data.grad_accum"};
  std::vector<ValidatedCombo> validated;
  bool operator==(const ProductionConfig&) const = default;
};

// corrupt_grad's multiplier when the fault names none: far past any alarm level, as the wrong
// result of a failing device usually is.
inline constexpr double kCorruptGradFactor = 1000.0;
struct FaultSpec {
  FaultKind kind = FaultKind::kCorruptBatch;
  int64_t at_step = 0;
  int64_t steps = 1;
  CorruptMode mode = CorruptMode::kRandomTokens;  // corrupt_batch
  // lr_spike multiplier, drop_samples fraction; grad_growth: how much larger the fp16 gradients
  // are at the region's end (a geometric ramp; the update itself is unchanged); corrupt_grad: the
  // multiplier on the rank's gradient (1, the default, means kCorruptGradFactor)
  double factor = 1.0;
  // loader_stall duration; hang: how long (0: until killed); slow_rank: the delay in each step
  double seconds = 0.0;
  std::string path;   // splice_data: a prepared dataset whose windows replace the data
  int64_t rank = -1;  // only this rank is hit (-1: every rank)
  // only the ranks on this host are hit (its name, as hostname prints it; empty: every host): a
  // faulty device stays on its host when a job starts again elsewhere with other ranks there
  std::string host;
  int64_t period = 10;  // repeat_data: the documents come back every `period` steps
  // corrupt_grad: the rank computes wrong every time (a replay of the step too), not once
  bool persistent = false;
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

// Derived quantities that several modules need; defined once here so they agree.
// Whether the model has q/k norms: model.qk_norm on, or auto with arch llama. The same answer
// before resolve_auto as after it, so every reader of the config agrees.
inline bool qk_norm_on(const ModelConfig& m) {
  return m.qk_norm == Switch::kOn || (m.qk_norm == Switch::kAuto && m.arch == Arch::kLlama);
}
int64_t effective_d_ff(const ModelConfig& m);
int64_t effective_kv_heads(const ModelConfig& m);
// Model FLOPs per trained token (forward + backward): 6 x non-embedding parameters, the attention
// term 12 x n_layers x d_model x seq_len, and the output projection 6 x d_model x vocab_size. The
// one formula the trainer's MFU, validate and the benchmarks use.
double flops_per_token(const ModelConfig& m);
// Parameters of the model this config builds (tied embeddings counted once).
int64_t parameter_count(const ModelConfig& m);
// The `auto` keys that depend only on the config itself.
// Warmup: auto is phases.warmup x max_steps (three_phase), else max_steps / 10 up to 2,000.
int64_t warmup_steps(const ScheduleConfig& s, int64_t max_steps);
int64_t recovery_steps(const StabilityConfig& s, int64_t max_steps);
int64_t stuck_steps(const RollbackConfig& r, int64_t max_steps);
int64_t grad_accum_max(const DataConfig& d);
// vocab_size: auto -> the data's vocabulary padded up to a multiple of 64.
int64_t padded_vocab_size(int64_t data_vocab_size);
// The config with every `auto` the config (and the data's vocabulary, when known) decides resolved,
// as config.resolved.yaml records it; the checkpoint cadence stays auto (the trainer measures it).
Config resolve_auto(Config config, std::optional<int64_t> data_vocab_size);

}  // namespace keel::config
